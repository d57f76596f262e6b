"""``yarn``: the full cache with YaRN NTK-by-parts scaling of the temporal RoPE frequencies.

Paper App. "Training-Free Positional Baselines". Every past frame is kept (O(N) memory, refused
past ``--max-cache-gb`` like ``full``) at its actual position, and each chunk the temporal
frequencies of queries and keys are rescaled by ``yarn_frequency_scale`` with
``scale = span / trained`` (span: latent frames from the oldest cached frame to the end of the
current chunk; trained: local_attn_size). The spatial axes and YaRN's attention temperature are
left unchanged: the temperature rescales whole logits, not one RoPE axis.
"""

from __future__ import annotations

import torch

from ..model.rope import MainRope, yarn_frequency_scale
from .base import register
from .full import FullWriter


@register
class YarnWriter(FullWriter):
    """YaRN: the full cache with NTK-by-parts scaling of the temporal RoPE frequencies, actual positions."""

    name = "yarn"

    def scale(self) -> float:
        """Context extension factor ``span / trained`` (>= 1) of the current chunk."""
        g = self.geometry
        if not self._ids:
            return 1.0
        span = self.frame_start + g.frames_per_chunk - self._ids[0]
        return max(1.0, span / (g.trained_offset + 1))

    def temporal_frequency_scale(self) -> torch.Tensor:
        g = self.geometry
        omega = MainRope(g.head_dim).omega_t
        return yarn_frequency_scale(omega, g.trained_offset + 1, self.scale())

    def describe(self) -> dict:
        return {**super().describe(), "yarn": {"alpha": 1.0, "beta": 32.0, "attention_temperature": False}}
