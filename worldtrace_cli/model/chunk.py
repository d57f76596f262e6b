"""What one chunk's DiT calls read from the KV cache, shared by every backbone (MG2, LingBot-World).

Each chunk the rollout hands the DiT, per self-attention layer, the writer's past slots as
*canonical keys* with one temporal position per slot (:class:`LayerPast`, paper §3; docs/architecture.md §3).
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
        k: canonical keys [1, N, H, D] (spatial RoPE applied, temporal not): S slots of T tokens
            (N = S*T), or with ``counts`` slots of ``counts[s]`` tokens each, in slot order
            ([B, N, H, D] when training stacks B clips at the same positions).
        v: values [1, N, H, D] (or [B, N, H, D]).
        positions: [S] virtual temporal position of each slot in latent frames, relative to the first
            frame of the current chunk (so the newest past frame of MG2's sliding window is at -1).
        counts: None (every slot one latent frame of T tokens) or int64 [S] tokens of each slot in
            this layer (a compressed chunk's frames keep fewer tokens, WorldKV §3; every token of a
            slot is read at the slot's position). Sums to N.
    """

    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    counts: torch.Tensor | None = None


class ContextKV:
    """A rollout's cross-attention (k, v) of its constant context (MG2's CLIP tokens, LingBot's text),
    per layer, each made by its own block on first use and kept for the rollout (MG2 spec §5.2): a block's
    weights are used only inside its own forward, which is what diffusers' group offloading needs (it
    brings a block to the GPU for its forward: ``--offload blocks``, docs/gpu-memory.md).

    Args:
        ctx: the projected context [1, L, D] (the DiT's ``img_emb`` / ``embed_text`` output).
        num_layers: blocks of the DiT.
    """

    def __init__(self, ctx: torch.Tensor, num_layers: int):
        self.ctx = ctx
        self._kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    def get(self, layer: int, attention) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s (k, v), made by ``attention.context_kv(ctx)`` (its block's cross-attention)
        the first time."""
        if self._kv[layer] is None:
            self._kv[layer] = attention.context_kv(self.ctx)
        return self._kv[layer]


def past_tokens(past, layer: int) -> int:
    """Past tokens of ``layer`` in ``past`` (a list of :class:`LayerPast`, or a sequence with a
    ``tokens(layer)`` method that reads them without the K/V: the rollouts' ``WriterPast``)."""
    return past.tokens(layer) if hasattr(past, "tokens") else past[layer].k.shape[1]


@dataclass(kw_only=True)
class CacheView:
    """The past slots of one chunk and the per-chunk tables built from them.

    Attributes:
        past: per layer the :class:`LayerPast` the writer returned for this chunk (a list, or a
            sequence that reads each layer from the writer when asked: ``engine.rollout.WriterPast``).
        temporal_freq_scale: optional [t_ch/2] multipliers of the temporal RoPE frequencies for this
            chunk's queries and keys (YaRN); None = the model's own frequencies.
        query_only_tokens: the call's first tokens that only query: their keys and values are not
            attended (LongLive's prompt-switch re-cache, selfforcing-architecture.md §10.3: the frames
            whose cache slots the sink keeps); 0 for every chunk of a rollout.
        shared_buffer: one K/V buffer for every layer, re-filled by each call (the layers run in turn:
            every denoising step and the context pass rotate each layer's past again) instead of one
            per layer kept for the chunk: 1/L of the buffer memory (LingBot-World: 0.55 GB instead of
            22.2 GB at the default cache, docs/gpu-memory.md) for L-1 more rotations per call. Same values.
        attention: an :class:`~worldtrace_cli.model.attention_stats.AttentionProbe` that measures each
            layer's share of attention per cache slot in the calls made while it is set (the rollout
            sets it for the chunk's last denoising step under ``--attention-stats``); None: nothing
            is measured (the default: one attribute test per layer).
    """

    past: list[LayerPast]
    temporal_freq_scale: torch.Tensor | None = None
    query_only_tokens: int = 0
    shared_buffer: bool = False
    attention: object = None
    _buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, init=False)
    _filled: int | None = field(default=None, init=False)  # shared_buffer: the layer the buffer holds
    _shared: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, init=False)  # its full-size pair
    _slot_angles: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict, init=False)
    _tables: tuple | None = field(default=None, init=False)

    def rope_tables(self, rope: MainRope, frames: int, height: int, width: int, device):
        """cos/sin [F*h*w, head_dim/2] of every channel pair of the current chunk's tokens
        (:meth:`MainRope.chunk_tables`: temporal offsets 0..F-1), computed once per chunk and reused
        by every layer, step and the context pass."""
        if self._tables is None:
            self._tables = rope.chunk_tables(frames, height, width, self.temporal_freq_scale, device)
        return self._tables

    def kv_buffer(self, layer: int, rope: MainRope, current_tokens: int, dtype,
                  batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """[past slots rotated to their positions | room for the current chunk] K and V buffers
        [B, L+n, H, D] in ``dtype``, made once per chunk and layer (read by ``SelfAttention.attend``),
        or with :attr:`shared_buffer` re-filled in one pair whenever the layer changes.

        ``batch``: B, the current chunk's batch (default: the past's; an empty past [1, 0, H, D] serves
        any batch). Inference runs B = 1; training may stack clips (then the past is [B, L, H, D])."""
        if self.shared_buffer:
            if self._filled != layer:
                self._buffers = {layer: self._fill(layer, rope, current_tokens, dtype, batch)}
                self._filled = layer
        elif layer not in self._buffers:
            self._buffers[layer] = self._fill(layer, rope, current_tokens, dtype, batch)
        return self._buffers[layer]

    def _fill(self, layer: int, rope: MainRope, current_tokens: int, dtype, batch: int | None):
        """``layer``'s [past rotated | room] K and V buffers: new tensors, or with ``shared_buffer`` views
        of the one pair (sized for the layer with the most past tokens, made by the first call)."""
        p = self.past[layer]
        b, length, h, d = p.k.shape
        b = b if batch is None else batch
        rows = length + current_tokens
        if not self.shared_buffer:
            kbuf = p.k.new_empty((b, rows, h, d), dtype=dtype)
            vbuf = torch.empty_like(kbuf)
        else:
            full = self._shared
            if full is None or full[0].dtype != dtype or full[0].shape[0] != b or full[0].shape[1] < rows:
                longest = max(past_tokens(self.past, i) for i in range(len(self.past)))
                k = p.k.new_empty((b, longest + current_tokens, h, d), dtype=dtype)
                full = self._shared = (k, torch.empty_like(k))
            kbuf, vbuf = full[0][:, :rows], full[1][:, :rows]
        if length:
            # every layer reads the same slots at the same positions: one angle table per chunk
            # (per slot when slots differ in size per layer, then repeated per token per layer)
            per_slot = length // len(p.positions) if p.counts is None else 1
            key = (tuple(p.positions.tolist()), length if p.counts is None else None)
            if key not in self._slot_angles:
                self._slot_angles[key] = rope.slot_angles(p.positions, per_slot, self.temporal_freq_scale,
                                                          p.k.device)
            angles = self._slot_angles[key]
            if p.counts is not None:
                reps = p.counts.to(p.k.device)
                angles = tuple(a.repeat_interleave(reps, 0, output_size=length) for a in angles)
            rope.rotate_slots(p.k.to(dtype), p.positions, out=kbuf[:, :length], angles=angles)
            vbuf[:, :length] = p.v
        return kbuf, vbuf
