"""A continued clip's scores (``--prefix``): each generated chunk against the real frames at its pixel rows
(:mod:`worldtrace_cli.continuation` reads the clip; docs/continue.md)."""

from __future__ import annotations

import numpy as np

from ..trajectory.actions import chunk_rows


def reference_scores(frames, reference) -> dict | None:
    """MIND's "lcm" scores of generated pixel frames against the real ones at the same indices, per frame:
    ``{"psnr": [dB], "ssim": [...], "mse": [...]}``; MSE on [0, 1] pixel values (mean over pixels and
    channels), PSNR ``10 log10(1 / MSE)`` (capped as GT-PSNR), SSIM Gaussian 11 / 1.5 on [0, 1]
    (``pytorch_msssim``, as TempSSIM and GT-SSIM; MIND uses torchmetrics' equal definition). LPIPS is
    not computed (it needs AlexNet weights this tool does not ship). None when ``reference`` holds
    none of the frames.

    Args:
        frames: uint8 [T, H, W, 3]; reference: uint8 [n <= T, H, W, 3], the first n of the same frames' truth.
    """
    from .scores import gt_scores

    n = 0 if reference is None else int(reference.shape[0])
    if n == 0:
        return None
    a = np.asarray(frames)[:n]
    s = gt_scores(a, reference)
    diff = (a.astype(np.float64) - np.asarray(reference, dtype=np.float64)) / 255.0
    mse = (diff ** 2).reshape(n, -1).mean(1)
    return {"psnr": s["psnr"], "ssim": s["ssim"], "mse": mse.tolist()}


def chunk_reference(reference, chunk: int, frames_per_chunk: int):
    """The reference frames of a chunk's pixel rows (fewer at the clip's end, None past it)."""
    if reference is None:
        return None
    start, end = chunk_rows(chunk, frames_per_chunk)
    if reference.num_frames is not None and start >= reference.num_frames:
        return None
    return reference.frames(start, end)


