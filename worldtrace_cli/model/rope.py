"""Rotary position embeddings of MG2: the only module in worldtrace that does trigonometry.

Two RoPE families (MG2 spec §6):

* **Main self-attention RoPE** (head dim 128). Channel pairs (2p, 2p+1) are complex numbers.
  Pairs 0..21 (channels 0..43) are *temporal*, pairs 22..42 (channels 44..85) *height*, pairs
  43..63 (channels 86..127) *width*; each axis with n channels uses frequencies
  ``omega_j = 10000 ** (-2j / n)``. MG2 rotates in float64 and casts back (spec §16.6).
* **Action-module RoPE** (head dim 64, mouse and keyboard branches). Only channels 0..7 (four
  interleaved pairs, ``omega_j = 256 ** (-2j / 8)``) rotate, by the latent-frame index; computed
  in float32.

worldtrace splits the main RoPE into its spatial part (applied once, when keys are made: a
*canonical key* has spatial RoPE applied and temporal RoPE not applied) and its temporal part
(applied at read time at whatever *virtual position* the cache writer assigns). The axes use
disjoint channels, so the split is exact. Positions passed here are latent-frame offsets
relative to the first frame of the current chunk, so any horizon works (MG2's own 1024-entry
table would end a rollout at 1024 latent frames, spec §6.1).
"""

from __future__ import annotations

import torch

from .config import ACTION_ROPE_CHANNELS, ACTION_ROPE_THETA  # noqa: F401  (re-exported)

ROPE_THETA = 10000.0


def axis_channels(head_dim: int) -> tuple[int, int, int]:
    """Channels of the (temporal, height, width) axes for a head dim, e.g. 128 -> (44, 42, 42).

    Source: MG2 spec §6.1 (``d - 4*(d//6)`` temporal, ``2*(d//6)`` for each spatial axis).
    """
    spatial = 2 * (head_dim // 6)
    return head_dim - 2 * spatial, spatial, spatial


def frequencies(num_channels: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """Angular frequencies ``theta ** (-2j / n)`` of one axis: float64 [n/2] (radians per position)."""
    j = torch.arange(0, num_channels, 2, dtype=torch.float64, device="cpu")
    return theta ** (-j / num_channels)


def rotate_channels(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Functional RoPE: channels ``start:`` of ``x`` [B, L, H, D] rotated as interleaved pairs by
    per-token tables cos/sin [L, (D-start)/2]; channels before ``start`` unchanged.

    The arithmetic runs in ``cos.dtype`` and the result is cast back to ``x.dtype``. No in-place
    writes, so it fuses under ``torch.compile`` and records cleanly into CUDA graphs.
    """
    pairs = x[..., start:].unflatten(-1, (-1, 2)).to(cos.dtype)
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2).to(x.dtype)
    return rotated if start == 0 else torch.cat([x[..., :start], rotated], dim=-1)


def _rotate_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, start: int) -> None:
    """:func:`rotate_channels` written into ``out`` [B, L, H, D] (which may be ``x`` itself, or a
    slice of an attention buffer); cos/sin [L, (D-start)/2]."""
    out[..., start:] = rotate_channels(x[..., start:], cos, sin)
    if start and out is not x:
        out[..., :start] = x[..., :start]


class MainRope:
    """Main self-attention RoPE of one head dim (MG2 spec §6.1), split into spatial and temporal parts.

    Angles are always computed in float64; ``precision`` is the dtype of the cos/sin tables and of
    the rotation arithmetic. ``torch.float64`` (this class's default) is MG2's own (spec §16.6);
    runs use ``torch.float32`` unless told otherwise (``--rope-precision``,
    :func:`~worldtrace_cli.model.speed.configure_speed`), and both replay the golden fixtures; ``torch.float32`` keeps float64-accurate tables rounded once to float32,
    which is below bf16's resolution (a bf16 model's keys differ by at most one bf16 rounding step)
    and avoids float64 arithmetic on GPUs.

    Args:
        head_dim: per-head channels (128 for MG2).
        theta: RoPE base (10000).
        precision: torch.float64 or torch.float32.
    Raises:
        ValueError: another precision.
    """

    def __init__(self, head_dim: int = 128, theta: float = ROPE_THETA, precision: torch.dtype = torch.float64):
        self.head_dim = head_dim
        self.t_ch, self.h_ch, self.w_ch = axis_channels(head_dim)
        self.omega_t = frequencies(self.t_ch, theta)
        self.omega_h = frequencies(self.h_ch, theta)
        self.omega_w = frequencies(self.w_ch, theta)
        self.precision = precision
        self._spatial: dict = {}

    @property
    def precision(self) -> torch.dtype:
        """dtype of the cos/sin tables and of the rotation arithmetic."""
        return self._precision

    @precision.setter
    def precision(self, dtype: torch.dtype) -> None:
        if dtype not in (torch.float64, torch.float32):
            raise ValueError(f"RoPE precision must be float64 or float32, got {dtype}")
        self._precision = dtype

    def spatial_angles(self, height: int, width: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [height*width, (h_ch + w_ch)/2] in :attr:`precision` on ``device`` for tokens in
        row-major (i, j) order (memoised per grid, device and precision: every layer and call of a
        rollout reuses them)."""
        key = (height, width, str(device), self.precision)
        if key not in self._spatial:
            i = torch.arange(height, dtype=torch.float64, device="cpu").repeat_interleave(width)
            j = torch.arange(width, dtype=torch.float64, device="cpu").repeat(height)
            ang = torch.cat([torch.outer(i, self.omega_h), torch.outer(j, self.omega_w)], dim=1)
            self._spatial[key] = (ang.cos().to(device, self.precision), ang.sin().to(device, self.precision))
        return self._spatial[key]

    def temporal_angles(self, positions: torch.Tensor, freq_scale: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin float64 [L, t_ch/2] on the CPU for temporal positions [L] (latent frames, any real value).

        ``freq_scale`` [t_ch/2] multiplies the temporal frequencies (YaRN); None = MG2's own.
        """
        omega = self.omega_t if freq_scale is None else self.omega_t * freq_scale.to(torch.float64).cpu()
        ang = torch.outer(positions.to(torch.float64).cpu(), omega)
        return ang.cos(), ang.sin()

    def chunk_tables(self, frames: int, height: int, width: int, freq_scale: torch.Tensor | None = None,
                     device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [frames*height*width, head_dim/2] in :attr:`precision` on ``device``: every channel
        pair of the current chunk's tokens (temporal offsets 0..frames-1 from the chunk's first
        frame, then height, then width), so one pass rotates a query fully. Columns ``t_ch/2:`` are
        the spatial part alone (what makes a canonical key)."""
        pos = torch.arange(frames, dtype=torch.float64)
        t_cos, t_sin = self.temporal_angles(pos, freq_scale)
        s_cos, s_sin = self.spatial_angles(height, width, "cpu")
        tokens = height * width

        def table(t, s):
            return torch.cat([t.repeat_interleave(tokens, 0), s.to(torch.float64).repeat(frames, 1)], dim=1)

        return table(t_cos, s_cos).to(device, self.precision), table(t_sin, s_sin).to(device, self.precision)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int = 0,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate channels ``start:`` of ``x`` [B, L, H, D] by per-token tables cos/sin [L, (D-start)/2].

        Arithmetic in the tables' dtype, rounded to ``x.dtype`` (then copied into ``out``, which
        should have ``x``'s dtype). ``out`` may be ``x`` (in place) or a slice of an attention buffer.
        """
        if out is None:
            return rotate_channels(x, cos, sin, start)
        _rotate_into(x, cos, sin, out, start)
        return out

    def apply_spatial(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Rotate the height/width channels of ``x`` [B, F*height*width, H, D] (tokens (f, i, j) order).

        Computed in :attr:`precision` and cast back to ``x.dtype`` as MG2 does. Temporal channels are
        untouched, so the result is a canonical key (or a query still to be rotated temporally).
        """
        cos, sin = self.spatial_angles(height, width, x.device)
        frames = x.shape[1] // (height * width)
        return self.rotate(x, cos.repeat(frames, 1), sin.repeat(frames, 1), start=self.t_ch)

    def apply_temporal(self, x: torch.Tensor, token_positions: torch.Tensor | None,
                       freq_scale: torch.Tensor | None = None, angles=None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate the temporal channels of ``x`` [B, L, H, D] at ``token_positions`` [L] (latent frames).

        Rotation in :attr:`precision`, cast back to ``x.dtype``. Only the ``t_ch`` temporal channels
        are computed. ``angles``: precomputed per-token cos/sin [L, t_ch/2] (``temporal_angles`` or
        :meth:`slot_angles`), reused across calls; ``token_positions`` is then unused. ``out``: write the result there (it may be ``x`` itself, or a slice
        of an attention buffer) instead of a new tensor, saving a copy.
        """
        cos, sin = angles if angles is not None else self.temporal_angles(token_positions, freq_scale)
        cos, sin = cos.to(x.device, self.precision), sin.to(x.device, self.precision)
        if out is None:
            out = torch.empty_like(x)
        if out is not x:
            out[..., self.t_ch:] = x[..., self.t_ch:]
        out[..., : self.t_ch] = rotate_channels(x[..., : self.t_ch], cos, sin)
        return out

    def slot_angles(self, slot_positions: torch.Tensor, tokens_per_slot: int | torch.Tensor,
                    freq_scale: torch.Tensor | None = None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [N, t_ch/2] in :attr:`precision` on ``device`` for S slots at ``slot_positions``
        [S] (latent frames): the trigonometry is done per slot (float64, on the CPU) and only then
        repeated per token on the device.

        ``tokens_per_slot``: T (every slot holds T tokens, N = S*T) or an int64 tensor [S] of each
        slot's own token count (N = its sum; slots of a compressed chunk hold fewer tokens).
        """
        cos, sin = self.temporal_angles(slot_positions, freq_scale)
        if isinstance(tokens_per_slot, torch.Tensor):
            tokens_per_slot = tokens_per_slot.to(device)
        return (cos.to(device, self.precision).repeat_interleave(tokens_per_slot, 0),
                sin.to(device, self.precision).repeat_interleave(tokens_per_slot, 0))

    def rotate_slots(self, k_canon: torch.Tensor, slot_positions: torch.Tensor,
                     freq_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
                     angles: tuple[torch.Tensor, torch.Tensor] | None = None,
                     counts: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate canonical keys of whole cache slots to their virtual positions.

        Args:
            k_canon: [B, N, H, D]: S slots of T tokens each (N = S*T, one latent frame per slot),
                or with ``counts`` slots of ``counts[s]`` tokens each, in slot order (N = sum).
            slot_positions: [S] temporal position of each slot (latent frames, relative to the
                first frame of the current chunk; may be fractional for centroid schemes).
            out: write the result there (e.g. a slice of an attention buffer).
            angles: precomputed :meth:`slot_angles` of these positions (a chunk reuses them in
                every layer).
            counts: int64 [S] tokens of each slot (a compressed chunk's frames keep fewer tokens);
                None = N / S each.
        Returns:
            [B, N, H, D] in ``k_canon.dtype``: the keys as attention reads them (Eq. 6/7 of the
            WorldTrace paper: R(omega * t_s) applied to the canonical key).
        """
        num_slots = slot_positions.shape[0]
        if num_slots == 0:
            return k_canon
        if angles is None:
            per_slot = k_canon.shape[1] // num_slots if counts is None else counts
            angles = self.slot_angles(slot_positions, per_slot, freq_scale, k_canon.device)
        return self.apply_temporal(k_canon, None, angles=angles, out=out)


def yarn_frequency_scale(omega: torch.Tensor, trained_frames: float, scale: float,
                         alpha: float = 1.0, beta: float = 32.0) -> torch.Tensor:
    """NTK-by-parts frequency scale of YaRN (Peng et al. 2023, Eq. 18-19) for one RoPE axis.

    Each pair j with wavelength ``2*pi/omega_j`` completes ``r = trained / wavelength`` turns over the
    trained context; pairs with r > beta keep their frequency, pairs with r < alpha are interpolated
    by ``1/scale``, with a linear ramp between. Returns float64 [n] multipliers of ``omega``.
    With MG2's 6-frame trained window every temporal pair has r < 1, so this is position
    interpolation by ``1/scale`` on the whole temporal axis.
    """
    ratio = trained_frames * omega / (2 * torch.pi)
    ramp = ((ratio - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1 - ramp) / max(1.0, scale) + ramp


_ACTION_ANGLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def action_rope_tables(positions, device=None, theta: float = ACTION_ROPE_THETA
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin float32 [T, 4] of the action-module RoPE (MG2 spec §6.2) at latent-frame ``positions``
    (a [T] tensor or a sequence of T numbers): four pairs with ``omega_j = 256 ** (-2j/8)`` (1, 1/4,
    1/16, 1/64). Memoised per window and device (a handful of distinct windows per rollout, reused by
    every call); tables made under a fake-tensor mode (the memory plan, engine/memory_plan.py) are not
    kept, so a later real run never meets them."""
    values = tuple(positions.tolist() if isinstance(positions, torch.Tensor) else (float(p) for p in positions))
    key = (values, str(device), theta)
    if key not in _ACTION_ANGLES:
        omega = theta ** (-torch.arange(0, ACTION_ROPE_CHANNELS, 2, dtype=torch.float32, device="cpu")
                          / ACTION_ROPE_CHANNELS)
        ang = torch.outer(torch.tensor(values, dtype=torch.float32), omega).to(device)
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(ang):
            return ang.cos(), ang.sin()
        if len(_ACTION_ANGLES) > 64:
            _ACTION_ANGLES.clear()
        _ACTION_ANGLES[key] = (ang.cos(), ang.sin())
    return _ACTION_ANGLES[key]


def apply_action_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channels 0..7 of ``x`` [N, T, H_a, 64] by :func:`action_rope_tables` cos/sin [T, 4] in
    float32 and cast back; channels 8..63 are untouched (their h/w grid has one position).
    Functional (no in-place writes), so it compiles."""
    c = ACTION_ROPE_CHANNELS
    return torch.cat([rotate_channels(x[..., :c], cos, sin), x[..., c:]], dim=-1)
