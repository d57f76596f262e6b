"""Per-frame video metrics of a rollout (paper §5.1 "Metrics", §5.4): coherence (:func:`temp_ssim`,
TempSSIM, up; :func:`scene_drift`, Local Scene Drift, down; :func:`latent_diff`, LatentDiff, down --
the paper uses it in §5.4 without defining it, so the definition here is ours, see
``docs/metrics.md``), recall (:func:`pac`, Position-Aligned CLIP, up) and ground truth
(:func:`gt_scores`: PSNR / SSIM against the procedural world's render). Re-exported by
:mod:`worldtrace_cli.metrics`, which scores whole runs.

Layout (``trajectory/actions.py``): chunk 0 owns pixel frames [0, 9), chunk c >= 1 owns [12c - 3, 12c + 9);
chunk c owns latent frames [3c, 3c + 3). Every per-chunk list is indexed by chunk.
"""

from __future__ import annotations

import numpy as np
import torch

from ..trajectory.actions import chunk_of_row, chunk_rows
from .revisit import revisit_pairs

SSIM_WINDOW = 11  # pytorch_msssim's default Gaussian window (sigma 1.5), Wang et al. 2004
SSIM_BATCH_BYTES = 256 * 2**20  # float32 working memory of one TempSSIM batch (about 16 maps/pair)



# --------------------------------------------------------------------------- helpers


def _frames_tensor(frames) -> torch.Tensor:
    """uint8 [T, H, W, 3] (numpy or torch) -> uint8 CPU tensor; ValueError otherwise."""
    x = torch.from_numpy(np.ascontiguousarray(frames)) if isinstance(frames, np.ndarray) else frames
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        what = f"{x.dtype} {list(x.shape)}" if hasattr(x, "shape") else type(frames).__name__
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got {what}")
    return x.cpu()


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(sum(values) / len(values)) if values else None


def _group_by_chunk(values: list[float], chunk_of: list[int]) -> list[float | None]:
    """Mean of ``values[i]`` per chunk ``chunk_of[i]``; chunks without values are None."""
    if not values:
        return []
    groups: list[list[float]] = [[] for _ in range(max(chunk_of) + 1)]
    for v, c in zip(values, chunk_of):
        groups[c].append(v)
    return [_mean(g) for g in groups]


# --------------------------------------------------------------------------- coherence


def temp_ssim(frames, batch_size: int | None = None, frames_per_chunk: int = 3) -> dict:
    """TempSSIM (paper §5.1, up): SSIM between consecutive decoded pixel frames.

    Each pair (t-1, t) is scored with ``pytorch_msssim.ssim(x, y, data_range=1.0,
    size_average=False)`` on float32 frames in [0, 1] (11x11 Gaussian window, sigma 1.5, valid
    region, mean over the 3 channels). Pairs are computed in batches whose float32 working memory
    stays near ``SSIM_BATCH_BYTES`` (``batch_size`` overrides the pair count per batch).

    Args:
        frames: uint8 RGB ``[T, H, W, 3]`` (numpy or torch), H and W >= 11.
        frames_per_chunk: latent frames per chunk F (MG2 3, LingBot-World 4): chunk 0 owns
            4F - 3 pixel frames, every later chunk 4F (:func:`~worldtrace_cli.trajectory.actions.chunk_of_row`).

    Returns:
        ``{"pairs": [T-1 floats], "per_chunk": [...], "mean": float}``; pair t-1 belongs to the
        chunk owning its later frame t (F = 3: chunk 0: t in 1..8, chunk c: t in 12c-3..12c+8), and
        ``per_chunk[c]`` is the mean of chunk c's pairs (None without any). With T < 2 there are no
        pairs and ``mean`` is None.

    Raises:
        ValueError: not uint8 [T, H, W, 3], or a side shorter than the 11-px SSIM window (where
            pytorch_msssim would silently skip the smoothing along that side).
    """
    from pytorch_msssim import ssim

    x = _frames_tensor(frames)
    t_frames, height, width = x.shape[:3]
    if min(height, width) < SSIM_WINDOW:
        raise ValueError(f"TempSSIM needs frames of at least {SSIM_WINDOW}x{SSIM_WINDOW} px "
                         f"(the SSIM window), got {height}x{width}")
    if batch_size is None:
        batch_size = max(1, SSIM_BATCH_BYTES // (16 * 3 * height * width * 4))
    pairs: list[float] = []
    for start in range(1, t_frames, batch_size):
        stop = min(start + batch_size, t_frames)
        chunk = x[start - 1:stop].permute(0, 3, 1, 2).float().div_(255.0)  # [b+1, 3, H, W]
        with torch.no_grad():
            scores = ssim(chunk[:-1], chunk[1:], data_range=1.0, size_average=False)
        pairs += scores.double().tolist()
    chunk_of = [chunk_of_row(t, frames_per_chunk) for t in range(1, t_frames)]
    return {"pairs": pairs, "per_chunk": _group_by_chunk(pairs, chunk_of), "mean": _mean(pairs)}


def latent_diff(latents, frames_per_chunk: int = 3) -> dict:
    """LatentDiff (paper §5.4, down; undefined there, this definition is ours): relative change
    between consecutive latent frames, a latent-space analogue of frame-to-frame change.

    ``d_t = ||z_t - z_{t-1}||_2 / ||z_{t-1}||_2`` for t = 1..N-1, with each z_t the whole latent
    frame [16, h, w] flattened (Frobenius norm, float64). Lower = more coherent; 0 = a frozen video.

    Args:
        latents: normalised (denoised x0) latents ``[1, 16, N, h, w]`` or ``[16, N, h, w]``, or a list
            of per-chunk tensors of that shape (concatenated along N).
        frames_per_chunk: latent frames per chunk (3 for MG2).

    Returns:
        ``{"pairs": [N-1 floats], "per_chunk": [...], "mean": float}``; d_t belongs to the chunk of
        z_t (chunk 0 holds d_1, d_2; chunk c holds d_{3c}..d_{3c+2}). N < 2 gives mean None.
    """
    if isinstance(latents, (list, tuple)):
        latents = torch.cat([torch.as_tensor(z) for z in latents], dim=-3)
    z = torch.as_tensor(latents)
    if z.ndim == 5:
        if z.shape[0] != 1:
            raise ValueError(f"latents must have batch 1, got {list(z.shape)}")
        z = z[0]
    if z.ndim != 4:
        raise ValueError(f"latents must be [1, C, N, h, w] or [C, N, h, w], got {list(z.shape)}")
    z = z.detach().to("cpu", torch.float64).transpose(0, 1).flatten(1)  # [N, C*h*w]
    diffs = ((z[1:] - z[:-1]).norm(dim=1) / z[:-1].norm(dim=1)).tolist()
    chunk_of = [t // frames_per_chunk for t in range(1, z.shape[0])]
    return {"pairs": diffs, "per_chunk": _group_by_chunk(diffs, chunk_of), "mean": _mean(diffs)}


# --------------------------------------------------------------------------- ground truth


PSNR_CAP_DB = 100.0  # PSNR of identical frames (MSE 0) is reported as this


def gt_scores(frames, truth) -> dict:
    """GT-PSNR, GT-SSIM and GT detail of generated pixel frames against the true frames at the same
    poses (procedural-world presets; :class:`~worldtrace_cli.world.truth.GroundTruth`).

    PSNR per frame: ``10 log10(255^2 / MSE)`` over all pixels and channels of uint8 frames (capped at
    :data:`PSNR_CAP_DB`); SSIM per frame: ``pytorch_msssim.ssim`` on [0, 1] frames with
    ``data_range=1`` (as TempSSIM); up is better for both. Detail: each frame's :func:`detail`
    and the true frame's; :func:`detail_ratio` of sums of them is GT detail (1 = as much fine
    structure as the truth, below 1 blurred, above 1 noisier). PSNR rewards a blurred average of
    what may be there, so detail says what PSNR hides: how much of the picture is left.

    Args:
        frames, truth: uint8 RGB ``[T, H, W, 3]`` (numpy or torch) of the same shape.
    Returns:
        ``{"psnr": [T floats], "ssim": [T floats], "detail": [T floats], "detail_true": [T floats]}``.
    Raises:
        ValueError: shapes differ or are not uint8 [T, H, W, 3].
    """
    from pytorch_msssim import ssim

    a, b = _frames_tensor(frames), _frames_tensor(truth)
    if a.shape != b.shape:
        raise ValueError(f"frames {list(a.shape)} and truth {list(b.shape)} differ in shape")
    af, bf = a.permute(0, 3, 1, 2).float(), b.permute(0, 3, 1, 2).float()
    mse = (af - bf).pow(2).flatten(1).mean(1).double()
    psnr = torch.where(mse > 0, 10 * torch.log10(255.0**2 / mse.clamp_min(1e-12)), torch.tensor(PSNR_CAP_DB,
                       dtype=torch.float64)).clamp(max=PSNR_CAP_DB)
    with torch.no_grad():
        s = ssim(af / 255.0, bf / 255.0, data_range=1.0, size_average=False)
    return {"psnr": psnr.tolist(), "ssim": s.double().tolist(), "detail": detail(a).tolist(),
            "detail_true": detail(b).tolist()}


def detail(frames) -> torch.Tensor:
    """Fine structure of pixel frames: per frame the mean absolute difference between neighbouring
    pixels, horizontally and vertically (summed), over all channels, in uint8 grey levels: float64 [T].

    Args:
        frames: uint8 RGB ``[T, H, W, 3]`` (numpy or torch), H and W >= 2.
    Raises:
        ValueError: not uint8 [T, H, W, 3].
    """
    x = _frames_tensor(frames).double()
    return ((x[:, :, 1:] - x[:, :, :-1]).abs().flatten(1).mean(1)
            + (x[:, 1:] - x[:, :-1]).abs().flatten(1).mean(1))


def detail_ratio(sums) -> float | None:
    """GT detail of frames taken together: the sum of the generated frames' :func:`detail` over the
    sum of the true frames' (``sums``: ``(generated, true)`` pairs, e.g. per chunk; None entries are
    skipped). A ratio of sums, not a mean of ratios: a view of a plain wall (little true detail)
    weighs little instead of blowing the mean up. None when nothing is left or the truth is flat."""
    pairs = [p for p in sums if p is not None]
    true = sum(t for _, t in pairs)
    return float(sum(g for g, _ in pairs) / true) if pairs and true > 0 else None


def gt_summary(per_chunk_psnr: list, per_chunk_ssim: list, plan=None, per_chunk_detail: list | None = None) -> dict:
    """Run-level GT means: over all chunks, and over the return chunks of the plan's revisit pairs
    (:func:`revisit_pairs`; ``return`` None without revisits). Inputs are per-chunk means (None allowed);
    ``per_chunk_detail`` (per chunk the ``(generated, true)`` sums of :func:`detail` over its frames,
    or None) adds GT ``detail`` (:func:`detail_ratio`) to both when given."""
    out = {"psnr": _mean(per_chunk_psnr), "ssim": _mean(per_chunk_ssim), "return": None}
    if per_chunk_detail is not None:
        out["detail"] = detail_ratio(per_chunk_detail)
    if plan is not None:
        returns = sorted({b for _, b in revisit_pairs(plan)["chunk_pairs"] if b < len(per_chunk_psnr)})
        if returns:
            out["return"] = {"chunks": returns, "psnr": _mean([per_chunk_psnr[c] for c in returns]),
                             "ssim": _mean([per_chunk_ssim[c] for c in returns])}
            if per_chunk_detail is not None:
                out["return"]["detail"] = detail_ratio([per_chunk_detail[c] for c in returns
                                                        if c < len(per_chunk_detail)])
    return out


# --------------------------------------------------------------------------- CLIP metrics


def clip_embeddings(tower, frames, batch_size: int = 16) -> torch.Tensor:
    """CLIP image embeddings of pixel frames, L2-normalised: float32 ``[T, P]`` on the CPU.

    ``tower`` is anything with ``image_embeds(images [B, 3, H, W] in [-1, 1]) -> [B, P]``, e.g.
    :class:`~worldtrace_cli.model.image_encoder.CLIPImageTower` (the pooled, projected CLIP
    embedding: P = 1024 for ViT-H/14; the tower resizes to 224 px itself).

    Args:
        frames: uint8 RGB ``[T, H, W, 3]`` (numpy or torch); mapped to ``x / 127.5 - 1``.
        batch_size: frames per tower call.
    """
    x = _frames_tensor(frames)
    out = []
    with torch.no_grad():
        for start in range(0, x.shape[0], batch_size):
            images = x[start:start + batch_size].permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)
            out.append(tower.image_embeds(images).float().cpu())
    if not out:
        return torch.zeros(0, 0)
    return torch.nn.functional.normalize(torch.cat(out), dim=-1)


def scene_drift(frame_embeds: torch.Tensor, num_chunks: int, frames_per_chunk: int = 3) -> dict:
    """Local Scene Drift (paper §5.1, down): per chunk, the cosine distance of its mean CLIP
    embedding to the preceding chunk's.

    ``m_c`` = mean of chunk c's L2-normalised frame embeddings (frames per :func:`chunk_rows`);
    ``d_c = 1 - cos(m_c, m_{c-1})`` for c >= 1 (0 = same content, up to 2).

    Args:
        frame_embeds: ``[T, P]`` per pixel frame (normalised here again), T <= 12 C - 3.
        num_chunks: C; chunks with no frame in ``frame_embeds`` (a partial run) are left out.
        frames_per_chunk: latent frames per chunk of the layout (3 MG2, 4 LingBot).

    Returns:
        ``{"per_chunk": [None, d_1, ...], "mean": float}`` (mean None with fewer than 2 chunks).
    """
    e = torch.nn.functional.normalize(frame_embeds.double(), dim=-1)
    means = []
    for c in range(num_chunks):
        start, end = chunk_rows(c, frames_per_chunk)
        if start >= e.shape[0]:
            break
        means.append(e[start:end].mean(0))
    per_chunk: list[float | None] = [None] * len(means)
    for c in range(1, len(means)):
        cos = torch.nn.functional.cosine_similarity(means[c], means[c - 1], dim=0)
        per_chunk[c] = float(1.0 - cos)
    return {"per_chunk": per_chunk, "mean": _mean(per_chunk[1:])}


def pac(frame_embeds: torch.Tensor, frame_pairs) -> dict:
    """Position-Aligned CLIP (paper §5.1, up): mean cosine similarity of CLIP embeddings over
    (forward-leg pixel frame, return-leg pixel frame) pairs, e.g. ``revisit_pairs(plan)["frame_pairs"]``.

    Args:
        frame_embeds: ``[T, P]`` per pixel frame (normalised here again).
        frame_pairs: iterable of ``(forward_frame, return_frame)`` indices into ``frame_embeds``.

    Returns:
        ``{"pairs": n, "mean": float, "per_pair": [n floats]}``; ``{"pairs": 0, "mean": None,
        "per_pair": []}`` without pairs.
    """
    frame_pairs = [(int(a), int(b)) for a, b in frame_pairs]
    if not frame_pairs:
        return {"pairs": 0, "mean": None, "per_pair": []}
    e = torch.nn.functional.normalize(frame_embeds.double(), dim=-1)
    a, b = torch.tensor(frame_pairs).T
    sims = (e[a] * e[b]).sum(-1).tolist()
    return {"pairs": len(sims), "mean": _mean(sims), "per_pair": sims}


__all__ = ["PSNR_CAP_DB", "SSIM_BATCH_BYTES", "SSIM_WINDOW", "clip_embeddings", "gt_scores", "gt_summary", "latent_diff", "pac", "scene_drift", "temp_ssim"]
