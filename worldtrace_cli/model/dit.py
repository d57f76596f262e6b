"""The MG2 causal Wan-2.1 DiT, inference path only (MG2 spec §3-§9), reading an explicit KV-cache view.

Parameter names are the official checkpoint's (without the ``model.`` prefix), so an official
state dict loads strictly. The self-attention does not own a cache: each chunk the caller hands
it, per layer, the past slots as *canonical keys* (spatial RoPE applied, temporal RoPE not) with
one virtual temporal position per slot (:class:`LayerPast`). The DiT rotates each slot once per
chunk into a preallocated ``[past slots | current chunk]`` buffer and reuses it across the
denoising steps and the context pass. On the context pass (``commit=True``) it returns the chunk's
canonical keys and values for the cache writer to store (design.md §3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .action import ActionKV, ActionModule
from .config import DiTConfig
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


@dataclass
class RolloutState:
    """Per-rollout model state outside the self-attention cache: the cross-attention K/V of the
    constant CLIP context (computed on the first call, spec §5.2) and the action caches (spec §8)."""

    num_layers: int
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    mouse_kv: list[ActionKV] = field(default_factory=list)
    keyboard_kv: list[ActionKV] = field(default_factory=list)

    def __post_init__(self):
        self.mouse_kv = [ActionKV() for _ in range(self.num_layers)]
        self.keyboard_kv = [ActionKV() for _ in range(self.num_layers)]


@dataclass
class ChunkInputs:
    """Everything fixed across one chunk's DiT calls (denoising steps and context pass).

    Attributes:
        rollout: the rollout's :class:`RolloutState`.
        past: per layer the :class:`LayerPast` the writer returned for this chunk.
        frame_start: absolute latent-frame index of the chunk's first frame (selects action rows).
        keyboard: [1, R, keyboard_dim] action rows (pixel frames), R >= 4*(frame_start+F)-3.
        mouse: [1, R, 2] or None.
        visual_context: [1, 257, clip_dim] CLIP tokens.
        committed: filled on the context pass: per layer (canonical k, v) [1, F*T, H, D].
        temporal_freq_scale: optional [t_ch/2] multipliers of the temporal RoPE frequencies for
            this chunk's queries and keys (YaRN); None = MG2's frequencies.
    """

    rollout: RolloutState
    past: list[LayerPast]
    frame_start: int
    keyboard: torch.Tensor
    mouse: torch.Tensor | None
    visual_context: torch.Tensor
    committed: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    temporal_freq_scale: torch.Tensor | None = None
    _buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    _angles: tuple | None = None

    def current_angles(self, rope: MainRope, frames: int, tokens_per_frame: int, device):
        """Temporal RoPE cos/sin of the current chunk's tokens (offsets 0..F-1), on ``device``,
        computed once per chunk and reused by every layer, step and the context pass."""
        if self._angles is None:
            pos = torch.arange(frames, dtype=torch.float64).repeat_interleave(tokens_per_frame)
            cos, sin = rope.temporal_angles(pos, self.temporal_freq_scale)
            self._angles = (pos, (cos.to(device), sin.to(device)))
        return self._angles

    def kv_buffer(self, layer: int, rope: MainRope, current_tokens: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[past rotated | room for the current chunk] K and V buffers [1, L+n, H, D], made once per chunk."""
        if layer not in self._buffers:
            p = self.past[layer]
            b, length, h, d = p.k.shape
            kbuf = p.k.new_empty((b, length + current_tokens, h, d), dtype=dtype)
            vbuf = torch.empty_like(kbuf)
            if length:
                rope.rotate_slots(p.k, p.positions, self.temporal_freq_scale, out=kbuf[:, :length])
                vbuf[:, :length] = p.v
            self._buffers[layer] = (kbuf, vbuf)
        return self._buffers[layer]


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a gain, computed in float32 (Wan's WanRMSNorm, spec §5.1)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        """x [..., D] any float dtype -> same shape and dtype."""
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


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
    """Causal self-attention of a block over [past slots | current chunk] (spec §5.1, design §3)."""

    def forward(self, x, layer: int, chunk: ChunkInputs, rope: MainRope, grid: tuple[int, int, int], commit: bool):
        """x [1, F*S, D] (modulated, normed tokens) -> [1, F*S, D] after the output projection.

        ``grid`` = (F, h, w) with S = h*w. Attends over this layer's [past slots | current chunk]
        buffer; with ``commit`` appends this chunk's canonical (k, v) [1, F*S, H, d] to ``chunk.committed``.
        """
        b, n, d = x.shape
        f, gh, gw = grid
        q = self.norm_q(self.q(x)).view(b, n, self.heads, -1)
        k = self.norm_k(self.k(x)).view(b, n, self.heads, -1)
        v = self.v(x).view(b, n, self.heads, -1)
        q = rope.apply_spatial(q, gh, gw)
        k = rope.apply_spatial(k, gh, gw)  # canonical keys: what the cache stores
        if commit:
            chunk.committed.append((k, v))
        pos, angles = chunk.current_angles(rope, f, gh * gw, x.device)
        rope.apply_temporal(q, pos, angles=angles, out=q)  # q is this call's own tensor: rotate in place
        kbuf, vbuf = chunk.kv_buffer(layer, rope, n, k.dtype)
        rope.apply_temporal(k, pos, angles=angles, out=kbuf[:, -n:])  # k stays canonical for the commit
        vbuf[:, -n:] = v
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kbuf.transpose(1, 2), vbuf.transpose(1, 2))
        return self.o(out.transpose(1, 2).reshape(b, n, d))


class CrossAttention(_Projections):
    """i2v cross-attention on the projected CLIP tokens, no RoPE, no mask (spec §5.2)."""

    def context_kv(self, ctx):
        """Projected CLIP context [1, 257, D] -> (k, v) [1, H, 257, d], computed once per rollout."""
        b, m, _ = ctx.shape
        return (self.norm_k(self.k(ctx)).view(b, m, self.heads, -1).transpose(1, 2),
                self.v(ctx).view(b, m, self.heads, -1).transpose(1, 2))

    def forward(self, x, kv):
        """x [1, N, D] -> [1, N, D], attending to the context ``kv`` from :meth:`context_kv`."""
        b, n, d = x.shape
        q = self.norm_q(self.q(x)).view(b, n, self.heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1])
        return self.o(out.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    """CausalWanAttentionBlock (spec §5.4): modulated self-attn, cross-attn, action module, modulated FFN."""

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
        """x [1, F*S, D], e0 [1, F, 6, D] (time projection) -> [1, F*S, D] (spec §5.4)."""
        b, n, d = x.shape
        f = grid[0]
        m = (self.modulation.float().unsqueeze(1) + e0.float()).chunk(6, dim=2)  # six [B, F, 1, D]

        def modulate(h, shift, scale):
            return (h.view(b, f, -1, d).float() * (1 + scale) + shift).view(b, n, d).type_as(x)

        def gate(y, g):
            return (y.view(b, f, -1, d).float() * g).view(b, n, d).type_as(x)

        x = x + gate(self.self_attn(modulate(self.norm1(x), m[0], m[1]), layer, chunk, rope, grid, commit), m[2])
        x = x + self.cross_attn(self.norm3(x), chunk.rollout.cross_kv[layer])
        if self.action_model is not None:
            x = self.action_model(x, grid[1] * grid[2], chunk.frame_start, chunk.keyboard, chunk.mouse,
                                  chunk.rollout.mouse_kv[layer], chunk.rollout.keyboard_kv[layer], commit)
        x = x + gate(self.ffn(modulate(self.norm2(x), m[3], m[4])), m[5])
        return x


class Head(nn.Module):
    """Output head (spec §5.5): modulated LayerNorm then Linear(D -> 16*1*2*2)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(1, 2, cfg.dim))
        self.norm = FloatLayerNorm(cfg.dim, eps=cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(cfg.dim, cfg.out_dim * 4)

    def forward(self, x, e, frames):
        """x [1, F*S, D], e [1, F, D] (time embedding) -> [1, F, S, 64] (patch outputs, spec §5.5)."""
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
    half = dim // 2
    ang = torch.outer(t.to(torch.float64), 10000.0 ** (-torch.arange(half, dtype=torch.float64, device=t.device) / half))
    return torch.cat([ang.cos(), ang.sin()], dim=1)


class CausalWanDiT(nn.Module):
    """MG2's CausalWanModel for chunked inference (spec §3, §5).

    Args:
        cfg: :class:`DiTConfig`. Batch size is 1 (spec §16.3).
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
            commit: context pass: record canonical K/V in ``chunk.committed`` and push the action caches.
        Returns:
            flow prediction v [1, 16, F, Hl, Wl] in the weights' dtype (spec §5.6).
        """
        dtype = self.patch_embedding.weight.dtype
        b, _, f, hl, wl = x.shape
        if commit:
            chunk.committed.clear()
        h = self.patch_embedding(torch.cat([x, cond_concat], dim=1).to(dtype))
        gh, gw = h.shape[-2:]
        h = h.flatten(2).transpose(1, 2)  # [B, F*S, D], tokens (f, i, j)
        e = self.time_embedding(sinusoidal_embedding(self.cfg.freq_dim, timestep.flatten()).to(dtype))
        e0 = self.time_projection(e).view(b, f, 6, -1)
        e = e.view(b, f, -1)
        if chunk.rollout.cross_kv is None:
            ctx = self.img_emb(chunk.visual_context.to(dtype))
            chunk.rollout.cross_kv = [blk.cross_attn.context_kv(ctx) for blk in self.blocks]
        grid = (f, gh, gw)
        for i, block in enumerate(self.blocks):
            h = block(h, e0, i, chunk, self.rope, grid, commit)
        out = self.head(h, e, f)  # [B, F, S, 64], channels ordered (ph, pw, c)
        return out.view(b, f, gh, gw, 2, 2, -1).permute(0, 6, 1, 2, 4, 3, 5).reshape(b, -1, f, 2 * gh, 2 * gw)


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
