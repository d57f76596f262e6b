"""What one chunk's DiT calls read from the KV cache, shared by every backbone (MG2, LingBot-World).

Each chunk the rollout hands the DiT, per self-attention layer, the writer's past slots as
*canonical keys* with one temporal position per slot (:class:`LayerPast`, design.md §3).
:class:`CacheView` rotates them once per chunk and layer into a preallocated
``[past slots | current chunk]`` buffer and computes the chunk's RoPE tables once; the denoising
steps and the context pass reuse both (MG2 spec §11, LingBot spec §14).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .rope import MainRope


@dataclass
class LayerPast:
    """The past slots one self-attention layer reads this chunk.

    Attributes:
        k: canonical keys [1, S*T, H, D] (spatial RoPE applied, temporal not), S slots of T tokens.
        v: values [1, S*T, H, D].
        positions: [S] virtual temporal position of each slot in latent frames, relative to the first
            frame of the current chunk (so the newest past frame of MG2's sliding window is at -1).
    """

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor


@dataclass(kw_only=True)
class CacheView:
    """The past slots of one chunk and the per-chunk tables built from them.

    Attributes:
        past: per layer the :class:`LayerPast` the writer returned for this chunk.
        temporal_freq_scale: optional [t_ch/2] multipliers of the temporal RoPE frequencies for this
            chunk's queries and keys (YaRN); None = the model's own frequencies.
    """

    past: list[LayerPast]
    temporal_freq_scale: torch.Tensor | None = None
    _buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, init=False)
    _slot_angles: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, init=False)
    _tables: tuple | None = field(default=None, init=False)

    def rope_tables(self, rope: MainRope, frames: int, height: int, width: int, device):
        """cos/sin [F*h*w, head_dim/2] of every channel pair of the current chunk's tokens
        (:meth:`MainRope.chunk_tables`: temporal offsets 0..F-1), computed once per chunk and reused
        by every layer, step and the context pass."""
        if self._tables is None:
            self._tables = rope.chunk_tables(frames, height, width, self.temporal_freq_scale, device)
        return self._tables

    def kv_buffer(self, layer: int, rope: MainRope, current_tokens: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[past slots rotated to their positions | room for the current chunk] K and V buffers
        [1, L+n, H, D] in ``dtype``, made once per chunk and layer (read by ``SelfAttention.attend``)."""
        if layer not in self._buffers:
            p = self.past[layer]
            b, length, h, d = p.k.shape
            kbuf = p.k.new_empty((b, length + current_tokens, h, d), dtype=dtype)
            vbuf = torch.empty_like(kbuf)
            if length:
                # every layer reads the same slots at the same positions: one angle table per chunk
                key = (tuple(p.positions.tolist()), length)
                if key not in self._slot_angles:
                    self._slot_angles[key] = rope.slot_angles(p.positions, length // len(p.positions),
                                                              self.temporal_freq_scale, p.k.device)
                rope.rotate_slots(p.k.to(dtype), p.positions, out=kbuf[:, :length], angles=self._slot_angles[key])
                vbuf[:, :length] = p.v
            self._buffers[layer] = (kbuf, vbuf)
        return self._buffers[layer]
