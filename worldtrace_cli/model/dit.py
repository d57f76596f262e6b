"""The MG2 causal Wan-2.1 DiT, inference path only (MG2 spec §3-§9), reading an explicit KV-cache view.

Parameter names are the official checkpoint's (no ``model.`` prefix): an official state dict loads
strictly. Each chunk the caller hands the self-attention, per layer, the past slots as *canonical keys*
(spatial RoPE applied, temporal RoPE not) with one virtual temporal position per slot (:class:`LayerPast`,
paper §3); each slot is rotated once per chunk into a ``[past slots | current chunk]`` buffer reused by
every denoising step and the context pass, which (``commit=True``) returns the chunk's canonical keys
and values for the cache writer (docs/architecture.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .action import ActionKV, ActionModule
from .chunk import CacheView, ContextKV, LayerPast  # noqa: F401  (LayerPast re-exported)
from .config import DiTConfig
from .rope import MainRope, rotate_channels


@dataclass
class RolloutState:
    """Per-rollout model state outside the self-attention cache: the cross-attention K/V of the
    constant CLIP context (computed on the first call, spec §5.2) and the action caches (spec §8)."""

    num_layers: int
    cross_kv: ContextKV | None = None
    mouse_kv: list[ActionKV] = field(init=False)
    keyboard_kv: list[ActionKV] = field(init=False)

    def __post_init__(self):
        self.mouse_kv = [ActionKV() for _ in range(self.num_layers)]
        self.keyboard_kv = [ActionKV() for _ in range(self.num_layers)]

    def state_dict(self) -> dict:
        """The action caches, per branch a list over layers of ``[k, v]`` (tensors or None), for
        resume states. The cross-attention K/V are not saved: the next call recomputes them."""
        return {branch: [[kv.k, kv.v] for kv in getattr(self, f"{branch}_kv")] for branch in ("mouse", "keyboard")}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`. Raises ValueError for another layer count."""
        for branch in ("mouse", "keyboard"):
            if len(state[branch]) != self.num_layers:
                raise ValueError(f"{branch} action cache of {len(state[branch])} layers, expected {self.num_layers}")
            setattr(self, f"{branch}_kv", [ActionKV(k, v) for k, v in state[branch]])


@dataclass(kw_only=True)
class ChunkInputs(CacheView):
    """Everything fixed across one chunk's DiT calls (denoising steps and context pass).

    Attributes:
        rollout: the rollout's :class:`RolloutState`.
        past: per layer the :class:`LayerPast` the writer returned for this chunk.
        frame_start: absolute latent-frame index of the chunk's first frame (selects action rows).
        keyboard: [B, R, keyboard_dim] action rows (pixel frames) from row ``first_row`` on, covering the
            rows the chunk reads; mouse: [B, R, 2] or None; first_row: the absolute index of row 0 of both.
        visual_context: [B, 257, clip_dim] CLIP tokens.
        (B = 1 at inference; training may stack B clips of the same latent frames.)
        temporal_freq_scale: optional [t_ch/2] multipliers of the temporal RoPE frequencies for
            this chunk's queries and keys (YaRN); None = MG2's frequencies.
    """

    rollout: RolloutState
    frame_start: int
    keyboard: torch.Tensor
    mouse: torch.Tensor | None
    visual_context: torch.Tensor
    first_row: int = 0
    _action_rows: tuple | None = field(default=None, init=False)

    def action_rows(self, module: ActionModule, frames: int, dtype):
        """The action rows this chunk reads (:meth:`ActionModule.select_rows`), selected once per
        chunk (every action module of a model reads the same rows)."""
        if self._action_rows is None:
            self._action_rows = module.select_rows(self.frame_start, frames, self.keyboard, self.mouse, dtype,
                                                   self.first_row)
        return self._action_rows


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a gain, computed in float32 (Wan's WanRMSNorm, spec §5.1).

    Split across processes (``generate --split-heads``, :func:`~worldtrace_cli.engine.shard.split_heads`):
    each process holds a slice of the D channels (its heads) and of the gain, and the mean square is over
    all D: the slices' sums of squares are all-reduced over :attr:`group` (float32), then divided by
    :attr:`full_dim`. ``group`` None: every channel is here.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.group, self.full_dim = None, dim

    def forward(self, x):
        """x [..., D] (or this process's slice of D) any float dtype -> same shape and dtype."""
        xf = x.float()
        if self.group is None:
            mean_square = xf.pow(2).mean(-1, keepdim=True)
        else:
            mean_square = xf.pow(2).sum(-1, keepdim=True)
            torch.distributed.all_reduce(mean_square, group=self.group)
            mean_square = mean_square / self.full_dim
        return (xf * torch.rsqrt(mean_square + self.eps)).type_as(x) * self.weight


class FloatLayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 and cast back (Wan's WanLayerNorm); affine parameters are
    upcast too, so a bf16 model normalises in float32 like an fp32 one."""

    def forward(self, x):
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).type_as(x)


class _Projections(nn.Module):
    """q, k, v, o Linear(D, D) with bias and RMSNorm of q and k over all heads (Wan attention, spec §3)."""

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = RMSNorm(dim, eps), RMSNorm(dim, eps)


class SelfAttention(_Projections):
    """Causal self-attention of a block over [past slots | current chunk] (spec §5.1, docs/architecture.md §3).

    Split in two so the pure tensor part can be compiled (:func:`compile_blocks`): :meth:`project`
    (projections, norms, RoPE) and :meth:`attend` (the chunk's K/V buffer and SDPA, eager).
    """

    def project(self, x, cos, sin, t_ch: int, commit: bool):
        """x [1, n, D] (modulated, normed tokens) -> (q, k, v, k_canon), each [1, n, H, d].

        ``cos``/``sin`` [n, d/2] from :meth:`MainRope.chunk_tables`: q and k come back rotated on
        every channel pair (temporal offsets within the chunk, height, width); ``k_canon`` is the
        canonical key (spatial pairs only, the first ``t_ch`` channels untouched) on the context
        pass (``commit``), else None. Arithmetic of the rotation in ``cos.dtype``.
        """
        b, n, _ = x.shape
        q = self.norm_q(self.q(x)).view(b, n, self.heads, -1)
        k = self.norm_k(self.k(x)).view(b, n, self.heads, -1)
        v = self.v(x).view(b, n, self.heads, -1)
        k_canon = rotate_channels(k, cos[:, t_ch // 2:], sin[:, t_ch // 2:], t_ch) if commit else None
        return rotate_channels(q, cos, sin, 0), rotate_channels(k, cos, sin, 0), v, k_canon

    @staticmethod
    def attend(q, k, v, layer: int, chunk: ChunkInputs, rope: MainRope):
        """SDPA of q [1, n, H, d] over this layer's [past slots | current chunk] buffer -> [1, n, H*d].

        The buffer (:meth:`ChunkInputs.kv_buffer`) holds the past slots rotated once per chunk; the current
        chunk's rotated k and its v go to its tail, less its first ``chunk.query_only_tokens`` tokens (a
        re-cache call's query-only frames). A probe in ``chunk.attention`` measures the q and buffer SDPA reads.
        """
        b, n, h, d = q.shape
        skip = chunk.query_only_tokens
        kbuf, vbuf = chunk.kv_buffer(layer, rope, n - skip, k.dtype, b)
        kbuf[:, kbuf.shape[1] - (n - skip):] = k[:, skip:]
        vbuf[:, vbuf.shape[1] - (n - skip):] = v[:, skip:]
        if chunk.attention is not None:  # --attention-stats: the shares of the buffer SDPA reads, per slot
            chunk.attention.observe(layer, q, kbuf, vbuf, n - skip)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kbuf.transpose(1, 2), vbuf.transpose(1, 2))
        return out.transpose(1, 2).reshape(b, n, h * d)


class CrossAttention(_Projections):
    """i2v cross-attention on the projected CLIP tokens, no RoPE, no mask (spec §5.2)."""

    def context_kv(self, ctx):
        """Projected CLIP context [1, 257, D] -> (k, v) [1, H, 257, d], computed once per rollout."""
        b, m, _ = ctx.shape
        return (self.norm_k(self.k(ctx)).view(b, m, self.heads, -1).transpose(1, 2),
                self.v(ctx).view(b, m, self.heads, -1).transpose(1, 2))

    def forward(self, x, kv):
        """x [1, N, D] -> [1, N, D], attending to the context ``kv`` from :meth:`context_kv`."""
        b, n, _ = x.shape
        q = self.norm_q(self.q(x)).view(b, n, self.heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1])
        return self.o(out.transpose(1, 2).reshape(b, n, -1))  # -1: this process's heads under --split-heads


class Block(nn.Module):
    """CausalWanAttentionBlock (spec §5 step 4): modulated self-attn, cross-attn, action module, modulated FFN."""

    compile_parts = ("attention_inputs", "attention_outputs", "feed_forward")  # pure: model/speed.compile_blocks

    def __init__(self, cfg: DiTConfig, index: int):
        super().__init__()
        d = cfg.dim
        self.modulation = nn.Parameter(torch.zeros(1, 6, d))
        self.norm1 = FloatLayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.norm2 = FloatLayerNorm(d, eps=cfg.eps, elementwise_affine=False)
        self.norm3 = FloatLayerNorm(d, eps=cfg.eps, elementwise_affine=True)
        self.self_attn = SelfAttention(d, cfg.num_heads, cfg.eps)
        self.cross_attn = CrossAttention(d, cfg.num_heads, cfg.eps)
        self.ffn = nn.Sequential(nn.Linear(d, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, d))
        self.action_model = (ActionModule(cfg.action_config, d, cfg.local_attn_size)
                             if index in cfg.action_config.blocks else None)

    def forward(self, x, e0, layer, chunk, rope, grid, commit):
        """x [1, F*S, D], e0 [1, F, 6, D] (time projection) -> (x' [1, F*S, D], kv) (spec §5 step 4).

        ``kv``: with ``commit`` the chunk's canonical (k, v) [1, F*S, H, d] for the cache writer, else None.
        """
        f, gh, gw = grid
        cos, sin = chunk.rope_tables(rope, f, gh, gw, x.device)
        m = self.modulation_terms(e0)
        q, k, v, k_canon = self.attention_inputs(x, m, cos, sin, rope.t_ch, commit)
        # the writer copies what it keeps (CacheWriter.commit), so CUDA-graph outputs are safe to hand out
        kv = (k_canon, v) if commit else None
        attn = self.self_attn.attend(q, k, v, layer, chunk, rope)
        x = self.attention_outputs(x, attn, m, chunk.rollout.cross_kv.get(layer, self.cross_attn))
        if self.action_model is not None:
            x = self.action_model(x, chunk.action_rows(self.action_model, f, x.dtype),
                                  chunk.rollout.mouse_kv[layer], chunk.rollout.keyboard_kv[layer], commit)
        return self.feed_forward(x, m), kv

    def modulation_terms(self, e0):
        """e0 [1, F, 6, D] (time projection) -> six float32 [1, F, 1, D]: shift/scale/gate of the
        self-attention, then of the FFN (spec §5 step 4); computed once per block call."""
        return (self.modulation.float().unsqueeze(1) + e0.float()).chunk(6, dim=2)

    @staticmethod
    def _modulate(h, shift, scale, like):
        b, n, d = h.shape
        f = shift.shape[1]
        return (h.view(b, f, -1, d).float() * (1 + scale) + shift).view(b, n, d).type_as(like)

    @staticmethod
    def _gate(y, g, like):
        b, n, d = y.shape
        return (y.view(b, g.shape[1], -1, d).float() * g).view(b, n, d).type_as(like)

    def attention_inputs(self, x, m, cos, sin, t_ch: int, commit: bool):
        """Pure: norm1 + modulation, then :meth:`SelfAttention.project`.

        x [1, F*S, D], m (:meth:`modulation_terms`), cos/sin [F*S, d/2] (chunk RoPE tables)
        -> (q, k, v, k_canon) [1, F*S, H, d] in x's dtype (k_canon None unless ``commit``). Spec §5 step 4.
        """
        return self.self_attn.project(self._modulate(self.norm1(x), m[0], m[1], x), cos, sin, t_ch, commit)

    def attention_outputs(self, x, attn, m, cross_kv):
        """Pure: output projection, gated residual, then the cross-attention residual (spec §5 step 4).

        x [1, F*S, D], attn [1, F*S, D] (SDPA output), m (:meth:`modulation_terms`), cross_kv (k, v) [1, H, 257, d]
        -> [1, F*S, D] in x's dtype.
        """
        x = x + self._gate(self.self_attn.o(attn), m[2], x)
        return x + self.cross_attn(self.norm3(x), cross_kv)

    def feed_forward(self, x, m):
        """Pure: norm2 + modulation, FFN, gated residual (spec §5 step 4): x [1, F*S, D], m
        (:meth:`modulation_terms`) -> [1, F*S, D] in x's dtype."""
        return x + self._gate(self.ffn(self._modulate(self.norm2(x), m[3], m[4], x)), m[5], x)


class Head(nn.Module):
    """Output head (spec §5 step 5): modulated LayerNorm then Linear(D -> 16*1*2*2)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(1, 2, cfg.dim))
        self.norm = FloatLayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, cfg.out_dim * 4)

    def forward(self, x, e, frames):
        """x [1, F*S, D], e [1, F, D] (time embedding) -> [1, F, S, 64] (patch outputs, spec §5 step 5)."""
        b, n, d = x.shape
        shift, scale = (self.modulation.float().unsqueeze(1) + e.float().unsqueeze(2)).chunk(2, dim=2)
        h = (self.norm(x).view(b, frames, -1, d).float() * (1 + scale) + shift).type_as(x)
        return self.head(h)  # [B, F, S, 64]


class MLPProj(nn.Module):
    """img_emb: LayerNorm . Linear . GELU . Linear . LayerNorm on the CLIP tokens (spec §3)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim, eps=1e-5), nn.Linear(in_dim, in_dim), nn.GELU(),
                                  nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim, eps=1e-5))

    def forward(self, x):
        """CLIP tokens [1, 257, clip_dim] -> [1, 257, D]."""
        return self.proj(x)


def sinusoidal_embedding(dim: int, t: torch.Tensor) -> torch.Tensor:
    """Timestep sinusoid [N, dim] float64: ``[cos(t*w_k) | sin(t*w_k)]``, ``w_k = 10000**(-k/(dim/2))`` (spec §5.2)."""
    half = torch.arange(dim // 2, dtype=torch.float64, device=t.device)
    return torch.cat([(ang := torch.outer(t.to(torch.float64), 10000.0 ** (-half / (dim // 2)))).cos(), ang.sin()], 1)


def patch_tokens(patch_embedding: nn.Conv3d, latent_hw: tuple[int, int]) -> int:
    """Tokens of one latent frame of grid ``latent_hw`` (lh, lw latent cells): cells / the patch
    embedding's spatial kernel, (1, 2, 2) for Wan 2.1."""
    _, ph, pw = patch_embedding.kernel_size
    return (latent_hw[0] // ph) * (latent_hw[1] // pw)


class CausalWanDiT(nn.Module):
    """MG2's CausalWanModel for chunked inference (spec §3, §5).

    Args:
        cfg: :class:`DiTConfig`. Inference runs batch 1 (spec §16.3); training may stack B clips
            whose chunks sit at the same latent frames (one ``frame_start``, past slots at the same
            positions): every tensor below is then [B, ...] instead of [1, ...].
    """

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_dim, d, kernel_size=(1, 2, 2), stride=(1, 2, 2))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.img_emb = MLPProj(cfg.clip_dim, d)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.head = Head(cfg)
        self.rope = MainRope(cfg.head_dim)
        self.compile_mode = "none"  # see compile_blocks
        self.cudagraphs = False

    @property
    def patch_size(self) -> tuple[int, int, int]:
        return tuple(self.patch_embedding.kernel_size)  # (time, height, width) latent cells per token: (1, 2, 2)

    def tokens_per_frame(self, latent_hw: tuple[int, int]) -> int:
        """Tokens of one latent frame of grid ``latent_hw`` (:func:`patch_tokens`)."""
        return patch_tokens(self.patch_embedding, latent_hw)

    def new_rollout_state(self) -> RolloutState:
        """Fresh action caches and cross-attention cache for a new rollout."""
        return RolloutState(self.cfg.num_layers)

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, cond_concat: torch.Tensor,
                chunk: ChunkInputs, commit: bool = False) -> torch.Tensor:
        """One DiT call on a chunk.

        Args:
            x: noisy latents [1, 16, F, Hl, Wl] (any float dtype; cast to the weights' dtype).
            timestep: [1, F] float timesteps (e.g. 908.8427; 0 on the context pass).
            cond_concat: [1, 20, F, Hl, Wl] mask + image-latent channels (spec §12).
            chunk: the chunk's :class:`ChunkInputs` (past slots, action rows, caches).
            commit: context pass: also return every layer's canonical K/V and push the action caches.
        Returns:
            flow prediction v [1, 16, F, Hl, Wl] in the weights' dtype (spec §5 step 6); with ``commit``
            ``(v, committed)`` where ``committed`` lists per layer (canonical k, v) [1, F*T, H, D]
            for :meth:`~worldtrace_cli.memory.CacheWriter.commit`.
        """
        dtype = self.patch_embedding.weight.dtype
        b, _, f, hl, wl = x.shape
        h = self.patch_embedding(torch.cat([x, cond_concat], dim=1).to(dtype))
        gh, gw = h.shape[-2:]
        h = h.flatten(2).transpose(1, 2)  # [B, F*S, D], tokens (f, i, j)
        e = self.time_embedding(sinusoidal_embedding(self.cfg.freq_dim, timestep.flatten()).to(dtype))
        e0 = self.time_projection(e).view(b, f, 6, -1)
        e = e.view(b, f, -1)
        if chunk.rollout.cross_kv is None:
            chunk.rollout.cross_kv = ContextKV(self.img_emb(chunk.visual_context.to(dtype)), len(self.blocks))
        grid = (f, gh, gw)
        if self.cudagraphs and h.is_cuda:
            torch.compiler.cudagraph_mark_step_begin()  # the previous call's graph outputs are dead now
        committed = []
        for i, block in enumerate(self.blocks):
            h, kv = block(h, e0, i, chunk, self.rope, grid, commit)
            committed.append(kv)
        out = self.head(h, e, f)  # [B, F, S, 64], channels ordered (ph, pw, c)
        flow = out.view(b, f, gh, gw, 2, 2, -1).permute(0, 6, 1, 2, 4, 3, 5).reshape(b, -1, f, 2 * gh, 2 * gw)
        return (flow, committed) if commit else flow


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int) -> None:
    """Seeded random weights with the golden fixtures' draw scheme (fixtures README, "Weights").

    ``modulation`` N(0,1)/sqrt(dim); 1-D biases 0.1*N(0,1); 1-D norm gains 1 + 0.1*N(0,1);
    matrices and kernels N(0,1)/sqrt(fan_in). Draws use a private generator (global RNG untouched)
    in float32 on the CPU, then are copied to the parameter's device and dtype.
    """
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if name.endswith("modulation"):
            val = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
        elif p.ndim == 1 and name.endswith("bias"):
            val = 0.1 * torch.randn(shape, generator=gen)
        elif p.ndim == 1:
            val = 1 + 0.1 * torch.randn(shape, generator=gen)
        else:
            val = torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))
        p.copy_(val)
