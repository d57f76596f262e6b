"""WorldTrace's KV-cache memory on a diffusers ``WanTransformer3DModel``: causal chunked generation with any
writer, through diffusers' own hook registry.

:func:`apply_worldtrace_kv_cache` registers, with ``diffusers.hooks.HookRegistry`` (as diffusers' own
first-block cache and pyramid attention broadcast register theirs), one :class:`WorldTraceTransformerHook`
on the transformer and one :class:`WorldTraceSelfAttentionHook` on every ``WanTransformerBlock.attn1``.
Nothing of diffusers is patched and nothing is global: the hooks share one
:class:`~worldtrace_cli.integrations.kv_state.WorldTraceKVState`, and
:func:`remove_worldtrace_kv_cache` gives the transformer back its own forward.

Each transformer call is one chunk of F latent frames (``WorldTraceKVCacheConfig.frames_per_chunk``).
diffusers' ``WanRotaryPosEmbed`` gives the call's frames temporal indices 0..F-1: the hook reads them as
offsets from the chunk's first latent frame, and reads the past slots at the writer's virtual positions
(negative offsets from that frame; docs/memory.md), rotated analytically from the transformer's RoPE
frequencies (float64 angles, so offsets past its 1024-row table work). The self-attention hook
reproduces ``WanAttnProcessor`` (diffusers 0.35-0.42, ``models/transformers/transformer_wan.py``):
``to_q/to_k/to_v``, ``norm_q``/``norm_k`` (RMSNorm across heads), the interleaved-pair rotary of
``apply_rotary_emb``, ``dispatch_attention_fn`` on the model's attention backend, ``to_out``, with the
cache's past keys and values prepended to the chunk's. The keys it commits are canonical: after
``norm_k``, height/width RoPE applied, temporal RoPE not.

The call made inside ``with commit_chunk(transformer):`` is the chunk's context pass (Self-Forcing:
the clean latents at t = 0): after it returns, every layer's canonical K/V of the chunk go to the
writer, and the next call begins the next chunk. Source: docs/diffusers.md; the proof against
worldtrace's own Self-Forcing backbone and the official fixtures: tests/test_diffusers_hook.py.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import torch
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanTransformer3DModel

from ..model.rope import rotate_channels
from .kv_state import WorldTraceKVCacheConfig, WorldTraceKVState
from .memory import TemporalRope

HOOK_NAME = "worldtrace_kv_cache"  # the transformer's hook
ATTN_HOOK_NAME = "worldtrace_kv_cache_attn1"  # every block's attn1 hook
TIMESTEPS_HOOK_NAME = "worldtrace_float64_timesteps"  # condition_embedder.timesteps_proj (official_timesteps)
_PARALLEL = "parallel_config" in inspect.signature(dispatch_attention_fn).parameters  # diffusers >= 0.36


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' ``apply_rotary_emb`` of ``WanAttnProcessor``: x [B, N, H, C], cos/sin [1, N, 1, C] with
    each pair's value on both its channels; the same arithmetic element by element, so rotating
    channel slices one by one gives the bits of one whole rotation."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


class WorldTraceTransformerHook(ModelHook):
    """On ``WanTransformer3DModel``: before each call, begin the chunk (or go on with it) and check the
    call's frames and grid; after it, commit the chunk when the call was made inside ``commit_chunk``.
    Stateful: diffusers' ``reset_stateful_hooks`` (``transformer._reset_stateful_cache()``) resets the memory."""

    _is_stateful = True

    def __init__(self, state: WorldTraceKVState):
        super().__init__()
        self.state = state

    def pre_forward(self, module, *args, **kwargs):
        """Raises ValueError: hidden_states not [B, C, F, H, W], or see ``WorldTraceKVState.begin_call``."""
        x = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(x, torch.Tensor) or x.dim() != 5:
            raise ValueError(f"hidden_states: expected latents [B, C, F, H, W], got "
                             f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        p_t, p_h, p_w = module.config.patch_size
        b, _, f, h, w = x.shape
        self.state.begin_call(f // p_t, (h // p_h) * (w // p_w), b, x.device)
        return args, kwargs

    def post_forward(self, module, output):
        self.state.end_call()
        return output

    def reset_state(self, module):
        self.state.reset()
        return module


class WorldTraceSelfAttentionHook(ModelHook):
    """On one ``WanTransformerBlock.attn1``: ``WanAttnProcessor``'s self-attention over
    ``[the cache's past slots | the chunk]`` (module docstring). ``layer``: the block's index."""

    def __init__(self, state: WorldTraceKVState, layer: int):
        super().__init__()
        self.state, self.layer = state, layer

    def new_forward(self, module: WanAttention, hidden_states: torch.Tensor, encoder_hidden_states=None,
                    attention_mask=None, rotary_emb=None, **kwargs) -> torch.Tensor:
        """hidden_states [B, n, D] (n = F * tokens per frame) -> [B, n, D].

        Raises:
            ValueError: a cross-attention context, an attention mask, extra processor arguments or no
                rotary embedding (a Wan self-attention call has none of the first three)."""
        if encoder_hidden_states is not None or attention_mask is not None or kwargs or rotary_emb is None:
            raise ValueError("the WorldTrace hook runs Wan's self-attention (attn1): no encoder_hidden_states, "
                             "no attention_mask, a rotary_emb")
        state = self.state
        if getattr(module, "fused_projections", False):
            q, k, v = module.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            q, k, v = module.to_q(hidden_states), module.to_k(hidden_states), module.to_v(hidden_states)
        q = module.norm_q(q).unflatten(2, (module.heads, -1))
        k = module.norm_k(k).unflatten(2, (module.heads, -1))
        v = v.unflatten(2, (module.heads, -1))
        cos, sin = rotary_emb  # [1, n, 1, head_dim]: temporal indices 0..F-1 of the call, then height, width
        t = state.rope.channels
        spatial = _rotary(k[..., t:], cos[..., t:], sin[..., t:])
        k_canon = torch.cat([k[..., :t], spatial], dim=-1)
        if state.freq_scale is None:
            q = _rotary(q, cos, sin)
            k = torch.cat([_rotary(k[..., :t], cos[..., :t], sin[..., :t]), spatial], dim=-1)
        else:  # YaRN: the chunk's own frames at the scaled temporal frequencies too, queries included
            c_t, s_t = state.current_angles(q.shape[1], q.device)
            q = torch.cat([rotate_channels(q[..., :t], c_t, s_t), _rotary(q[..., t:], cos[..., t:], sin[..., t:])], -1)
            k = torch.cat([rotate_channels(k[..., :t], c_t, s_t), spatial], dim=-1)
        past_k, past_v = state.past(self.layer, k.dtype)
        b = q.shape[0]
        skip = getattr(state, "query_only_tokens", 0)  # the external-past mode's re-cache call (diffusers_external)
        keys = torch.cat([past_k.expand(b, -1, -1, -1), k[:, skip:]], dim=1)
        values = torch.cat([past_v.expand(b, -1, -1, -1), v[:, skip:]], dim=1)
        state.observe(self.layer, q, k_canon, v, keys)
        extra = {"parallel_config": None} if _PARALLEL else {}
        out = dispatch_attention_fn(q, keys, values, attn_mask=None, dropout_p=0.0, is_causal=False,
                                    backend=getattr(module.processor, "_attention_backend", None), **extra)
        out = out.flatten(2, 3).type_as(q)
        return module.to_out[1](module.to_out[0](out))


class Float64TimestepsHook(ModelHook):
    """On ``condition_embedder.timesteps_proj`` (diffusers ``Timesteps`` with ``flip_sin_to_cos`` and no
    frequency shift, Wan's): the sinusoid ``[cos(t w_k) | sin(t w_k)]``, ``w_k = 10000 ** (-k / half)``,
    computed in float64 and returned as float32, as the original Wan ``sinusoidal_embedding_1d`` does
    (:func:`worldtrace_cli.model.dit.sinusoidal_embedding`). timesteps [B] -> [B, num_channels] float32."""

    def new_forward(self, module, timesteps: torch.Tensor) -> torch.Tensor:
        from ..model.dit import sinusoidal_embedding

        return sinusoidal_embedding(module.num_channels, timesteps.reshape(-1)).float()


def _blocks(transformer) -> list:
    if not isinstance(transformer, WanTransformer3DModel):
        raise ValueError(f"transformer: expected a diffusers WanTransformer3DModel, got {type(transformer).__name__}")
    return list(transformer.blocks)


def apply_worldtrace_kv_cache(transformer: WanTransformer3DModel, config: WorldTraceKVCacheConfig
                              ) -> WorldTraceKVState:
    """Attach a WorldTrace KV cache to ``transformer``: from now on each call is one causal chunk of
    ``config.frames_per_chunk`` latent frames attending to the cache's past (module docstring).

    Args:
        transformer: a diffusers ``WanTransformer3DModel`` (Wan 2.1 / Self-Forcing-style weights,
            ``WanAttnProcessor`` on every ``attn1``), any device and float dtype.
        config: the :class:`WorldTraceKVCacheConfig`.
    Returns:
        the hooks' :class:`~worldtrace_cli.integrations.kv_state.WorldTraceKVState` (also
        :func:`get_worldtrace_kv_state`).
    Raises:
        ValueError: not a WanTransformer3DModel, a cache already attached, an ``attn1`` with another
            processor, or a RoPE table that ``config.rope_theta`` does not reproduce.
        TypeError: ``config`` not a WorldTraceKVCacheConfig.
    """
    if not isinstance(config, WorldTraceKVCacheConfig):
        raise TypeError(f"config: expected a WorldTraceKVCacheConfig, got {type(config).__name__}")
    blocks = _blocks(transformer)
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    if registry.get_hook(HOOK_NAME) is not None:
        raise ValueError("transformer: a WorldTrace KV cache is already attached (remove_worldtrace_kv_cache first)")
    for i, block in enumerate(blocks):
        if type(block.attn1.processor) is not WanAttnProcessor:
            raise ValueError(f"blocks[{i}].attn1: processor {type(block.attn1.processor).__name__}; the hook "
                             f"reproduces WanAttnProcessor (set_attn_processor(WanAttnProcessor()) first)")
    attn = blocks[0].attn1
    rope = TemporalRope.from_table(transformer.rope.freqs_cos, transformer.rope.freqs_sin,
                                   _temporal_channels(transformer.rope), config.rope_theta)
    proj = transformer.condition_embedder.timesteps_proj
    if config.official_timesteps and (not proj.flip_sin_to_cos or proj.downscale_freq_shift != 0
                                      or getattr(proj, "scale", 1) != 1):
        raise ValueError("official_timesteps: this transformer's Timesteps is not Wan's (cos first, no shift)")
    state = WorldTraceKVState(config, len(blocks), attn.heads, attn.inner_dim // attn.heads, rope, attn.to_k.weight)
    for i, block in enumerate(blocks):  # everything checked: nothing below refuses
        HookRegistry.check_if_exists_or_initialize(block.attn1).register_hook(
            WorldTraceSelfAttentionHook(state, i), ATTN_HOOK_NAME)
    if config.official_timesteps:
        HookRegistry.check_if_exists_or_initialize(proj).register_hook(Float64TimestepsHook(), TIMESTEPS_HOOK_NAME)
    registry.register_hook(WorldTraceTransformerHook(state), HOOK_NAME)
    _invalidate(registry)
    return state


def _temporal_channels(rope) -> int:
    """The temporal RoPE channels of a ``WanRotaryPosEmbed``: its ``t_dim`` (diffusers 0.42), else what
    0.35's constructor computes without keeping it (head_dim - 2 * 2 * (head_dim // 6): 44 of 128)."""
    t_dim = getattr(rope, "t_dim", None)
    return int(t_dim) if t_dim is not None else rope.attention_head_dim - 4 * (rope.attention_head_dim // 6)


def _invalidate(registry) -> None:
    if hasattr(registry, "invalidate_child_registries_cache"):  # diffusers 0.42's cached child list
        registry.invalidate_child_registries_cache()


def remove_worldtrace_kv_cache(transformer: WanTransformer3DModel) -> bool:
    """Detach the cache: every hook this module registered is removed through ``HookRegistry.remove_hook``
    and the transformer computes as before it was applied. Returns False when none was attached.

    Raises:
        ValueError: not a WanTransformer3DModel."""
    blocks = _blocks(transformer)
    registry = getattr(transformer, "_diffusers_hook", None)
    if registry is None or registry.get_hook(HOOK_NAME) is None:
        return False
    registry.remove_hook(HOOK_NAME, recurse=False)
    for module, name in [(b.attn1, ATTN_HOOK_NAME) for b in blocks] + [
            (transformer.condition_embedder.timesteps_proj, TIMESTEPS_HOOK_NAME)]:
        sub = getattr(module, "_diffusers_hook", None)
        if sub is not None:
            sub.remove_hook(name, recurse=False)
    _invalidate(registry)
    return True


def get_worldtrace_kv_state(transformer: WanTransformer3DModel) -> WorldTraceKVState:
    """The :class:`~worldtrace_cli.integrations.kv_state.WorldTraceKVState` of ``transformer``'s cache:
    its memory, slots and positions, attention per slot, ``state_dict`` / ``load_state_dict``, ``reset``.

    Raises:
        ValueError: no WorldTrace KV cache attached."""
    registry = getattr(transformer, "_diffusers_hook", None)
    hook = registry.get_hook(HOOK_NAME) if registry is not None else None
    if hook is None:
        raise ValueError("transformer: no WorldTrace KV cache attached (apply_worldtrace_kv_cache(transformer, config))")
    return hook.state


@contextmanager
def commit_chunk(transformer: WanTransformer3DModel):
    """``with commit_chunk(transformer): transformer(x0, t0, text)``: the call inside is the chunk's
    context pass, whose canonical K/V every layer commits to the writer once it returns (each call
    inside commits one chunk: a real video's chunks can be committed one after another). Yields the state.

    Raises:
        ValueError: no cache attached. RuntimeError: no transformer call inside the block (nothing committed)."""
    state = get_worldtrace_kv_state(transformer)
    before = state.chunks
    state._commit_depth += 1
    try:
        yield state
    finally:
        state._commit_depth -= 1
    if state.chunks == before:
        raise RuntimeError("commit_chunk: no transformer call inside the block, nothing was committed")


__all__ = ["ATTN_HOOK_NAME", "Float64TimestepsHook", "HOOK_NAME", "TIMESTEPS_HOOK_NAME", "WorldTraceKVCacheConfig", "WorldTraceKVState", "WorldTraceSelfAttentionHook",
           "WorldTraceTransformerHook", "apply_worldtrace_kv_cache", "commit_chunk", "get_worldtrace_kv_state",
           "remove_worldtrace_kv_cache"]
