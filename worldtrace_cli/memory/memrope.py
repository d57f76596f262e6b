"""``memrope``: MemRoPE-style dual EMA memory (paper App. "Training-Free Positional Baselines").

Two summary slots hold exponential moving averages of the canonical keys (and values) of frames
leaving the recent window: a long stream (alpha 0.01) and a short one (alpha 0.1), as in the
original release. The first evicted frame initialises both (no zero bias). Each stream also keeps
an EMA of its source timestamps, which is the slot's time for position schemes; the default scheme
is ``block_relative``. The recent window keeps ``budget - 2`` frames (4 with the default budget 6).
"""

from __future__ import annotations

import torch

from .base import CacheGeometry, MemoryConfig, Slot, register
from .window import FrameKV, RecentWindowWriter, SummaryMemory

ALPHAS = {"long": 0.01, "short": 0.1}


class EmaSummary(SummaryMemory):
    """EMA streams of evicted canonical K/V: per stream and layer a [1, T, H, D] float32 state."""

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._state: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._time: dict[str, float] = {}
        self._first = self._last = -1

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        if not self._state:
            self._first = frame_id
            for name in ALPHAS:
                self._state[name] = [(k.float().clone(), v.float().clone()) for k, v in frame_kv]
                self._time[name] = float(frame_id)
        else:
            for name, alpha in ALPHAS.items():
                for (ek, ev), (k, v) in zip(self._state[name], frame_kv):
                    ek.lerp_(k.float(), alpha)
                    ev.lerp_(v.float(), alpha)
                self._time[name] += alpha * (frame_id - self._time[name])
        self._last = frame_id

    def slots(self) -> list[Slot]:
        frames = tuple(range(self._first, self._last + 1))
        return [Slot("ema", frames, time=self._time[name]) for name in ALPHAS if name in self._state]

    def kv(self, layer: int):
        dtype = self.geometry.dtype
        return [(self._state[n][layer][0].to(dtype), self._state[n][layer][1].to(dtype))
                for n in ALPHAS if n in self._state]


@register
class MemRopeWriter(RecentWindowWriter):
    """Dual EMA (long 0.01, short 0.1) + ``budget - 2`` recent frames; positions ``block_relative``."""

    name = "memrope"
    default_positions = "block_relative"

    def __init__(self, config: MemoryConfig, default_budget: int):
        budget = config.budget if config.budget is not None else 6
        super().__init__(MemoryConfig(**{**config.__dict__, "budget": budget, "summary_slots": 2,
                                         "recent_slots": None}), default_budget)
        self.config = config

    def make_components(self):
        return [EmaSummary()]

    def describe(self) -> dict:
        return {**super().describe(), "ema_alphas": dict(ALPHAS)}
