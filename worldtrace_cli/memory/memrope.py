"""``memrope``: MemRoPE (Kim et al. 2026), dual-rate EMA memory tokens (paper App. E, Table 9).

Cache, oldest rank first, as in the release's ``[Sink] + [Long EMA] + [Short EMA] + [Recent]``:
``--sink-frames`` k verbatim first frames, a long (alpha 0.01) and a short (alpha 0.1) EMA slot, and
``budget - k - 2`` verbatim recent frames. Frames leave the recent window at each commit; the sink
takes the first k, and the EMA streams are updated **once per chunk** with the per-token mean of
the frames that chunk evicted (the release updates at each new block, with the block's evicted
frames):

    m_c = mean of chunk c's evicted canonical K (and V)      e_1 = m_1 (both streams)
    e_c = (1 - alpha) e_{c-1} + alpha m_c                       (alpha per chunk, not per frame)

Keys stay canonical (MemRoPE's "Online RoPE Indexing": stored without temporal RoPE, rotated at
read time). Positions ``rank`` by default, as the release reads its cache at indices 0..n-1 right
before the query block: slot j of n at offset -(n - j). ``--positions slot_rank`` is the paper's
"MemRoPE + WorldTrace positions" (Table 9); ``--positions block_relative`` reads each EMA slot at its
EMA time capped at the trained offset (how the paper's Table 9 ran MemRoPE). The default budget is
the model's window (6 for MG2: 1 sink + 2 EMA + 3 recent). docs/memory.md lists what differs from
the release.
"""

from __future__ import annotations

import torch

from .base import CacheGeometry, Slot, register
from .sink import SinkSummary
from .window import FrameKV, RecentWindowWriter, SummaryMemory

ALPHAS = {"long": 0.01, "short": 0.1}  # per chunk, as in the release (ema_alpha_long, ema_alpha_short)


class EmaSummary(SummaryMemory):
    """Long and short EMA streams of evicted canonical K/V, updated once per chunk.

    State per stream and layer: float32 (k, v) [1, T, H, D], and the EMA of the evicted frames'
    mean latent-frame index (the slot's ``time``, used by ``actual``/``block_relative``).

    Args:
        skip: the first ``skip`` evicted frames belong to the sink and are not folded.
    """

    def __init__(self, skip: int = 0):
        self.skip = skip

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._state: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._time: dict[str, float] = {}
        self._first = self._last = -1
        self._seen = 0                                      # evicted frames so far (sink ones included)
        self._chunk: list[tuple[int, FrameKV]] = []         # this commit's evicted frames, until end_chunk

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        self._seen += 1
        if self._seen > self.skip:
            self._chunk.append((frame_id, frame_kv))

    def end_chunk(self) -> None:
        """Fold this chunk's evicted frames, as their mean, into both streams (one update per chunk)."""
        if not self._chunk:
            return
        ids = [f for f, _ in self._chunk]
        layers = len(self._chunk[0][1])
        mean = [tuple(torch.stack([fkv[layer][i].float() for _, fkv in self._chunk]).mean(0) for i in (0, 1))
                for layer in range(layers)]
        t = sum(ids) / len(ids)
        if not self._state:
            self._first = ids[0]
            for name in ALPHAS:
                self._state[name] = [(k.clone(), v.clone()) for k, v in mean]
                self._time[name] = t
        else:
            for name, alpha in ALPHAS.items():
                for (ek, ev), (k, v) in zip(self._state[name], mean):
                    ek.lerp_(k, alpha)
                    ev.lerp_(v, alpha)
                self._time[name] += alpha * (t - self._time[name])
        self._last = ids[-1]
        self._chunk = []

    def slots(self) -> list[Slot]:
        frames = tuple(range(self._first, self._last + 1))
        return [Slot("ema", frames, "summary", time=self._time[name]) for name in ALPHAS if name in self._state]

    def kv(self, layer: int):
        dtype = self.geometry.dtype
        return [(self._state[n][layer][0].to(dtype), self._state[n][layer][1].to(dtype))
                for n in ALPHAS if n in self._state]

    def state_dict(self) -> dict:
        """Streams (per name, per layer float32 [k, v] [1, T, H, D]), their times, source range, count."""
        return {"streams": {n: [[k, v] for k, v in layers] for n, layers in self._state.items()},
                "time": dict(self._time), "first": self._first, "last": self._last, "seen": self._seen}

    def load_state_dict(self, state: dict) -> None:
        dev = self.geometry.device
        self._state = {n: [(k.to(dev, copy=True), v.to(dev, copy=True)) for k, v in layers]
                       for n, layers in state["streams"].items()}
        self._time = {n: float(t) for n, t in state["time"].items()}
        self._first, self._last, self._seen = int(state["first"]), int(state["last"]), int(state["seen"])
        self._chunk = []


@register
class MemRopeWriter(RecentWindowWriter):
    """MemRoPE: --sink-frames sinks + long/short EMA slots (per chunk) + recent frames, rank positions."""

    name = "memrope"
    default_positions = "rank"

    def make_components(self):
        k = self.settings.sink_frames
        return [SinkSummary(k), EmaSummary(skip=k)]

    def describe(self) -> dict:
        return {**super().describe(), "sink_frames": self.settings.sink_frames, "ema_alphas": dict(ALPHAS),
                "ema_update": "once per chunk, with the per-token mean of the frames the chunk evicted"}
