"""``sliding``: MG2's own cache, the newest ``budget`` latent frames verbatim at their actual positions.

With the default budget ``local_attn_size - 3`` (3 past frames for universal/templerun, 1 for
gta_drive) this reproduces the official rolling KV buffer (MG2 spec §7; the golden fixtures pin it).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import torch

from .base import CacheGeometry, CacheWriter, Slot, register
from .window import rewrite_held, split_frames


@register
class SlidingWriter(CacheWriter):
    """MG2's own cache: the newest --budget latent frames verbatim at their actual positions."""

    name = "sliding"
    default_positions = "actual"

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._frames: deque[int] = deque(maxlen=self.budget)
        self._k = [deque(maxlen=self.budget) for _ in range(geometry.num_layers)]
        self._v = [deque(maxlen=self.budget) for _ in range(geometry.num_layers)]

    def slots(self) -> list[Slot]:
        return [Slot("past", (f,), "recent") for f in self._frames]

    def _read_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._frames:
            return self._empty()
        return torch.cat(list(self._k[layer]), dim=1), torch.cat(list(self._v[layer]), dim=1)

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int]) -> None:
        if self.budget == 0:
            return
        newest = range(max(0, len(frame_ids) - self.budget), len(frame_ids))  # only these can stay
        for frame_kv in split_frames(layers_kv, newest, self.geometry.tokens_per_frame):
            for layer, (k, v) in enumerate(frame_kv):
                self._k[layer].append(k)
                self._v[layer].append(v)
        self._frames.extend(frame_ids[newest.start:])

    def rewrite(self, layers_kv, frame_ids, summary: bool = False) -> list[int]:
        """:meth:`CacheWriter.rewrite`: the held frames among ``frame_ids``."""
        return rewrite_held(self._frames, self._k, self._v, layers_kv, frame_ids, self.geometry.tokens_per_frame)

    def state_dict(self) -> dict:
        """Frame ids [budget] and per layer the stored K/V frames, each [1, T, H, D]."""
        return {**super().state_dict(), "frames": list(self._frames),
                "k": [list(d) for d in self._k], "v": [list(d) for d in self._v]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._frames.clear()
        self._frames.extend(int(f) for f in state["frames"])
        for store, saved in ((self._k, state["k"]), (self._v, state["v"])):
            for d, frames in zip(store, saved):
                d.clear()
                d.extend(self._device_copy(t) for t in frames)
