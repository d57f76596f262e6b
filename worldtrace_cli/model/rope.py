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

ROPE_THETA = 10000.0
ACTION_ROPE_THETA = 256.0
ACTION_ROPE_CHANNELS = 8


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


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of ``x`` [..., 2P] by angles given as cos/sin broadcastable to [..., P]."""
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


class MainRope:
    """Main self-attention RoPE of one head dim (MG2 spec §6.1), split into spatial and temporal parts.

    Args:
        head_dim: per-head channels (128 for MG2).
        theta: RoPE base (10000).
    """

    def __init__(self, head_dim: int = 128, theta: float = ROPE_THETA):
        self.head_dim = head_dim
        self.t_ch, self.h_ch, self.w_ch = axis_channels(head_dim)
        self.omega_t = frequencies(self.t_ch, theta)
        self.omega_h = frequencies(self.h_ch, theta)
        self.omega_w = frequencies(self.w_ch, theta)
        self._spatial: dict = {}

    def spatial_angles(self, height: int, width: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin float64 [height*width, (h_ch + w_ch)/2] for tokens in row-major (i, j) order
        (memoised per grid and device: every layer and call of a rollout reuses them)."""
        key = (height, width, str(device))
        if key not in self._spatial:
            i = torch.arange(height, dtype=torch.float64, device="cpu").repeat_interleave(width)
            j = torch.arange(width, dtype=torch.float64, device="cpu").repeat(height)
            ang = torch.cat([torch.outer(i, self.omega_h), torch.outer(j, self.omega_w)], dim=1)
            self._spatial[key] = (ang.cos().to(device), ang.sin().to(device))
        return self._spatial[key]

    def temporal_angles(self, positions: torch.Tensor, freq_scale: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin float64 [L, t_ch/2] for temporal positions [L] (latent frames, any real value).

        ``freq_scale`` [t_ch/2] multiplies the temporal frequencies (YaRN); None = MG2's own.
        """
        omega = self.omega_t if freq_scale is None else self.omega_t * freq_scale.to(torch.float64).cpu()
        ang = torch.outer(positions.to(torch.float64).cpu(), omega)
        return ang.cos(), ang.sin()

    def apply_spatial(self, x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Rotate the height/width channels of ``x`` [B, F*height*width, H, D] (tokens (f, i, j) order).

        Computed in float64 and cast back to ``x.dtype`` as MG2 does. Temporal channels are untouched,
        so the result is a canonical key (or a query still to be rotated temporally).
        """
        cos, sin = self.spatial_angles(height, width, x.device)
        frames = x.shape[1] // (height * width)
        cos = cos.repeat(frames, 1)[None, :, None, :]
        sin = sin.repeat(frames, 1)[None, :, None, :]
        out = x.clone()
        out[..., self.t_ch:] = _rotate_pairs(x[..., self.t_ch:].double(), cos, sin).to(x.dtype)
        return out

    def apply_temporal(self, x: torch.Tensor, token_positions: torch.Tensor,
                       freq_scale: torch.Tensor | None = None, angles=None,
                       out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate the temporal channels of ``x`` [B, L, H, D] at ``token_positions`` [L] (latent frames).

        float64 rotation, cast back to ``x.dtype``. Only the ``t_ch`` temporal channels are computed.
        ``angles``: precomputed ``temporal_angles(token_positions, freq_scale)`` already on ``x``'s
        device (a chunk reuses them for every layer and call). ``out``: write the result there (it
        may be ``x`` itself, or a slice of an attention buffer) instead of a new tensor, saving a copy.
        """
        cos, sin = angles if angles is not None else self.temporal_angles(token_positions, freq_scale)
        cos = cos.to(x.device)[None, :, None, :]
        sin = sin.to(x.device)[None, :, None, :]
        rotated = _rotate_pairs(x[..., : self.t_ch].double(), cos, sin)
        if out is None:
            out = x.clone()
        elif out is not x:
            out[..., self.t_ch:] = x[..., self.t_ch:]
        out[..., : self.t_ch] = rotated.to(out.dtype)
        return out

    def rotate_slots(self, k_canon: torch.Tensor, slot_positions: torch.Tensor,
                     freq_scale: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate canonical keys of whole cache slots to their virtual positions.

        Args:
            k_canon: [B, S*T, H, D], S slots of T tokens each (one latent frame per slot).
            slot_positions: [S] temporal position of each slot (latent frames, relative to the
                first frame of the current chunk; may be fractional for centroid schemes).
        Returns:
            [B, S*T, H, D] in ``k_canon.dtype``: the keys as attention reads them (Eq. 6/7 of the
            WorldTrace paper: R(omega * t_s) applied to the canonical key).
        """
        num_slots = slot_positions.shape[0]
        if num_slots == 0:
            return k_canon
        tokens_per_slot = k_canon.shape[1] // num_slots
        return self.apply_temporal(k_canon, slot_positions.repeat_interleave(tokens_per_slot), freq_scale, out=out)


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


def action_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = ACTION_ROPE_THETA) -> torch.Tensor:
    """Action-module RoPE (MG2 spec §6.2) on ``x`` [..., T, H_a, 64] at latent-frame ``positions`` [T].

    Rotates channels 0..7 as four interleaved pairs with ``omega_j = 256 ** (-2j/8)`` (1, 1/4, 1/16,
    1/64) in float32 and casts back; channels 8..63 are untouched (their h/w grid has one position).
    """
    key = (tuple(positions.tolist()), str(x.device), theta)
    if key not in _ACTION_ANGLES:  # a handful of distinct windows per rollout, reused by every call
        omega = theta ** (-torch.arange(0, ACTION_ROPE_CHANNELS, 2, dtype=torch.float32, device="cpu")
                          / ACTION_ROPE_CHANNELS)
        ang = torch.outer(positions.to(torch.float32).cpu(), omega).to(x.device)
        if len(_ACTION_ANGLES) > 64:
            _ACTION_ANGLES.clear()
        _ACTION_ANGLES[key] = (ang.cos()[:, None, :], ang.sin()[:, None, :])
    cos, sin = _ACTION_ANGLES[key]
    out = x.clone()
    out[..., :ACTION_ROPE_CHANNELS] = _rotate_pairs(x[..., :ACTION_ROPE_CHANNELS].float(), cos, sin).to(x.dtype)
    return out
