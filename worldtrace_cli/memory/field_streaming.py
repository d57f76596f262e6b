"""``field-streaming``: WorldTrace Field with O(N_s) state and exact bucket merges (paper App. F).

Each latent frame leaving the recent window is folded once into a bucket (float32 running sums of
canonical K and V plus a count) and then discarded; slot s reads bucket s's mean, as in Def. 2.
App. F states only that boundary shifts are handled by exact merges of adjacent buckets. Our rule,
with buckets oldest to newest and their counts non-increasing:

1. if the newest bucket holds fewer frames than its older neighbour, the frame is folded into it;
2. else, with fewer than N_s buckets, the frame opens a new bucket;
3. else the oldest adjacent pair of equal counts, among the pairs with the smallest such count,
   is merged exactly (sums and counts added; such a pair exists since rule 1 did not apply), and
   the frame opens a new bucket. (N_s = 1: one bucket that every frame is folded into.)

Counts stay powers of two (the newest may be partial), within a factor 2 of each other apart from
the newest, and all N_s slots are filled once M >= N_s, so the cache size is constant. At
M <= N_s every bucket holds one frame, and at M = N_s * 2^j every bucket holds 2^j: there the
groups are the recompute writer's (:func:`~.field.uniform_groups`) and the slots are identical up to
float rounding. (A plainer rule, "merge all pairs (0,1), (2,3), ... and double a capacity", also
meets those points but leaves about half the slots empty after every merge.) State: N_s bucket
sums preallocated on the compute device, whatever M is; no host memory.
"""

from __future__ import annotations

import torch

from .base import CacheGeometry, Slot, register
from .field import stack_frame
from .window import FrameKV, RecentWindowWriter, SummaryMemory


class StreamingFieldSummary(SummaryMemory):
    """N_s field slots from running bucket sums; each evicted latent frame is read once, then dropped.

    Frame ids are recorded as (first, count) per bucket: the recent window evicts in commit order
    and the rollout's latent-frame ids are consecutive, so a bucket's sources are
    ``range(first, first + count)``.

    Args:
        num_slots: N_s (the most buckets held).
    """

    def __init__(self, num_slots: int):
        self.num_slots = num_slots

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        g = geometry
        shape = (self.num_slots, g.num_layers, 2, g.tokens_per_frame, g.heads, g.head_dim)
        self._sum = torch.zeros(shape, dtype=torch.float32, device=g.device)
        self._row: list[int] = []    # per bucket (oldest first) its row of _sum: merges move no data
        self._count: list[int] = []  # frames per bucket
        self._first: list[int] = []  # first source frame id per bucket
        self.merges = 0

    def _merge_smallest_equal_pair(self) -> None:
        """Rule 3: merge the oldest adjacent pair of equal counts among the smallest such count."""
        c = self._count
        i = min((j for j in range(len(c) - 1) if c[j] == c[j + 1]), key=lambda j: (c[j], j))
        self._sum[self._row[i]].add_(self._sum[self._row[i + 1]])
        c[i] *= 2
        del c[i + 1], self._first[i + 1]
        self._row.append(self._row.pop(i + 1))  # its row is free: the next bucket opened reuses it
        self.merges += 1

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        if self.num_slots == 0:
            return
        x = stack_frame(frame_kv).float()
        c = self._count
        if (len(c) == self.num_slots == 1) or (len(c) >= 2 and c[-1] < c[-2]):
            self._sum[self._row[len(c) - 1]].add_(x)  # rule 1
            c[-1] += 1
            return
        if len(c) == self.num_slots:
            self._merge_smallest_equal_pair()  # rule 3
        if len(self._row) == len(c):
            self._row.append(len(c))  # first use of this row
        self._sum[self._row[len(c)]].copy_(x)  # rules 2 and 3: open a bucket
        c.append(1)
        self._first.append(frame_id)

    def slots(self) -> list[Slot]:
        return [Slot("field", tuple(range(f, f + n)), "summary") for f, n in zip(self._first, self._count)]

    def kv(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        dtype = self.geometry.dtype
        out = []
        for row, n in zip(self._row, self._count):
            mean = self._sum[row, layer] / n  # [2, T, H, D] float32
            out.append((mean[0][None].to(dtype), mean[1][None].to(dtype)))
        return out

    def state_dict(self) -> dict:
        """float32 bucket ``sum`` [N_s, L, 2, T, H, D] and per bucket its row, count and first frame."""
        return {"sum": self._sum, "row": list(self._row), "count": list(self._count), "first": list(self._first),
                "merges": self.merges}

    def load_state_dict(self, state: dict) -> None:
        self._sum = state["sum"].to(self.geometry.device, dtype=torch.float32, copy=True)
        self._row, self._count = [int(r) for r in state["row"]], [int(c) for c in state["count"]]
        self._first, self.merges = [int(f) for f in state["first"]], int(state["merges"])

    def state_bytes(self) -> int:
        """Bytes of the writer state (bucket sums on the compute device): constant in M."""
        return self._sum.numel() * self._sum.element_size()

    def describe(self) -> dict:
        return {"field": {"groups": "power-of-two buckets, exact merges of adjacent equal buckets",
                          "keys": "canonical mean", "store": "none"}}


@register
class FieldStreamingWriter(RecentWindowWriter):
    """WorldTrace Field (streaming writer): N_r recent + N_s power-of-two bucket means, O(N_s) state."""

    name = "field-streaming"
    default_positions = "slot_rank"

    def make_components(self) -> list[SummaryMemory]:
        return [StreamingFieldSummary(self.n_summary)]
