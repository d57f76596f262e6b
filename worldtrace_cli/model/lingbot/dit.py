"""The LingBot-World causal-fast DiT (``WanModelFast``), inference path only (spec §3, §5, §6).

Parameter names are the official state dict's (no prefix, spec §13), so a released ``transformers/``
folder loads strictly. Like the MG2 DiT (:mod:`worldtrace_cli.model.dit`, whose attention, norm and
sinusoid modules are reused unchanged) the self-attention owns no cache: each chunk the caller hands
it, per layer, the past slots as canonical keys (height/width RoPE applied, the 22 temporal pairs
not) with one temporal position per slot (:class:`~worldtrace_cli.model.dit.LayerPast`, offsets in
latent frames from the chunk's first frame). The DiT rotates the slots once per chunk into a
``[past | current chunk]`` buffer reused by the four denoising calls and the context pass, and on the
context pass (``commit=True``) returns the chunk's canonical K/V for the writer (docs/architecture.md §3,
spec §14). Rotating queries at offsets 0..F-1 instead of absolute frame indices changes outputs only
at float rounding (spec §14: <= 1.7e-6) and lifts the official 1024-frame RoPE table limit (spec §6).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..chunk import CacheView, ContextKV, LayerPast
from ..dit import CrossAttention, FloatLayerNorm, SelfAttention, patch_tokens, sinusoidal_embedding
from ..rope import MainRope
from .config import TEXT_DIM, LingbotConfig

__all__ = ["LingbotDiT", "LingbotChunk", "LingbotRolloutState", "LayerPast", "camera_tokens"]


@dataclass
class LingbotRolloutState:
    """Per-rollout state outside the self-attention cache: the text cross-attention K/V of every
    layer (``(k, v)`` [1, H, 512, d] each), computed on the first DiT call and reused (spec §5.2)."""

    cross_kv: ContextKV | None = None

    def state_dict(self) -> dict:
        """Nothing to save: the text K/V are recomputed from the prompt on the first call after a
        resume (deterministic: the same values)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`: forget the text K/V (recomputed on the next call)."""
        self.cross_kv = None


@dataclass(kw_only=True)
class LingbotChunk(CacheView):
    """Everything fixed across one chunk's DiT calls (four denoising steps and the context pass).

    Attributes:
        rollout: the rollout's :class:`LingbotRolloutState`.
        past: per layer the :class:`LayerPast` the writer returned (positions: offsets in latent
            frames from the chunk's first frame, e.g. -1 for the newest past frame).
        text_context: umT5 output rows [L_txt, 4096] or [1, L_txt, 4096], L_txt <= 512 (real tokens
            only; padded with zero rows to 512 here, spec §5 step 3).
        camera: [1, 384, F, lh, lw] camera embedding of the chunk's latent frames (spec §10.3);
            None for a ``t2v`` model (Self-Forcing, LongLive), which has no camera branch.
    The past slots and per-chunk RoPE tables / rotated buffers come from
    :class:`~worldtrace_cli.model.chunk.CacheView`.
    """

    rollout: LingbotRolloutState
    text_context: torch.Tensor
    camera: torch.Tensor | None = None
    _cam_tokens: torch.Tensor | None = field(default=None, init=False)


def camera_tokens(camera: torch.Tensor) -> torch.Tensor:
    """Regroup the camera tensor per token: [1, C, F, lh, lw] -> [1, F*(lh/2)*(lw/2), 4C] (spec §5 step 4).

    Token (f, i, j) reads ``camera[0, c, f, 2i+q, 2j+r]`` at vector index ``c*4 + 2q + r``.

    Raises:
        ValueError: odd latent height or width.
    """
    b, c, f, lh, lw = camera.shape
    if lh % 2 or lw % 2:
        raise ValueError(f"camera latent grid {lh}x{lw} must be even in both axes")
    x = camera.view(b, c, f, lh // 2, 2, lw // 2, 2).permute(0, 2, 3, 5, 1, 4, 6)
    return x.reshape(b, f * (lh // 2) * (lw // 2), c * 4)


class LingbotBlock(nn.Module):
    """One attention block (spec §3, §5 step 5): modulated self-attention, camera FiLM, text
    cross-attention, modulated FFN."""

    compile_parts = ("attention_inputs", "block_outputs")  # pure tensor parts: model/speed.compile_blocks

    def __init__(self, cfg: LingbotConfig):
        super().__init__()
        d = cfg.dim
        self.modulation = nn.Parameter(torch.zeros(1, 6, d))
        self.norm1 = FloatLayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.norm2 = FloatLayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(d, cfg.num_heads, cfg.eps)
        self.norm3 = FloatLayerNorm(d, eps=cfg.eps, elementwise_affine=True)
        self.cross_attn = CrossAttention(d, cfg.num_heads, cfg.eps)
        self.ffn = nn.Sequential(nn.Linear(d, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, d))
        if cfg.has_camera:  # a t2v model (Self-Forcing, LongLive) has no camera branch
            self.cam_injector_layer1 = nn.Linear(d, d)
            self.cam_injector_layer2 = nn.Linear(d, d)
            self.cam_scale_layer = nn.Linear(d, d)
            self.cam_shift_layer = nn.Linear(d, d)

    @staticmethod
    def _modulate(h, shift, scale, like):
        return (h.float() * (1 + scale) + shift).type_as(like)

    def camera_film(self, x: torch.Tensor, cam: torch.Tensor) -> torch.Tensor:
        """``g = cam + W2 SiLU(W1 cam)``; ``x * (1 + W_scale g) + W_shift g`` (spec §5 step 5).

        x, cam [1, N, D] -> [1, N, D] in x's dtype.
        """
        g = cam + self.cam_injector_layer2(torch.nn.functional.silu(self.cam_injector_layer1(cam)))
        return (1 + self.cam_scale_layer(g)) * x + self.cam_shift_layer(g)

    def forward(self, x, e0, cam, layer: int, chunk: LingbotChunk, rope: MainRope, grid, commit: bool):
        """x [1, F*S, D], e0 [1, 6, D] (time projection), cam [1, F*S, D] (camera tokens) -> (x' [1, F*S, D], kv).

        ``kv``: with ``commit`` the chunk's canonical (k, v) [1, F*S, H, d] for the cache writer, else None.
        """
        f, gh, gw = grid
        cos, sin = chunk.rope_tables(rope, f, gh, gw, x.device)
        m = (self.modulation.float() + e0.float()).chunk(6, dim=1)  # six [1, 1, D] float32
        q, k, v, k_canon = self.attention_inputs(x, m, cos, sin, rope.t_ch, commit)
        # the writer copies what it keeps (CacheWriter.commit), so CUDA-graph outputs are safe to hand out
        kv = (k_canon, v) if commit else None
        attn = self.self_attn.attend(q, k, v, layer, chunk, rope)
        return self.block_outputs(x, attn, m, cam, chunk.rollout.cross_kv.get(layer, self.cross_attn)), kv

    def attention_inputs(self, x, m, cos, sin, t_ch: int, commit: bool):
        """Pure (compiled by :func:`~worldtrace_cli.model.speed.compile_blocks`): norm1 + modulation,
        then the q/k/v projections with RoPE. x [1, F*S, D], m six float32 [1, 1, D], cos/sin
        [F*S, d/2] -> (q, k, v, k_canon) [1, F*S, H, d] (k_canon None unless ``commit``). Spec §5 step 5."""
        return self.self_attn.project(self._modulate(self.norm1(x), m[0], m[1], x), cos, sin, t_ch, commit)

    def block_outputs(self, x, attn, m, cam, cross_kv):
        """Pure (compiled): output projection and gated residual, camera FiLM, text cross-attention
        residual, modulated FFN and gated residual (spec §5 step 5). x, attn, cam [1, F*S, D], m six
        float32 [1, 1, D], cross_kv the text (k, v) -> [1, F*S, D] in x's dtype."""
        x = (x.float() + self.self_attn.o(attn).float() * m[2]).type_as(x)
        if cam is not None:
            x = self.camera_film(x, cam)
        x = x + self.cross_attn(self.norm3(x), cross_kv)
        y = self.ffn(self._modulate(self.norm2(x), m[3], m[4], x))
        return (x.float() + y.float() * m[5]).type_as(x)


class LingbotHead(nn.Module):
    """Output head (spec §5 step 6): ``Linear(LN(x) (1 + h1) + h0)`` with (h0, h1) = modulation + e."""

    def __init__(self, cfg: LingbotConfig):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(1, 2, cfg.dim))
        self.norm = FloatLayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, cfg.out_dim * 4)

    def forward(self, x, e):
        """x [1, N, D], e [1, D] (time embedding) -> [1, N, 64]."""
        shift, scale = (self.modulation.float() + e.float().unsqueeze(1)).chunk(2, dim=1)
        return self.head((self.norm(x).float() * (1 + scale) + shift).type_as(x))


class LingbotDiT(nn.Module):
    """LingBot-World ``WanModelFast`` (spec §3, §5): Wan2.2-I2V-A14B expert with a camera branch.

    Args:
        cfg: :class:`~worldtrace_cli.model.lingbot.config.LingbotConfig`. Batch size is 1.
    """

    def __init__(self, cfg: LingbotConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, d, kernel_size=(1, 2, 2), stride=(1, 2, 2))
        if cfg.has_camera:
            self.patch_embedding_wancamctrl = nn.Linear(cfg.camera_dim, d)
            self.c2ws_hidden_states_layer1 = nn.Linear(d, d)
            self.c2ws_hidden_states_layer2 = nn.Linear(d, d)
        self.text_embedding = nn.Sequential(nn.Linear(TEXT_DIM, d), nn.GELU(approximate="tanh"), nn.Linear(d, d))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.blocks = nn.ModuleList(LingbotBlock(cfg) for _ in range(cfg.num_layers))
        self.head = LingbotHead(cfg)
        self.rope = MainRope(cfg.head_dim)
        self.compile_mode = "none"  # see worldtrace_cli.model.speed.compile_blocks
        self.cudagraphs = False

    def tokens_per_frame(self, latent_hw: tuple[int, int]) -> int:
        """Tokens of one latent frame of grid ``latent_hw`` (:func:`~worldtrace_cli.model.dit.patch_tokens`)."""
        return patch_tokens(self.patch_embedding, latent_hw)

    def new_rollout_state(self) -> LingbotRolloutState:
        """Empty text cross-attention cache for a new rollout."""
        return LingbotRolloutState()

    def embed_text(self, text_context: torch.Tensor) -> torch.Tensor:
        """umT5 rows [L, 4096] or [1, L, 4096] (L <= text_len) -> projected context [1, text_len, D]:
        zero rows pad to ``text_len`` and are attended like real tokens (spec §5 step 3).

        Raises:
            ValueError: more than ``text_len`` rows or a width other than 4096.
        """
        ctx = text_context if text_context.dim() == 3 else text_context[None]
        if ctx.shape[-1] != TEXT_DIM or ctx.shape[1] > self.cfg.text_len:
            raise ValueError(f"text context must be [L <= {self.cfg.text_len}, {TEXT_DIM}], got {list(text_context.shape)}")
        dtype = self.patch_embedding.weight.dtype
        pad = ctx.new_zeros(1, self.cfg.text_len - ctx.shape[1], TEXT_DIM)
        return self.text_embedding(torch.cat([ctx, pad], dim=1).to(dtype))

    def embed_camera(self, camera: torch.Tensor) -> torch.Tensor:
        """Camera tensor [1, 384, F, lh, lw] -> camera tokens [1, F*S, D]:
        ``c = W v + b``, ``c + L2(SiLU(L1 c))`` (spec §5 step 4)."""
        c = self.patch_embedding_wancamctrl(camera_tokens(camera).to(self.patch_embedding.weight.dtype))
        return c + self.c2ws_hidden_states_layer2(torch.nn.functional.silu(self.c2ws_hidden_states_layer1(c)))

    def forward(self, x: torch.Tensor, timestep: float | torch.Tensor, y: torch.Tensor,
                chunk: LingbotChunk, commit: bool = False) -> torch.Tensor:
        """One DiT call on a chunk (spec §5).

        Args:
            x: noisy latents [1, 16, F, lh, lw] (any float dtype; cast to the weights' dtype).
            timestep: one timestep for the whole call (999, 967, 908, 768; 0.0 on the context pass).
            y: conditioning [1, 20, F, lh, lw]: 4 mask channels then the 16-channel image latent.
            chunk: the chunk's :class:`LingbotChunk` (past slots, text, camera).
            commit: context pass: also return every layer's canonical K/V.
        Returns:
            flow prediction v [1, 16, F, lh, lw] in float32 (spec §5 step 7); with ``commit``
            ``(v, committed)``, ``committed`` per layer canonical (k, v) [1, F*S, H, d] for the writer.
        Raises:
            ValueError: ``y`` or the camera do not match ``x``'s frames and grid.
        """
        dtype = self.patch_embedding.weight.dtype
        b, _, f, lh, lw = x.shape
        camera = self.cfg.has_camera
        if camera and (y.shape[2:] != x.shape[2:] or chunk.camera.shape[2:] != x.shape[2:]):
            raise ValueError(f"y {list(y.shape)} and camera {list(chunk.camera.shape)} must match x {list(x.shape)} "
                             f"in frames and latent grid")
        h = self.patch_embedding((torch.cat([x, y], dim=1) if camera else x).to(dtype))
        gh, gw = h.shape[-2:]
        h = h.flatten(2).transpose(1, 2)  # [1, F*S, D], tokens (f, i, j)
        t = torch.as_tensor(timestep, dtype=torch.float64).reshape(1).to(x.device)
        e = self.time_embedding(sinusoidal_embedding(self.cfg.freq_dim, t).float().to(dtype))  # [1, D]
        e0 = self.time_projection(e).view(1, 6, -1)
        if chunk.rollout.cross_kv is None:
            chunk.rollout.cross_kv = ContextKV(self.embed_text(chunk.text_context.to(x.device)), len(self.blocks))
        if camera and chunk._cam_tokens is None:
            chunk._cam_tokens = self.embed_camera(chunk.camera.to(x.device))
        if self.cudagraphs and h.is_cuda:
            torch.compiler.cudagraph_mark_step_begin()  # the previous call's graph outputs are dead now
        committed = []
        for i, block in enumerate(self.blocks):
            h, kv = block(h, e0, chunk._cam_tokens, i, chunk, self.rope, (f, gh, gw), commit)
            committed.append(kv)
        out = self.head(h, e)  # [1, N, 64], channels ordered (q, r, c)
        out = out.view(b, f, gh, gw, 2, 2, -1).permute(0, 6, 1, 2, 4, 3, 5)
        flow = out.reshape(b, -1, f, 2 * gh, 2 * gw).float()
        return (flow, committed) if commit else flow
