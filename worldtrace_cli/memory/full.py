"""``full``: every past latent frame verbatim at its actual position (O(N) memory).

The unbounded baseline: nothing is forgotten, but offsets leave the trained range (paper §2.1).
It refuses, with exit code 5, before its KV cache would exceed ``--max-cache-gb``, counting the
two copies a chunk holds at once: the stored frames and the rotated attention buffers. (The
concatenation a layer's read makes lives only while that layer's buffer is filled:
``engine.rollout.WriterPast``; ``bench memory`` measures both copies: a Self-Forcing plan's chunk
phases grow by 2.0-2.1x the frame bytes per latent frame.)
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import RunError
from .base import CacheGeometry, CacheWriter, Slot, register
from .window import rewrite_held, split_frames



def _gigabytes(n: float) -> str:
    """``17.18 GB``, or ``9.22 kB`` / ``5.1 MB`` where two decimals of GB would read 0.00."""
    return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.3g} MB" if n >= 1e6 else f"{n / 1e3:.3g} kB"


@register
class FullWriter(CacheWriter):
    """Every past latent frame verbatim at its actual position (O(N) memory, capped by --max-cache-gb)."""

    name = "full"
    default_positions = "actual"

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._ids: list[int] = []
        self._k: list[list[torch.Tensor]] = [[] for _ in range(geometry.num_layers)]
        self._v: list[list[torch.Tensor]] = [[] for _ in range(geometry.num_layers)]

    def slots(self) -> list[Slot]:
        return [Slot("past", (f,), "recent") for f in self._ids]

    def _read_kv(self, layer: int):
        if not self._ids:
            return self._empty()
        return torch.cat(self._k[layer], dim=1), torch.cat(self._v[layer], dim=1)

    def frame_bytes(self) -> int:
        """K+V bytes of one latent frame, all layers."""
        g = self.geometry
        return 2 * g.tokens_per_frame * g.heads * g.head_dim * g.num_layers * torch.finfo(g.dtype).bits // 8

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int]) -> None:
        cap = self.settings.max_cache_gb * 1e9
        # the stored frames and the rotated attention buffers: 2 copies (module docstring)
        needed = 2 * (len(self._ids) + len(frame_ids)) * self.frame_bytes()
        if needed > cap:
            raise RunError(f"--cache {self.name}: the KV cache would reach {_gigabytes(needed)} at latent frame "
                           f"{frame_ids[-1]}, over --max-cache-gb {self.settings.max_cache_gb:g}; use a bounded "
                           f"writer or raise the cap")
        for frame_kv in split_frames(layers_kv, range(len(frame_ids)), self.geometry.tokens_per_frame):
            for layer, (k, v) in enumerate(frame_kv):
                self._k[layer].append(k)
                self._v[layer].append(v)
        self._ids.extend(frame_ids)

    def rewrite(self, layers_kv, frame_ids, summary: bool = False) -> list[int]:
        """:meth:`CacheWriter.rewrite`: the held frames among ``frame_ids``."""
        return rewrite_held(self._ids, self._k, self._v, layers_kv, frame_ids, self.geometry.tokens_per_frame)

    def state_dict(self) -> dict:
        """Frame ids [N] and per layer the stored K/V frames, each [1, T, H, D]."""
        return {**super().state_dict(), "frames": list(self._ids), "k": [list(x) for x in self._k],
                "v": [list(x) for x in self._v]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._ids = [int(f) for f in state["frames"]]
        self._k = [[self._device_copy(t) for t in frames] for frames in state["k"]]
        self._v = [[self._device_copy(t) for t in frames] for frames in state["v"]]

    def describe(self) -> dict:
        return {**super().describe(), "budget": None, "max_cache_gb": self.settings.max_cache_gb}
