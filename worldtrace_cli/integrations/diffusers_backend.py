"""worldtrace's own chunk loop on diffusers' ``WanTransformer3DModel``: the ``--backend diffusers`` DiT.

:class:`DiffusersWanDiT` is a drop-in for the ``t2v``
:class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` (Self-Forcing, LongLive) in
:class:`~worldtrace_cli.engine.text_rollout.TextRollout`: the same call
``dit(x, t, y, chunk, commit=...)`` on a :class:`~worldtrace_cli.model.lingbot.dit.LingbotChunk`, the
same attributes the rollout, the re-cache and the speed settings read (``cfg``, ``patch_embedding``,
``rope``, ``blocks``, ``tokens_per_frame``, ``new_rollout_state``, ``compile_mode``). Each call runs
diffusers' transformer with the hook in external-past mode (:mod:`.diffusers_external`): every ``attn1``
reads the rollout's past slots (canonical keys rotated to the writer's virtual positions), and a committing
call hands every layer's canonical ``(k, v)`` back to the rollout, which commits them to its writer. So
records, metrics, resume, sessions and ``--attention-stats`` are the product's, computed on diffusers'
modules: its attention backends (``transformer.set_attention_backend``), group offloading and layerwise
casting apply as diffusers documents them. :func:`diffusers_dit_from` builds one from a loaded ``t2v``
``LingbotDiT`` (its weights taken over, not copied, through the key map of
:mod:`worldtrace_cli.model.wan_keys`). Proof: tests/test_diffusers_backend.py; docs/diffusers.md.
"""

from __future__ import annotations

import torch
from torch import nn

from ..model.chunk import CacheView
from ..model.dit import patch_tokens
from ..model.lingbot.config import TEXT_DIM
from ..model.lingbot.dit import LingbotRolloutState
from ..model.rope import ROPE_THETA
from .diffusers_external import ExternalPastState, apply_external_past, remove_external_past

BACKENDS = ("native", "diffusers")  # generate --backend: worldtrace's own DiT, or diffusers' transformer


class DiffusersWanDiT(nn.Module):
    """A diffusers ``WanTransformer3DModel`` behind the ``t2v`` ``LingbotDiT``'s interface (module docstring).

    Args:
        transformer: the diffusers transformer (Wan 2.1 t2v layout, ``WanAttnProcessor`` on every
            ``attn1``; any device and float dtype); the hooks are attached here.
        cfg: the :class:`~worldtrace_cli.model.lingbot.config.LingbotConfig` it was built from
            (``model_type: t2v``): sizes, ``text_len`` (the text is zero-padded to it, as the DiT does).
        official_timesteps: the timestep sinusoid in float64, as worldtrace's DiT (the frames then equal
            the native backend's; False: diffusers' float32 ``Timesteps``, ~2.5e-5 off at t = 1000).
        rope_theta: the transformer's RoPE base.
    Raises:
        ValueError: a config with a camera branch (LingBot-World), or see
            :func:`~worldtrace_cli.integrations.diffusers_external.apply_external_past`.
    """

    def __init__(self, transformer, cfg, official_timesteps: bool = True, rope_theta: float = ROPE_THETA):
        super().__init__()
        if cfg.has_camera:
            raise ValueError(f"DiffusersWanDiT runs a t2v DiT (model_type t2v), got model_type {cfg.model_type!r}")
        self.transformer = transformer
        self.cfg = cfg
        self.past_state: ExternalPastState = apply_external_past(transformer, rope_theta, official_timesteps)
        self.official_timesteps = official_timesteps
        self.compile_mode = "none"  # configure_speed sets it; the backend refuses --compile (engine)
        self.cudagraphs = False

    @property
    def patch_embedding(self) -> nn.Conv3d:
        """diffusers' patch embedding (``weight.dtype``: the compute dtype; layerwise casting skips it)."""
        return self.transformer.patch_embedding

    @property
    def blocks(self) -> nn.ModuleList:
        """diffusers' ``WanTransformerBlock`` list (no worldtrace compile parts: ``--compile`` compiles none)."""
        return self.transformer.blocks

    @property
    def rope(self):
        """The temporal RoPE the past slots are rotated with (a
        :class:`~worldtrace_cli.integrations.memory.TemporalRope`; ``precision``: float32, diffusers' tables)."""
        return self.past_state.rope

    def tokens_per_frame(self, latent_hw: tuple[int, int]) -> int:
        """Tokens of one latent frame of grid ``latent_hw`` (patch (1, 2, 2): lh * lw / 4)."""
        return patch_tokens(self.patch_embedding, latent_hw)

    def new_rollout_state(self) -> LingbotRolloutState:
        """A fresh rollout state (its ``cross_kv`` holds the padded text rows here)."""
        return LingbotRolloutState()

    def padded_text(self, text_context: torch.Tensor, device) -> torch.Tensor:
        """umT5 rows [L, 4096] or [1, L, 4096] (L <= text_len) -> [1, text_len, 4096] in the compute dtype,
        zero rows after (Wan's padding, attended like real tokens).

        Raises:
            ValueError: more than ``text_len`` rows or a width other than 4096."""
        ctx = text_context if text_context.dim() == 3 else text_context[None]
        if ctx.shape[-1] != TEXT_DIM or ctx.shape[1] > self.cfg.text_len:
            raise ValueError(f"text context must be [L <= {self.cfg.text_len}, {TEXT_DIM}], got {list(text_context.shape)}")
        ctx = ctx.to(device)
        pad = ctx.new_zeros(1, self.cfg.text_len - ctx.shape[1], TEXT_DIM)
        return torch.cat([ctx, pad], dim=1).to(self.patch_embedding.weight.dtype)

    def forward(self, x: torch.Tensor, timestep: float | torch.Tensor, y, chunk: CacheView, commit: bool = False):
        """One diffusers transformer call on a chunk, reading ``chunk``'s past.

        Args:
            x: noisy latents [1, 16, F, lh, lw] (any float dtype; cast to the weights'). F: the chunk's
                frames, or a re-cache's window.
            timestep: one timestep for the call (0.0 on the context pass).
            y: ignored (a t2v model has no conditioning channels).
            chunk: the chunk's :class:`~worldtrace_cli.model.lingbot.dit.LingbotChunk` (``past``, ``text_context``,
                ``temporal_freq_scale``, ``query_only_tokens``, ``attention``, ``rollout``).
            commit: also return every layer's canonical K/V.
        Returns:
            the flow [1, 16, F, lh, lw] float32; with ``commit`` ``(flow, committed)``, ``committed`` per
            layer the canonical ``(k, v)`` [1, F*S, H, d] (height/width RoPE applied, temporal not).
        Raises:
            ValueError: a text context of the wrong shape.
        """
        dtype = self.patch_embedding.weight.dtype
        state = chunk.rollout
        if state.cross_kv is None:  # the DiT's text cache: None after a prompt switch or a resume
            state.cross_kv = self.padded_text(chunk.text_context, x.device)
        t = torch.as_tensor(timestep, dtype=torch.float64).reshape(1).to(x.device)
        with self.past_state.call(chunk, x.shape[2], commit) as committed:
            flow = self.transformer(hidden_states=x.to(dtype), timestep=t, encoder_hidden_states=state.cross_kv,
                                    return_dict=False)[0]
        flow = flow.float()
        return (flow, committed) if commit else flow

    def release(self) -> bool:
        """Remove the hooks: the transformer computes as diffusers' own again (this object is unusable after)."""
        return remove_external_past(self.transformer)


def diffusers_dit_from(dit, official_timesteps: bool = True) -> DiffusersWanDiT:
    """A :class:`DiffusersWanDiT` holding ``dit``'s weights: diffusers' ``WanTransformer3DModel`` of the
    DiT's sizes (:func:`~worldtrace_cli.model.wan_keys.wan_transformer_kwargs`), its parameters the DiT's
    own tensors renamed (:func:`~worldtrace_cli.model.wan_keys.wan_to_diffusers`; shared, not copied: the
    caller drops ``dit``), on its device and in its dtype, eval mode, no gradients.

    Args:
        dit: a loaded ``t2v`` :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` (Self-Forcing, LongLive).
        official_timesteps: see :class:`DiffusersWanDiT`.
    Raises:
        ValueError: a DiT with a camera branch (LingBot-World: not a Wan 2.1 t2v layout), or a state
            dict the map or the transformer refuses.
    """
    from diffusers import WanTransformer3DModel

    from ..model.wan_keys import wan_to_diffusers, wan_transformer_kwargs

    cfg = dit.cfg
    if cfg.has_camera:
        raise ValueError(f"--backend diffusers runs t2v DiTs (Self-Forcing, LongLive); model_type {cfg.model_type!r} "
                         f"has a camera branch")
    kwargs = wan_transformer_kwargs(dim=cfg.dim, ffn_dim=cfg.ffn_dim, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                                    in_dim=cfg.in_dim, out_dim=cfg.out_dim, freq_dim=cfg.freq_dim, eps=cfg.eps)
    weight = dit.patch_embedding.weight
    try:  # parameters on the meta device (buffers real): the DiT's tensors are assigned, nothing allocated twice
        from accelerate import init_empty_weights

        with init_empty_weights(include_buffers=False):
            transformer = WanTransformer3DModel(**kwargs)
    except ImportError:
        transformer = WanTransformer3DModel(**kwargs)
    sd = wan_to_diffusers(dit.state_dict())
    missing, unexpected = transformer.load_state_dict(sd, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"DiT state dict: missing {missing[:3]}, unexpected {unexpected[:3]} for diffusers {kwargs}")
    transformer = transformer.to(weight.device).eval().requires_grad_(False)
    return DiffusersWanDiT(transformer, cfg, official_timesteps).eval()


__all__ = ["BACKENDS", "DiffusersWanDiT", "diffusers_dit_from"]
