"""Position schemes: the virtual temporal position at which each cache slot is read.

A scheme maps the writer's slots (oldest first; summary slots before recent slots) to float64
offsets in latent frames from the first frame ``a`` of the current chunk. Past slots get negative
offsets. With F frames per chunk and trained offset Delta (= local_attn_size - 1; 5 for MG2), the
oldest position a training-time query chunk ever saw is ``a + F - 1 - Delta`` (offset -3 for MG2
universal, -1 for gta_drive). Paper references: paper §2.1, §3.1 (Def. 1, Eq. 2), §5.4, Remark 1.

* ``actual``: a slot sits at its timestamp (mean source frame), ``centroid - a``. MG2's own cache.
* ``block_relative`` (Infinity-RoPE): ``actual`` with offsets capped at the trained maximum,
  ``max(centroid - a, F - 1 - Delta)``: distinct old slots collapse onto one position (Remark 1).
* ``centroid_linear``: recent slots at their actual positions; each summary slot's centroid c,
  taken over the history [0, a - N_r), mapped linearly into [t_min, t_max] of Eq. 2 with the query
  at q = a - 1: ``t_min = max(0, q - Delta)``, ``t_max = q - N_r``. In range but horizon-dependent.
* ``slot_rank``: WorldTrace slot indexing (paper Def. 1 with q = a - 1; docs/architecture.md §2): summary
  slot s (0 = oldest) at ``-(N_s + N_r) + s``, recent slot j at ``-N_r + j``. Depends on rank only.
* ``rank``: the baselines' own indexing (StreamingLLM's positions within the cache; MemRoPE's
  release reads its cache at indices 0..n-1 before the query block): slot j of n at ``-(n - j)``,
  whatever the slots' roles. For a writer that lists summary slots first (every writer here) the
  offsets equal ``slot_rank``'s; the names say whose rule a run follows, and ``slot_rank`` also
  checks the Def. 1 order.

Schemes read a slot's ``role`` (summary / recent), never its ``kind``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .slots import CacheGeometry, Slot


def _offsets(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.float64)


def actual(slots: Sequence[Slot], frame_start: int, geometry: CacheGeometry) -> torch.Tensor:
    """Offset of each slot's timestamp from the current chunk start: ``centroid - a``."""
    return _offsets(s.centroid - frame_start for s in slots)


def block_relative(slots: Sequence[Slot], frame_start: int, geometry: CacheGeometry) -> torch.Tensor:
    """``actual`` offsets capped at the oldest trained offset ``F - 1 - Delta`` (Remark 1)."""
    floor = geometry.frames_per_chunk - 1 - geometry.trained_offset
    return actual(slots, frame_start, geometry).clamp(min=floor)


def centroid_linear(slots: Sequence[Slot], frame_start: int, geometry: CacheGeometry) -> torch.Tensor:
    """Summary centroids mapped linearly from [0, a - N_r) into [t_min, t_max] (Eq. 2, q = a - 1)."""
    n_recent = sum(s.role == "recent" for s in slots)
    q = frame_start - 1
    t_min, t_max = max(0, q - geometry.trained_offset), q - n_recent
    history_end = max(1.0, frame_start - n_recent - 1.0)  # last frame outside the recent window
    out = []
    for s in slots:
        if s.role == "recent":
            out.append(s.centroid - frame_start)
        else:
            frac = min(1.0, max(0.0, s.centroid / history_end))
            out.append(t_min + frac * (t_max - t_min) - frame_start)
    return _offsets(out)


def slot_rank(slots: Sequence[Slot], frame_start: int, geometry: CacheGeometry) -> torch.Tensor:
    """Def. 1: summary slot s at ``-(N_s + N_r) + s``, recent slot j at ``-N_r + j`` (rank only).

    Raises:
        ValueError: a writer listed a recent slot before a summary slot (rank order broken).
    """
    recent = [s.role == "recent" for s in slots]
    if recent != sorted(recent):
        raise ValueError("slot_rank needs summary slots before recent slots")
    return torch.arange(-len(slots), 0, dtype=torch.float64)


def rank(slots: Sequence[Slot], frame_start: int, geometry: CacheGeometry) -> torch.Tensor:
    """Rank within the cache, contiguous with the current chunk: slot j of n at ``-(n - j)``.

    StreamingLLM (Xiao et al. 2024, §3.2) and MemRoPE's release (cache indices 0..n-1, query block
    right after them) position the cache this way; no ordering of roles is required.
    """
    return torch.arange(-len(slots), 0, dtype=torch.float64)


SCHEMES: dict[str, Callable[[Sequence[Slot], int, CacheGeometry], torch.Tensor]] = {
    "actual": actual,
    "block_relative": block_relative,
    "centroid_linear": centroid_linear,
    "rank": rank,
    "slot_rank": slot_rank,
}
