"""Video metrics of a rollout and the pairing of revisited places (paper §5.1 "Metrics", §5.4).

Coherence: :func:`temp_ssim` (TempSSIM, up), :func:`scene_drift` (Local Scene Drift, down) and
:func:`latent_diff` (LatentDiff, down; the paper uses it in §5.4 without defining it, so the
definition here is ours, see ``docs/metrics.md``). Recall: :func:`pac` (Position-Aligned CLIP, up)
over the frame pairs that :func:`revisit_pairs` finds from a trajectory's waypoint labels or from
poses dead-reckoned out of its actions (:func:`dead_reckon`).

Layout (``trajectory.py``): chunk 0 owns pixel frames [0, 9), chunk c >= 1 owns [12c - 3, 12c + 9);
chunk c owns latent frames [3c, 3c + 3). Every per-chunk list is indexed by chunk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .trajectory import chunk_of_row, chunk_rows, chunks_for_frames
from .world.motion import dead_reckon  # the one motion model (re-exported for callers)

if TYPE_CHECKING:
    from .trajectory import ActionPlan

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


def temp_ssim(frames, batch_size: int | None = None) -> dict:
    """TempSSIM (paper §5.1, up): SSIM between consecutive decoded pixel frames.

    Each pair (t-1, t) is scored with ``pytorch_msssim.ssim(x, y, data_range=1.0,
    size_average=False)`` on float32 frames in [0, 1] (11x11 Gaussian window, sigma 1.5, valid
    region, mean over the 3 channels). Pairs are computed in batches whose float32 working memory
    stays near ``SSIM_BATCH_BYTES`` (``batch_size`` overrides the pair count per batch).

    Args:
        frames: uint8 RGB ``[T, H, W, 3]`` (numpy or torch), H and W >= 11.

    Returns:
        ``{"pairs": [T-1 floats], "per_chunk": [...], "mean": float}``; pair t-1 belongs to the
        chunk owning its later frame t (chunk 0: t in 1..8, chunk c: t in 12c-3..12c+8), and
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
    chunk_of = [chunk_of_row(t) for t in range(1, t_frames)]
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
    """GT-PSNR and GT-SSIM of generated pixel frames against the true frames at the same poses
    (procedural-world presets; :class:`~worldtrace_cli.world.truth.GroundTruth`). Up is better.

    PSNR per frame: ``10 log10(255^2 / MSE)`` over all pixels and channels of uint8 frames (capped at
    :data:`PSNR_CAP_DB`); SSIM per frame: ``pytorch_msssim.ssim`` on [0, 1] frames with
    ``data_range=1`` (as TempSSIM).

    Args:
        frames, truth: uint8 RGB ``[T, H, W, 3]`` (numpy or torch) of the same shape.
    Returns:
        ``{"psnr": [T floats], "ssim": [T floats]}``.
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
    return {"psnr": psnr.tolist(), "ssim": s.double().tolist()}


def gt_summary(per_chunk_psnr: list, per_chunk_ssim: list, plan=None) -> dict:
    """Run-level GT means: over all chunks, and over the return chunks of the plan's revisit pairs
    (:func:`revisit_pairs`; ``return`` None without revisits). Inputs are per-chunk means (None allowed)."""
    out = {"psnr": _mean(per_chunk_psnr), "ssim": _mean(per_chunk_ssim), "return": None}
    if plan is not None:
        returns = sorted({b for _, b in revisit_pairs(plan)["chunk_pairs"] if b < len(per_chunk_psnr)})
        if returns:
            out["return"] = {"chunks": returns, "psnr": _mean([per_chunk_psnr[c] for c in returns]),
                             "ssim": _mean([per_chunk_ssim[c] for c in returns])}
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


# --------------------------------------------------------------------------- dead reckoning


def _wrap_deg(d):
    """Angle difference(s) wrapped to [-180, 180)."""
    return (d + 180.0) % 360.0 - 180.0


def pairs_from_poses(poses: torch.Tensor, num_chunks: int, pos_tol: float = 0.5,
                     angle_tol: float = 15.0, frames_per_chunk: int = 3) -> list[tuple[int, int]]:
    """Revisits found from dead-reckoned poses: ``[(forward_chunk, return_chunk), ...]``.

    A chunk's pose is the mean of its rows' poses. Later chunk j is paired with the EARLIEST
    earlier chunk i such that

    - the poses match: ``|xy_j - xy_i| <= pos_tol`` units, and the yaw (wrapped) and pitch
      differences are each <= ``angle_tol`` degrees; and
    - the path left in between (departure rule): along the per-row path from the centre row of
      chunk i to the centre row of chunk j, the detour ``path length - |displacement|`` is
      >= ``pos_tol`` units, or the angular detour ``sum |d yaw| + |d pitch| - (|wrapped d yaw| +
      |d pitch|)`` is >= ``angle_tol`` degrees. A standing camera, or one that walks on (however
      slowly) or stops, has no detour and makes no pairs; a path that turns back (ABA's turning
      chunks L-1 and L: detour 1 unit) or pans back (pan_90's chunks 1 and 2: 37.5 deg) does.

    Args:
        poses: float64 ``[R, 4]`` from :func:`dead_reckon`, R >= rows of ``num_chunks`` chunks.
        frames_per_chunk: latent frames per chunk of the layout (3 MG2, 4 LingBot).

    Returns:
        ``[(i, j), ...]`` sorted, i < j.
    """
    poses = poses.to(torch.float64)
    spans = [chunk_rows(c, frames_per_chunk) for c in range(num_chunks)]
    means = torch.stack([poses[s:e].mean(0) for s, e in spans])
    centre = [(s + e - 1) // 2 for s, e in spans]
    step = poses[1:] - poses[:-1]
    # Cumulative path lengths so that any detour is two lookups.
    trans = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(step[:, :2].norm(dim=1), 0)])
    turn = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(step[:, 2:].abs().sum(1), 0)])
    pairs = []
    for j in range(1, num_chunks):
        d = means[:j] - means[j]
        close = ((d[:, :2].norm(dim=1) <= pos_tol) & (_wrap_deg(d[:, 2]).abs() <= angle_tol)
                 & (d[:, 3].abs() <= angle_tol))
        for i in torch.nonzero(close).flatten().tolist():
            a, b = centre[i], centre[j]
            move = poses[b] - poses[a]
            t_detour = trans[b] - trans[a] - move[:2].norm()
            a_detour = turn[b] - turn[a] - (_wrap_deg(move[2]).abs() + move[3].abs())
            if t_detour >= pos_tol or a_detour >= angle_tol:
                pairs.append((i, j))
                break
    return sorted(pairs)


# --------------------------------------------------------------------------- waypoint pairing


def pairs_from_waypoints(plan: ActionPlan) -> list[tuple[int, int]]:
    """Revisits found from waypoint labels: ``[(forward_chunk, return_chunk), ...]``, sorted.

    Legs: consecutive waypoints ``(c1, X)``, ``(c2, Y)`` with c2 > c1 make a leg X->Y over chunks
    [c1, c2). A later leg over the same two labels is paired with the EARLIEST such leg, chunk by
    chunk, stretched to the earlier leg's length:

    - traversed back (Y->X over [s2, e2) after X->Y over [s1, e1)): chunk s1+i with
      ``e2 - 1 - round(i * (len2 - 1) / (len1 - 1))`` (reversed: ABA with L chunks each way gives
      exactly (i, 2L-1-i));
    - traversed again in the same direction (ABABA's second A->B): s1+i with
      ``s2 + round(i * (len2 - 1) / (len1 - 1))``.

    Also, for every label reached again, the first chunk at the label is paired with the last
    chunk of the leg that arrives there again (ABCA: (0, 16); pan_360: (0, 7)). A label reached at
    the end (chunk == num_chunks) thus counts. Duplicates are removed; pairs are (earlier, later).
    """
    points = [(c, label) for c, label in plan.waypoints]
    legs = [(c1, c2, x, y) for (c1, x), (c2, y) in zip(points, points[1:]) if c2 > c1]
    pairs: set[tuple[int, int]] = set()
    for k, (s2, e2, x2, y2) in enumerate(legs):
        for s1, e1, x1, y1 in legs[:k]:
            if {x1, y1} != {x2, y2}:
                continue
            reverse = (x1, y1) == (y2, x2) and x1 != y1
            len1, len2 = e1 - s1, e2 - s2
            for i in range(len1):
                offset = 0 if len1 == 1 else round(i * (len2 - 1) / (len1 - 1))
                pairs.add((s1 + i, e2 - 1 - offset if reverse else s2 + offset))
            break
    first: dict[str, int] = {}
    for k, (c, label) in enumerate(points):
        if label not in first:
            first[label] = c
        elif k > 0 and c > points[k - 1][0] and c - 1 > first[label]:
            pairs.add((first[label], c - 1))
    return sorted(p for p in pairs if p[0] < p[1] < plan.num_chunks)


def _frame_pairs(chunk_pairs, frames_per_chunk: int = 3) -> list[tuple[int, int]]:
    """Pixel-frame pairs of chunk pairs: frame k of one with frame k of the other, aligned at the
    chunks' ends (chunk 0 has 9 frames, later chunks 12; LingBot 13 and 16)."""
    out = []
    for a, b in chunk_pairs:
        (sa, ea), (sb, eb) = chunk_rows(a, frames_per_chunk), chunk_rows(b, frames_per_chunk)
        n = min(ea - sa, eb - sb)
        out += [(ea - n + k, eb - n + k) for k in range(n)]
    return out


def revisit_pairs(plan: ActionPlan) -> dict:
    """Revisited chunks and pixel frames of a plan, for :func:`pac`.

    Returns ``{"source": "waypoints"|"poses"|"none", "chunk_pairs": [(fwd, ret), ...],
    "frame_pairs": [(fwd_frame, ret_frame), ...]}``: :func:`pairs_from_waypoints` when some label
    occurs twice, else :func:`pairs_from_poses` on :func:`dead_reckon`; "none" when neither finds
    a pair. Frame pairs: each chunk pair's frames matched index by index, aligned at the ends.
    """
    labels = [label for _, label in plan.waypoints]
    if len(set(labels)) < len(labels):
        chunk_pairs, source = pairs_from_waypoints(plan), "waypoints"
    else:
        chunk_pairs, source = pairs_from_poses(dead_reckon(plan), plan.num_chunks,
                                               frames_per_chunk=plan.frames_per_chunk), "poses"
    if not chunk_pairs:
        source = "none"
    return {"source": source, "chunk_pairs": chunk_pairs,
            "frame_pairs": _frame_pairs(chunk_pairs, plan.frames_per_chunk)}


# --------------------------------------------------------------------------- run folders


def summarise_run(run_dir: str | Path, tower=None, level: str = "fast",
                  trajectory: str | Path | None = None) -> dict:
    """Metrics of a finished or partial run folder (``video.mp4``, ``chunks.jsonl``, and
    ``summary.json`` when the run finished).

    ``level="fast"``: TempSSIM (and LatentDiff when latents are stored; run folders hold none
    today, so it is skipped with a note). ``level="all"`` adds Local Scene Drift and, when the
    trajectory revisits, PAC; it needs ``tower`` (see :func:`clip_embeddings`). The trajectory
    (for revisit pairing) is ``trajectory`` if given, else ``summary.json``'s ``config.trajectory``
    laid out over ``resolved.chunks``; without either, PAC is skipped with a note. Metrics cover
    the frames the video holds (a killed run's last chunk may be partial).

    A run of a procedural-world preset (``summary.json`` names its world seed) also gets ``gt``:
    GT-PSNR / GT-SSIM of the video's frames against the world rendered at the same poses, per chunk,
    overall and on the return chunks (:func:`gt_summary`); from the lossy MP4, so a little below the
    values ``generate`` records on the decoded frames.

    Returns a JSON-able dict: run_dir, level, status ("complete" | "partial"), chunks (records in
    chunks.jsonl), pixel_frames, temp_ssim, latent_diff, scene_drift, pac, revisit, gt, notes.
    """
    from .outputs import read_jsonl, read_video_frames
    from .trajectory import load_trajectory, plan_actions

    if level not in ("fast", "all"):
        raise ValueError(f"level must be 'fast' or 'all', got {level!r}")
    if level == "all" and tower is None:
        raise ValueError("level 'all' needs a CLIP tower for Scene Drift and PAC")
    run_dir = Path(run_dir)
    records = read_jsonl(run_dir / "chunks.jsonl") if (run_dir / "chunks.jsonl").exists() else []
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    frames = read_video_frames(run_dir / "video.mp4")
    t_frames = int(frames.shape[0])
    fpc = ((summary or {}).get("config") or {}).get("preset", {}).get("frames_per_chunk", 3)  # LingBot: 4
    num_chunks = chunks_for_frames(t_frames, fpc) if t_frames else 0
    notes = []
    ldiff = [r.get("metrics", {}).get("latent_diff") for r in records]
    if any(v is not None for v in ldiff):  # LatentDiff needs latents: generate records it per chunk
        latent = {"per_chunk": ldiff, "mean": _mean([v for v in ldiff if v is not None]),
                  "source": "chunks.jsonl (per-chunk means)"}
    else:
        latent = None
        notes.append("LatentDiff skipped: the run folder stores no latents (generate with --metrics fast)")
    out = {"run_dir": str(run_dir), "level": level,
           "status": "complete" if summary and summary.get("status") == "complete" else "partial",
           "chunks": len(records), "pixel_frames": t_frames,
           "temp_ssim": temp_ssim(frames), "latent_diff": latent,
           "scene_drift": None, "pac": None, "revisit": None, "gt": None, "notes": notes}
    world_seed = (summary or {}).get("resolved", {}).get("world_seed")
    if world_seed is not None and t_frames:  # a procedural-world run: score the video against the truth
        from .world.truth import GroundTruth

        cfg = summary["config"]
        plan = plan_actions(load_trajectory(trajectory or cfg["trajectory"]), summary["resolved"]["chunks"], fpc)
        truth = GroundTruth(world_seed, plan, frames.shape[1], frames.shape[2])
        psnr, ssim_ = [], []
        for c in range(num_chunks):
            start, end = chunk_rows(c, fpc)
            end = min(end, t_frames)
            scores = gt_scores(frames[start:end], truth.frames(start, end))
            psnr.append(_mean(scores["psnr"]))
            ssim_.append(_mean(scores["ssim"]))
        out["gt"] = {"world_seed": world_seed, "source": "video.mp4 (lossy H.264)", **gt_summary(psnr, ssim_, plan),
                     "per_chunk": {"psnr": psnr, "ssim": ssim_}}
    if level == "fast" or not t_frames:
        return out

    embeds = clip_embeddings(tower, frames)
    out["scene_drift"] = scene_drift(embeds, num_chunks, fpc)
    if trajectory is None and summary is not None:
        trajectory = summary.get("config", {}).get("trajectory")
    if trajectory is None:
        notes.append("PAC skipped: no trajectory (partial run without summary.json; pass one)")
        return out
    planned = summary.get("resolved", {}).get("chunks") if summary else None
    plan = plan_actions(load_trajectory(trajectory), planned or max(num_chunks, len(records)), fpc)
    revisit = revisit_pairs(plan)
    frame_pairs = [(a, b) for a, b in revisit["frame_pairs"] if b < t_frames]
    out["revisit"] = {"source": revisit["source"], "trajectory": str(trajectory),
                      "chunk_pairs": [p for p in revisit["chunk_pairs"] if chunk_rows(p[1], fpc)[0] < t_frames]}
    if frame_pairs:
        out["pac"] = pac(embeds, frame_pairs)
    else:
        notes.append("PAC skipped: the trajectory revisits no place within the generated frames")
    return out


class OnlineMetrics:
    """Per-chunk metrics computed while a run generates (``worldtrace generate --metrics``).

    ``level``: ``none`` (nothing), ``fast`` (TempSSIM and LatentDiff, including the pair across
    each chunk boundary, and GT-PSNR/GT-SSIM per chunk when ``truth``, a
    :class:`~worldtrace_cli.world.truth.GroundTruth`, is given) or ``all`` (also Local Scene Drift, and PAC over the trajectory's revisit
    pairs at the end; needs the CLIP ``tower``, one forward per pixel frame). State is the previous
    chunk's last pixel frame, last latent frame and mean CLIP embedding, plus the per-frame CLIP
    embeddings for PAC ([T, P] float32: 12 MB at 256 chunks).
    """

    def __init__(self, level: str = "fast", tower=None, truth=None):
        if level not in ("none", "fast", "all"):
            raise ValueError(f"metrics level must be none, fast or all, got {level!r}")
        if level == "all" and tower is None:
            raise ValueError("metrics level 'all' needs a CLIP tower")
        self.level, self.tower, self.truth = level, tower, truth
        self._gt_psnr: list[float] = []
        self._gt_ssim: list[float] = []
        self._last_frame = self._last_latent = self._last_embed = None
        self._embeds: list[torch.Tensor] = []
        self._ssim: list[float] = []
        self._ldiff: list[float] = []
        self._drift: list[float] = []

    def add_chunk(self, latents: torch.Tensor, frames) -> dict:
        """Score one chunk: latents [1, 16, F, h, w], frames uint8 [T, H, W, 3]. Returns the
        chunk's record entries (``temp_ssim``, ``latent_diff``, ``scene_drift``; with ground truth
        ``gt_psnr`` in dB and ``gt_ssim``; None where undefined)."""
        if self.level == "none":
            return {}
        frames = _frames_tensor(frames)
        rec: dict = {}
        if self.truth is not None:
            start, end = chunk_rows(len(self._gt_psnr))
            scores = gt_scores(frames, self.truth.frames(start, end))
            self._gt_psnr.append(_mean(scores["psnr"]))
            self._gt_ssim.append(_mean(scores["ssim"]))
            rec["gt_psnr"], rec["gt_ssim"] = self._gt_psnr[-1], self._gt_ssim[-1]
        seq = frames if self._last_frame is None else torch.cat([self._last_frame[None], frames])
        pairs = temp_ssim(seq)["pairs"]
        self._ssim += pairs
        rec["temp_ssim"] = _mean(pairs)
        z = latents.detach().float().cpu()
        zseq = z if self._last_latent is None else torch.cat([self._last_latent, z], dim=2)
        diffs = latent_diff(zseq)["pairs"]
        self._ldiff += diffs
        rec["latent_diff"] = _mean(diffs)
        self._last_frame, self._last_latent = frames[-1].clone(), z[:, :, -1:].clone()
        if self.level == "all":
            emb = clip_embeddings(self.tower, frames)
            self._embeds.append(emb)
            mean = torch.nn.functional.normalize(emb.mean(0), dim=0)
            drift = None if self._last_embed is None else float(1 - mean @ self._last_embed)
            if drift is not None:
                self._drift.append(drift)
            rec["scene_drift"] = drift
            self._last_embed = mean
        return rec

    _STATE = ("gt_psnr", "gt_ssim", "last_frame", "last_latent", "last_embed", "embeds", "ssim", "ldiff", "drift")

    def state_dict(self) -> dict:
        """The accumulators (lists of floats, tensors or None; CPU tensors) for a resume state."""
        return {"level": self.level, **{k: getattr(self, "_" + k) for k in self._STATE}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` into an accumulator of the same level.

        Raises:
            ValueError: a state of another level, or missing entries.
        """
        if state.get("level") != self.level or any(k not in state for k in self._STATE):
            raise ValueError(f"metrics state of level {state.get('level')!r} cannot restore level {self.level!r}")
        for k in self._STATE:
            setattr(self, "_" + k, state[k])

    def summary(self, plan=None) -> dict:
        """Run-level means (and PAC over ``plan``'s revisit pairs with level ``all``)."""
        if self.level == "none":
            return {"level": "none"}
        out = {"level": self.level, "temp_ssim": _mean(self._ssim), "latent_diff": _mean(self._ldiff)}
        if self.truth is not None:
            out["gt"] = {"world_seed": self.truth.world_seed, **gt_summary(self._gt_psnr, self._gt_ssim, plan)}
        if self.level == "all":
            out["scene_drift"] = _mean(self._drift)
            out["pac"] = None
            if plan is not None and self._embeds:
                embeds = torch.cat(self._embeds)
                revisit = revisit_pairs(plan)
                pairs = [(a, b) for a, b in revisit["frame_pairs"] if b < embeds.shape[0]]
                out["revisit"] = {"source": revisit["source"], "chunk_pairs": revisit["chunk_pairs"]}
                if pairs:
                    out["pac"] = pac(embeds, pairs)
        return out


__all__ = ["OnlineMetrics", "clip_embeddings", "dead_reckon", "gt_scores", "gt_summary", "latent_diff", "pac", "pairs_from_poses",
           "pairs_from_waypoints", "revisit_pairs", "scene_drift", "summarise_run", "temp_ssim"]
