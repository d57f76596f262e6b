"""``sink``: the first k latent frames (attention sinks, StreamingLLM) + the newest ``budget - k``.

Paper App. B, Fig. "projection matrices" (b). Positions ``rank`` by default, as StreamingLLM does:
the cache is positioned by rank within the cache (Xiao et al. 2024, §3.2: "positions within the
cache rather than those in the original text"), so with budget n slot j (sinks first, 0 = oldest)
is read at offset -(n - j), contiguous with the current chunk. ``--positions actual`` reads each sink
at its true, ever more distant offset instead.
"""

from __future__ import annotations

from .base import CacheGeometry, Slot, frames_state, load_frames, register
from .window import FrameKV, RecentWindowWriter, SummaryMemory


class SinkSummary(SummaryMemory):
    """Keeps the first ``k`` frames that leave the recent window (frames 0..k-1), verbatim.

    Args:
        k: number of sink latent frames.
    """

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

    def rewrite(self, frames: dict) -> list[int]:
        """Replace the sink frames among ``frames`` (LongLive's early prompt switch)."""
        done = [f for f in self._ids if f in frames]
        for i, f in enumerate(self._ids):
            if f in frames:
                self._kv[i] = frames[f]
        return done

    def slots(self) -> list[Slot]:
        return [Slot("sink", (f,), "summary") for f in self._ids]

    def kv(self, layer: int):
        return [frame[layer] for frame in self._kv]

    def state_dict(self) -> dict:
        """Sink frame ids [<= k] and their per-layer (k, v) [1, T, H, D]."""
        return {"ids": list(self._ids), "kv": frames_state(self._kv)}

    def load_state_dict(self, state: dict) -> None:
        self._ids = [int(f) for f in state["ids"]]
        self._kv = load_frames(state["kv"], self.geometry.device)


@register
class SinkWriter(RecentWindowWriter):
    """First --sink-frames latent frames + the newest budget - k verbatim, rank positions (StreamingLLM)."""

    name = "sink"
    default_positions = "rank"

    def make_components(self):
        return [SinkSummary(self.n_summary)]

    def describe(self) -> dict:
        return {**super().describe(), "sink_frames": self.n_summary}
