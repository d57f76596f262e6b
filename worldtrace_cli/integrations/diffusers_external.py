"""The diffusers hook's *external-past* mode: each ``WanTransformer3DModel`` call reads the past slots its
caller hands it, and hands back the chunk's canonical K/V, instead of a writer of the hook's own.

:func:`apply_worldtrace_kv_cache` (:mod:`.diffusers`) owns a writer: the hook decides what each chunk reads
and commits. worldtrace's own chunk loop (:class:`~worldtrace_cli.engine.text_rollout.TextRollout`) owns
its writer already: per chunk it reads every layer's past as
:class:`~worldtrace_cli.model.chunk.LayerPast` (canonical keys, values, one virtual position per slot,
docs/architecture.md §2-3) and commits what the DiT returns. :func:`apply_external_past` registers the
same :class:`~worldtrace_cli.integrations.diffusers.WorldTraceSelfAttentionHook` on every ``attn1``
(``WanAttnProcessor``'s attention with the past prepended) over an :class:`ExternalPastState`, which
reads the past from the call's :class:`~worldtrace_cli.model.chunk.CacheView` (set for the call by
:meth:`ExternalPastState.call`): each layer's slots rotated once per chunk to their positions (float64
angles, as the own-writer mode and :class:`~worldtrace_cli.model.chunk.CacheView` do), YaRN's frequency
scale, the re-cache's query-only tokens (their keys and values not attended), the attention probe of
``--attention-stats``. No transformer-level hook: nothing happens between calls.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from diffusers.hooks import HookRegistry
from diffusers.models.transformers.transformer_wan import WanAttnProcessor, WanTransformer3DModel

from ..model.rope import ROPE_THETA
from .diffusers import (ATTN_HOOK_NAME, HOOK_NAME, TIMESTEPS_HOOK_NAME, Float64TimestepsHook,
                        WorldTraceSelfAttentionHook, _blocks, _invalidate, _temporal_channels)
from .memory import TemporalRope

EXTERNAL_ATTN_HOOK_NAME = "worldtrace_external_past_attn1"  # every block's attn1 hook in this mode


class ExternalPastState:
    """What the hooked ``attn1`` layers read in external-past mode: the current call's
    :class:`~worldtrace_cli.model.chunk.CacheView` (``view``), its frame count, whether it commits.

    Attributes:
        num_layers: hooked blocks; rope: the transformer's temporal RoPE (:class:`TemporalRope`; its
            ``precision`` rounds the past's cos/sin, float32 as diffusers' tables).
        view: the call's CacheView (None between calls): ``past`` (a LayerPast per layer, or the
            rollout's lazy ``WriterPast``), ``temporal_freq_scale``, ``query_only_tokens``, ``attention``.
        frames: latent frames of the call (the chunk's F, or a re-cache's window).
    """

    def __init__(self, num_layers: int, rope: TemporalRope):
        self.num_layers, self.rope = num_layers, rope
        self.view, self.frames, self._commit, self._kv = None, 0, False, {}
        self._memo_view, self._past, self._angles, self._tokens = None, {}, {}, {}

    @property
    def freq_scale(self) -> torch.Tensor | None:
        """YaRN's float64 [channels/2] temporal frequency multipliers of the call, or None."""
        return None if self.view is None else self.view.temporal_freq_scale

    @property
    def query_only_tokens(self) -> int:
        """The call's first tokens that only query (a prompt-switch re-cache), else 0."""
        return 0 if self.view is None else int(self.view.query_only_tokens)

    @contextmanager
    def call(self, view, frames: int, commit: bool):
        """``with state.call(view, frames, commit) as committed: transformer(...)``: the hooked layers read
        ``view``'s past during the call; with ``commit`` ``committed`` (a list) holds, after the block,
        every layer's canonical ``(k, v)`` [B, n, H, D] (n = frames * tokens per frame), else stays empty.
        The rotated past is kept for the view's next calls, and dropped after a committing call.

        Raises:
            RuntimeError: a committing call in which some hooked layer did not run."""
        if self._memo_view is not view:
            self._memo_view, self._past, self._angles, self._tokens = view, {}, {}, {}
        self.view, self.frames, self._commit, self._kv = view, int(frames), bool(commit), {}
        committed: list = []
        try:
            yield committed
            if commit:
                missing = [i for i in range(self.num_layers) if i not in self._kv]
                if missing:
                    raise RuntimeError(f"commit: layers {missing} did not run their hooked attn1")
                committed.extend(self._kv[i] for i in range(self.num_layers))
        finally:
            self.view, self._kv = None, {}
            if commit:  # the chunk's last call: nothing of its past is kept past it
                self._memo_view, self._past, self._angles, self._tokens = None, {}, {}, {}

    def _require(self):
        if self.view is None:
            raise RuntimeError("a hooked attn1 ran outside ExternalPastState.call (call through DiffusersWanDiT)")
        return self.view

    def past(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s past keys rotated to their slots' positions and its values, [1, N, H, D] in
        ``dtype`` (N = 0 for an empty past), rotated once per view (every call of the chunk reuses it)."""
        view = self._require()
        if layer not in self._past:
            p = view.past[layer]
            k, n = p.k.to(dtype), p.k.shape[1]
            if n:
                slots = p.positions.numel()
                key = (tuple(p.positions.tolist()), n) if p.counts is None else None  # one table per chunk
                angles = self._angles.get(key) if key is not None else None
                if angles is None:
                    reps = (torch.full((slots,), n // slots, dtype=torch.int64) if p.counts is None
                            else p.counts.to("cpu", torch.int64))
                    tokens = p.positions.to("cpu", torch.float64).repeat_interleave(reps)
                    angles = self.rope.angles(tokens, self.freq_scale, k.device)
                    if key is not None:
                        self._angles[key] = angles
                k = self.rope.rotate(k, None, angles=angles)
            self._past[layer], self._tokens[layer] = (k, p.v.to(dtype)), n
        return self._past[layer]

    def current_angles(self, tokens: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [tokens, channels/2] of the call's frames 0..frames-1 at YaRN-scaled frequencies."""
        key = ("current", tokens, self.frames)
        if key not in self._angles:
            pos = torch.arange(self.frames, dtype=torch.float64).repeat_interleave(tokens // self.frames)
            self._angles[key] = self.rope.angles(pos, self.freq_scale, device)
        return self._angles[key]

    def observe(self, layer: int, q, k_canon, v, keys) -> None:
        """One layer's call: keep its canonical K/V when the call commits; hand q and the key buffer
        [B, past + n - query_only, H, D] to the view's attention probe when one is set."""
        view = self._require()
        if self._commit:
            self._kv[layer] = (k_canon, v)
        if view.attention is not None:
            view.attention.observe(layer, q, keys, None, keys.shape[1] - self._tokens[layer])


def apply_external_past(transformer: WanTransformer3DModel, rope_theta: float = ROPE_THETA,
                        official_timesteps: bool = True) -> ExternalPastState:
    """Put ``transformer`` in external-past mode (module docstring): every ``attn1`` reads the past of the
    :class:`ExternalPastState` call it runs in.

    Args:
        transformer: a diffusers ``WanTransformer3DModel`` with ``WanAttnProcessor`` on every ``attn1``.
        rope_theta: its RoPE base (checked against its table).
        official_timesteps: compute the timestep sinusoid in float64 as the original Wan and worldtrace
            do (:class:`~worldtrace_cli.integrations.diffusers.Float64TimestepsHook`); False: diffusers'
            float32 ``Timesteps`` (a flow at t = 1000 moves by ~2.5e-5 on the tiny model).
    Returns:
        the :class:`ExternalPastState` the hooks share.
    Raises:
        ValueError: not a WanTransformer3DModel, a WorldTrace cache (either mode) already attached, an
            ``attn1`` with another processor, a RoPE table ``rope_theta`` does not reproduce, or a
            ``Timesteps`` that is not Wan's with ``official_timesteps``.
    """
    blocks = _blocks(transformer)
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    attached = [getattr(b.attn1, "_diffusers_hook", None) for b in blocks]
    if registry.get_hook(HOOK_NAME) is not None or any(
            r is not None and (r.get_hook(EXTERNAL_ATTN_HOOK_NAME) or r.get_hook(ATTN_HOOK_NAME)) for r in attached):
        raise ValueError("transformer: a WorldTrace KV cache is already attached (remove it first)")
    for i, block in enumerate(blocks):
        if type(block.attn1.processor) is not WanAttnProcessor:
            raise ValueError(f"blocks[{i}].attn1: processor {type(block.attn1.processor).__name__}; the hook "
                             f"reproduces WanAttnProcessor (set_attn_processor(WanAttnProcessor()) first)")
    rope = TemporalRope.from_table(transformer.rope.freqs_cos, transformer.rope.freqs_sin,
                                   _temporal_channels(transformer.rope), rope_theta)
    proj = transformer.condition_embedder.timesteps_proj
    if official_timesteps and (not proj.flip_sin_to_cos or proj.downscale_freq_shift != 0
                               or getattr(proj, "scale", 1) != 1):
        raise ValueError("official_timesteps: this transformer's Timesteps is not Wan's (cos first, no shift)")
    state = ExternalPastState(len(blocks), rope)
    for i, block in enumerate(blocks):
        HookRegistry.check_if_exists_or_initialize(block.attn1).register_hook(
            WorldTraceSelfAttentionHook(state, i), EXTERNAL_ATTN_HOOK_NAME)
    sub = HookRegistry.check_if_exists_or_initialize(proj)
    if official_timesteps and sub.get_hook(TIMESTEPS_HOOK_NAME) is None:
        sub.register_hook(Float64TimestepsHook(), TIMESTEPS_HOOK_NAME)
    _invalidate(registry)
    return state


def remove_external_past(transformer: WanTransformer3DModel) -> bool:
    """Remove every hook :func:`apply_external_past` registered (through ``HookRegistry.remove_hook``); the
    transformer computes as before. Returns False when none was attached.

    Raises:
        ValueError: not a WanTransformer3DModel."""
    blocks = _blocks(transformer)
    found = False
    for block in blocks:
        sub = getattr(block.attn1, "_diffusers_hook", None)
        if sub is not None and sub.get_hook(EXTERNAL_ATTN_HOOK_NAME) is not None:
            sub.remove_hook(EXTERNAL_ATTN_HOOK_NAME, recurse=False)
            found = True
    if not found:
        return False
    sub = getattr(transformer.condition_embedder.timesteps_proj, "_diffusers_hook", None)
    if sub is not None and sub.get_hook(TIMESTEPS_HOOK_NAME) is not None:
        sub.remove_hook(TIMESTEPS_HOOK_NAME, recurse=False)
    registry = getattr(transformer, "_diffusers_hook", None)
    if registry is not None:
        _invalidate(registry)
    return True


__all__ = ["EXTERNAL_ATTN_HOOK_NAME", "ExternalPastState", "apply_external_past", "remove_external_past"]
