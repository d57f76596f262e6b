"""MG2 keyboard/mouse action module (MG2 spec §8), with its own verbatim sliding caches.

The action caches hold canonical keys (action RoPE not applied) and are rotated at read time at
positions relative to the current chunk, so they work at any horizon; otherwise they behave as
MG2's: a window of ``local_attn_size`` latent frames including the current chunk.
Inference runs batch 1 (spec §16.3); training may stack B clips that share their chunk's latent
frames (same ``frame_start``): every clip then has its own action rows and caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import ActionConfig
from .rope import action_rope_tables, apply_action_rope


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS-normalise the last dim without a gain (the stored action RMSNorm gains are unused, spec §16.4)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@dataclass
class ActionKV:
    """Past (committed) canonical keys and values of one action branch of one block.

    ``k``/``v``: [N, P, H_a, d_a] with N = B * spatial tokens (mouse) or B (keyboard), clip-major,
    for a batch of B clips (B = 1 at inference), and P <= window - F past latent frames; ``None``
    before the first chunk is committed.
    """

    k: torch.Tensor | None = None
    v: torch.Tensor | None = None

    @property
    def frames(self) -> int:
        return 0 if self.k is None else self.k.shape[1]


def _window_attention(q, k_cur, v_cur, past_k, past_v, tables):
    """Attend F query frames to [past | current] frames.

    q [N, F, H, d] (or any [..., F, H, d] whose leading dims flatten to N: a transposed view is
    fine, the rotation makes it contiguous); k_cur/v_cur [G, F, H, d] with G = N (mouse: one key set per query row) or G = B
    (keyboard: one key set per clip shared by the clip's N/B rows, which are consecutive, attended
    once for all of them instead of being copied; attention has no mask, so this is the same
    result); ``past_k``/``past_v``
    [G, P, H, d] canonical (rotated here) or None; ``tables`` = (cos, sin) [F, 4] of the current
    offsets 0..F-1 and (cos, sin) [P, 4] of the past offsets -P..-1 (:func:`action_rope_tables`).
    Returns [N, F, H, d].
    """
    cos_c, sin_c, cos_p, sin_p = tables
    q = apply_action_rope(q, cos_c, sin_c).flatten(0, -4)  # [N, F, H, d], contiguous after the rotation
    k_all, v_all = apply_action_rope(k_cur, cos_c, sin_c), v_cur
    if past_k is not None:
        k_all = torch.cat([apply_action_rope(past_k, cos_p, sin_p), k_all], dim=1)
        v_all = torch.cat([past_v, v_all], dim=1)
    groups = k_all.shape[0]
    q_grouped = q.reshape(groups, -1, *q.shape[2:])  # [G, N/G*F, H, d]
    out = F.scaled_dot_product_attention(q_grouped.transpose(1, 2), k_all.transpose(1, 2), v_all.transpose(1, 2))
    return out.transpose(1, 2).reshape(q.shape)


def _tables(frames: int, past: int, device):
    """Action-RoPE tables of the current offsets 0..frames-1 and the past offsets -past..-1."""
    return (*action_rope_tables(range(frames), device), *action_rope_tables(range(-past, 0), device))


class ActionModule(nn.Module):
    """Keyboard (and optionally mouse) conditioning added inside a DiT block (spec §8).

    Parameter names follow the official checkpoint (``blocks.{i}.action_model.*``).
    """

    compile_parts = ("mouse_part", "keyboard_part")  # pure tensor parts: model/speed.compile_blocks

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

    def select_rows(self, frame_start: int, num_frames: int, keyboard: torch.Tensor,
                    mouse: torch.Tensor | None, dtype, first_row: int = 0) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The action rows a chunk reads (the same for every block and call of the chunk).

        Args:
            frame_start: absolute latent-frame index of the chunk's first frame.
            num_frames: F, latent frames in the chunk.
            keyboard: [B, R, keyboard_dim_in] action rows (pixel frames) ``first_row ..`` covering at least
                the rows this chunk reads (up to row 4*(frame_start+F) - 5; any longer run works).
            mouse: [B, R, 2] or None (keyboard-only models).
            first_row: the absolute pixel-frame index of row 0 of ``keyboard`` / ``mouse`` (a live chunk
                gets only the rows it reads: :class:`~worldtrace_cli.engine.feed.ChunkRequest`).
        Returns:
            (mouse rows [B, F, 24] or None when the mouse branch is off, keyboard rows
            [B, F, 12, kd]) in ``dtype``.
        Raises:
            ValueError: ``keyboard`` or ``mouse`` holds fewer rows than the chunk reads (checked on the
                host: on a GPU an out-of-range row is otherwise a device-side assert that poisons the
                process's CUDA context).
        """
        last_row = max(self.cfg.vae_time_compression_ratio * (frame_start + num_frames - 1) - 1, 0)
        for name, rows in (("keyboard", keyboard), ("mouse", mouse if self.cfg.enable_mouse else None)):
            if rows is not None and last_row >= first_row + rows.shape[1]:
                given = f"only {rows.shape[1]} rows were" if not first_row else \
                    f"only rows {first_row}..{first_row + rows.shape[1] - 1} were"
                raise ValueError(f"latent frames {frame_start}..{frame_start + num_frames - 1} read {name} action "
                                 f"rows up to {last_row}, but {given} given (need at least {last_row + 1})")
        first_read = max(self.cfg.vae_time_compression_ratio * frame_start - self.cfg.window_rows, 0)  # host arithmetic
        if first_read < first_row:
            raise ValueError(f"latent frames {frame_start}..{frame_start + num_frames - 1} read action rows from "
                             f"{first_read}, before the first row given ({first_row})")
        idx = self._row_index(frame_start, num_frames, keyboard.device) - first_row  # [F, 12]
        mouse_rows = None
        if self.cfg.enable_mouse and mouse is not None:
            mouse_rows = mouse[:, idx].reshape(mouse.shape[0], num_frames, -1).to(dtype)
        return mouse_rows, keyboard[:, idx].to(dtype)

    def forward(self, x: torch.Tensor, rows: tuple[torch.Tensor | None, torch.Tensor], mouse_kv: ActionKV,
                keyboard_kv: ActionKV, commit: bool = False) -> torch.Tensor:
        """Add the mouse and keyboard terms to the block's tokens.

        Args:
            x: [B, F*S, D] tokens in (frame, row, col) order (B = 1 at inference).
            rows: :meth:`select_rows` of this chunk.
            mouse_kv, keyboard_kv: this block's committed action caches; updated in place when ``commit``.
            commit: push this call's keys/values into the caches (the context pass).
        Returns:
            [B, F*S, D]: ``x + proj_mouse(mouse attn) + proj_keyboard(keyboard attn)``.
        """
        mouse_rows, keyboard_rows = rows
        f = keyboard_rows.shape[1]
        keep = self.window_frames - f
        if mouse_rows is not None:
            x, k, v = self.mouse_part(x, mouse_rows, mouse_kv.k, mouse_kv.v, _tables(f, mouse_kv.frames, x.device))
            if commit:
                _push(mouse_kv, k, v, keep)
        x, k, v = self.keyboard_part(x, keyboard_rows, keyboard_kv.k, keyboard_kv.v,
                                     _tables(f, keyboard_kv.frames, x.device))
        if commit:
            _push(keyboard_kv, k, v, keep)
        return x

    def mouse_part(self, x, rows, past_k, past_v, tables):
        """Pure: the mouse term. x [B, F*S, D], rows [B, F, 24] (the mouse rows each frame reads),
        past_k/past_v [B*S, P, H, d] or None -> (x + proj_mouse(attn), k, v), k/v [B*S, F, H, d] canonical."""
        b, n, d = x.shape
        f = rows.shape[1]
        s = n // f
        h = self.heads
        feat = torch.cat([x.view(b, f, s, d), rows[:, :, None, :].expand(b, f, s, -1)], dim=-1)
        feat = self.mouse_mlp(feat.transpose(1, 2)).flatten(0, 1)         # [B*S, F, C]: the MLP's output is contiguous
        q, k, v = self.t_qkv(feat).view(b * s, f, 3, h, -1).unbind(2)      # [B*S, F, H, d]
        q, k = _rms(q), _rms(k)
        out = _window_attention(q, k, v, past_k, past_v, tables)           # [B*S, F, H, d]
        return x + self.proj_mouse(out.view(b, s, f, -1).transpose(1, 2).reshape(b, n, -1)), k, v

    def keyboard_part(self, x, rows, past_k, past_v, tables):
        """Pure: the keyboard term. x [B, F*S, D], rows [B, F, 12, keyboard_dim_in], past_k/past_v
        [B, P, H, d] or None -> (x + proj_keyboard(attn), k, v), k/v [B, F, H, d] canonical."""
        b, n, _ = x.shape
        f = rows.shape[1]
        s = n // f
        h = self.heads
        emb = self.keyboard_embed(rows)                                        # [B, F, 12, hidden]
        kv = self.keyboard_attn_kv(emb.reshape(b, f, -1))                      # [B, F, 2C]
        k, v = kv.view(b, f, 2, h, -1).unbind(2)
        k = _rms(k)
        q = _rms(self.mouse_attn_q(x).view(b, f, s, h, -1)).transpose(1, 2)  # [B, S, F, H, d] (a view)
        out = _window_attention(q, k, v, past_k, past_v, tables)              # a clip's keys shared by its S rows
        return x + self.proj_keyboard(out.view(b, s, f, -1).transpose(1, 2).reshape(b, n, -1)), k, v


def _push(cache: ActionKV, k: torch.Tensor, v: torch.Tensor, keep: int) -> None:
    """Append the chunk's canonical k/v [N, F, H, d] and keep the newest ``keep`` frames.

    The kept frames are always fresh tensors with standard strides: a compiled part sees the same
    strides every chunk (no recompiles), and nothing kept aliases a CUDA-graph output.
    """
    if cache.k is not None:
        k, v = torch.cat([cache.k, k], dim=1), torch.cat([cache.v, v], dim=1)
    start = max(0, k.shape[1] - keep)
    cache.k = k[:, start:].clone(memory_format=torch.contiguous_format)
    cache.v = v[:, start:].clone(memory_format=torch.contiguous_format)
