"""``sink``: the first k latent frames (attention sinks, StreamingLLM) + the newest ``budget - k``.

Paper App. B, Fig. "projection matrices" (b). Positions ``actual``: sink frames are read at their
true (ever more distant) offsets unless ``--positions`` says otherwise.
"""

from __future__ import annotations

from ..errors import InputError
from .base import CacheGeometry, MemoryConfig, Slot, register
from .window import FrameKV, RecentWindowWriter, SummaryMemory


class SinkSummary(SummaryMemory):
    """Keeps the first ``k`` frames that leave the recent window (frames 0..k-1), verbatim."""

    def __init__(self, k: int):
        self.k = k

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._ids: list[int] = []
        self._kv: list[FrameKV] = []

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        if len(self._ids) < self.k:
            self._ids.append(frame_id)
            self._kv.append(frame_kv)  # the recent window's own per-frame copy (split_frames)

    def slots(self) -> list[Slot]:
        return [Slot("sink", (f,)) for f in self._ids]

    def kv(self, layer: int):
        return [frame[layer] for frame in self._kv]


@register
class SinkWriter(RecentWindowWriter):
    """First ``--sink-frames`` latent frames + the newest ``budget - k`` verbatim (default budget: MG2's)."""

    name = "sink"
    default_positions = "actual"

    def __init__(self, config: MemoryConfig, default_budget: int):
        budget = config.budget if config.budget is not None else default_budget
        k = config.sink_frames
        if k < 1 or k >= budget:
            raise InputError(f"--sink-frames: must be >= 1 and < the budget ({budget}), got {k}")
        super().__init__(MemoryConfig(**{**config.__dict__, "budget": budget, "summary_slots": k,
                                         "recent_slots": budget - k}), default_budget)
        self.config = config

    def make_components(self):
        return [SinkSummary(self.n_summary)]

    def describe(self) -> dict:
        return {**super().describe(), "sink_frames": self.n_summary}
