"""Position schemes: the virtual temporal position at which each cache slot is read.

A scheme maps the writer's slots (oldest first) to float64 offsets in latent frames from the first
frame ``a`` of the current chunk (the query chunk). Offsets of past slots are negative.

* ``actual``: a slot sits at its (mean) source frame, ``centroid - a`` (MG2's own cache).
* ``slot_rank``: WorldTrace slot indexing (paper Def. 1, pinned in design.md §3 with q = a - 1):
  recent slot j (0 = oldest) at ``-N_r + j``; summary slot s (0 = oldest) at ``-(N_s + N_r) + s``.
  Offsets depend on slot rank only: distinct and in the trained range at any horizon.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .base import CacheGeometry, Slot

SUMMARY_KINDS = frozenset({"field", "landmark", "sink", "ema"})


def actual(slots: Sequence[Slot], frame_start: int, geometry: CacheGeometry | None) -> torch.Tensor:
    """Offset of each slot's source centroid from the current chunk start: ``centroid - a``."""
    return torch.tensor([s.centroid - frame_start for s in slots], dtype=torch.float64)


def slot_rank(slots: Sequence[Slot], frame_start: int, geometry: CacheGeometry | None) -> torch.Tensor:
    """Paper Def. 1: summary slots at ``-(N_s+N_r)+s``, recent slots at ``-N_r+j`` (rank order)."""
    n = len(slots)
    return torch.arange(-n, 0, dtype=torch.float64)


SCHEMES: dict[str, Callable[[Sequence[Slot], int, CacheGeometry | None], torch.Tensor]] = {
    "actual": actual,
    "slot_rank": slot_rank,
}
