"""MG2 keyboard/mouse action module (MG2 spec §8), with its own verbatim sliding caches.

The action caches hold canonical keys (action RoPE not applied) and are rotated at read time at
positions relative to the current chunk, so they work at any horizon; otherwise they behave as
MG2's: a window of ``local_attn_size`` latent frames including the current chunk.
Batch size must be 1 (the keyboard cache is shared by all spatial tokens, spec §16.3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ActionConfig
from .rope import action_rope


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS-normalise the last dim without a gain (the stored action RMSNorm gains are unused, spec §16.4)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@dataclass
class ActionKV:
    """Past (committed) canonical keys and values of one action branch of one block.

    ``k``/``v``: [N, P, H_a, d_a] with N = spatial tokens (mouse) or 1 (keyboard) and P <= window - F
    past latent frames; ``None`` before the first chunk is committed.
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def frames(self) -> int:
        return 0 if self.k is None else self.k.shape[1]


def _window_attention(q, k_cur, v_cur, past: ActionKV):
    """Attend F query frames to [past | current] frames. q/k/v: [N, F, H, d]; past rotated here."""
    p = past.frames
    f = q.shape[1]
    pos_cur = torch.arange(f, dtype=torch.float32)
    q = action_rope(q, pos_cur)
    k_cur = action_rope(k_cur, pos_cur)
    if p:
        k_past = action_rope(past.k.expand(k_cur.shape[0], -1, -1, -1), torch.arange(-p, 0, dtype=torch.float32))
        k_all = torch.cat([k_past, k_cur], dim=1)
        v_all = torch.cat([past.v.expand(v_cur.shape[0], -1, -1, -1), v_cur], dim=1)
    else:
        k_all, v_all = k_cur, v_cur
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2))
    return out.transpose(1, 2)  # [N, F, H, d]


class ActionModule(nn.Module):
    """Keyboard (and optionally mouse) conditioning added inside a DiT block (spec §8).

    Parameter names follow the official checkpoint (``blocks.{i}.action_model.*``).
    """

    def __init__(self, cfg: ActionConfig, dim: int, window_frames: int):
        super().__init__()
        self.cfg = cfg
        self.window_frames = window_frames  # local_attn_size: cached frames incl. the current chunk
        self.heads = cfg.heads_num
        rows = cfg.window_rows
        self.keyboard_embed = nn.Sequential(nn.Linear(cfg.keyboard_dim_in, cfg.hidden_size), nn.SiLU(),
                                            nn.Linear(cfg.hidden_size, cfg.hidden_size))
        if cfg.enable_mouse:
            c = cfg.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(nn.Linear(dim + cfg.mouse_dim_in * rows, c), nn.GELU(approximate="tanh"),
                                           nn.Linear(c, c), nn.LayerNorm(c, eps=1e-5))
            self.t_qkv = nn.Linear(c, 3 * c, bias=False)
            self.img_attn_q_norm = nn.RMSNorm(c // cfg.heads_num, eps=1e-6)
            self.img_attn_k_norm = nn.RMSNorm(c // cfg.heads_num, eps=1e-6)
            self.proj_mouse = nn.Linear(c, dim, bias=False)
        ck = cfg.keyboard_hidden_dim
        self.key_attn_q_norm = nn.RMSNorm(ck // cfg.heads_num, eps=1e-6)
        self.key_attn_k_norm = nn.RMSNorm(ck // cfg.heads_num, eps=1e-6)
        self.mouse_attn_q = nn.Linear(dim, ck, bias=False)
        self.keyboard_attn_kv = nn.Linear(cfg.hidden_size * rows, 2 * ck, bias=False)
        self.proj_keyboard = nn.Linear(ck, dim, bias=False)

    def _row_index(self, frame_start: int, num_frames: int, device) -> torch.Tensor:
        """Row indices [F, 12] read by each latent frame: rows 4f-12 .. 4f-1 clamped at 0 (spec §8, §16.8)."""
        r = self.cfg.vae_time_compression_ratio
        f = torch.arange(frame_start, frame_start + num_frames, device=device)[:, None]
        return (r * f - self.cfg.window_rows + torch.arange(self.cfg.window_rows, device=device)).clamp(min=0)

    def forward(self, x: torch.Tensor, grid_tokens: int, frame_start: int, keyboard: torch.Tensor,
                mouse: torch.Tensor | None, mouse_kv: ActionKV, keyboard_kv: ActionKV,
                commit: bool = False) -> torch.Tensor:
        """Add the mouse and keyboard terms to the block's tokens.

        Args:
            x: [1, F*S, D] tokens in (frame, row, col) order, S = ``grid_tokens``.
            frame_start: absolute latent-frame index of the chunk's first frame (selects action rows).
            keyboard: [1, R, keyboard_dim_in] action rows (pixel frames) covering at least the rows
                this chunk reads (rows < 4*(frame_start+F) - 1 ... any longer prefix works).
            mouse: [1, R, 2] or None (keyboard-only models).
            mouse_kv, keyboard_kv: this block's committed action caches; updated in place when ``commit``.
            commit: push this call's keys/values into the caches (the context pass).
        Returns:
            [1, F*S, D]: ``x + proj_mouse(mouse attn) + proj_keyboard(keyboard attn)``.
        """
        b, n, d = x.shape
        s = grid_tokens
        f = n // s
        h = self.heads
        window = self.window_frames
        idx = self._row_index(frame_start, f, x.device)  # [F, 12]
        if self.cfg.enable_mouse and mouse is not None:
            rows = mouse[0, idx].reshape(f, -1).to(x.dtype)                     # [F, 24]
            feat = torch.cat([x.view(f, s, d), rows[:, None, :].expand(f, s, -1)], dim=-1)
            feat = self.mouse_mlp(feat.transpose(0, 1))                        # [S, F, C]
            q, k, v = self.t_qkv(feat).view(s, f, 3, h, -1).unbind(2)          # [S, F, H, d]
            q, k = _rms(q), _rms(k)
            out = _window_attention(q, k, v, mouse_kv)                         # [S, F, H, d]
            x = x + self.proj_mouse(out.transpose(0, 1).reshape(1, n, -1))
            if commit:
                _push(mouse_kv, k, v, window - f)
        emb = self.keyboard_embed(keyboard[0, idx].to(x.dtype))                # [F, 12, hidden]: rows read only
        kv = self.keyboard_attn_kv(emb.reshape(1, f, -1))                      # [1, F, 2C]
        k, v = kv.view(1, f, 2, h, -1).unbind(2)
        k = _rms(k)
        q = _rms(self.mouse_attn_q(x).view(f, s, h, -1)).transpose(0, 1)       # [S, F, H, d]
        out = _window_attention(q, k.expand(s, -1, -1, -1), v.expand(s, -1, -1, -1), keyboard_kv)
        x = x + self.proj_keyboard(out.transpose(0, 1).reshape(1, n, -1))
        if commit:
            _push(keyboard_kv, k, v, window - f)
        return x


def _push(cache: ActionKV, k: torch.Tensor, v: torch.Tensor, keep: int) -> None:
    """Append the chunk's canonical k/v [N, F, H, d] and keep the newest ``keep`` frames."""
    if cache.k is not None:
        k, v = torch.cat([cache.k, k], dim=1), torch.cat([cache.v, v], dim=1)
    cache.k, cache.v = k[:, max(0, k.shape[1] - keep):].contiguous(), v[:, max(0, v.shape[1] - keep):].contiguous()
