"""The Self-Forcing few-step sampler (selfforcing-architecture.md §7): a flow-matching table with
``extra_one_step``, shift 5, the denoising list [1000, 750, 500, 250] warped to table rows
[0, 250, 500, 750] -> timesteps [1000, 937.5, 833.3333, 625], sigmas [1, 0.9375, 0.8333, 0.625].

x0 = x_t - sigma_s v (float64), re-noising x = (1 - sigma_{s+1}) x0 + sigma_{s+1} eps (float32): the
same two formulas as LingBot's causal-fast sampler
(:func:`~worldtrace_cli.model.lingbot.sampler.flow_to_x0`, :func:`~worldtrace_cli.model.lingbot.sampler.add_noise`),
on another table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NUM_TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class SelfForcingSchedule:
    """The 4-step schedule of Self-Forcing and LongLive v1.0 (selfforcing-architecture.md §7).

    Args:
        shift: timestep shift (5.0 in ``self_forcing_dmd.yaml`` and LongLive's configs).
        indices: table rows of the denoising steps (the warped [1000, 750, 500, 250]: rows [0, 250, 500, 750]).
    """

    shift: float = 5.0
    indices: tuple[int, ...] = (0, 250, 500, 750)

    def table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(timesteps float32 [1000], sigmas float32 [1000]): sigma_k = linspace(1, 0, 1001)[k]
        (float32), shifted ``s sigma / (1 + (s - 1) sigma)``, timestep = 1000 sigma'."""
        sigma = torch.linspace(1.0, 0.0, NUM_TRAIN_TIMESTEPS + 1, dtype=torch.float32)[:-1]
        shifted = self.shift * sigma / (1 + (self.shift - 1) * sigma)
        return shifted * NUM_TRAIN_TIMESTEPS, shifted

    def timesteps(self) -> torch.Tensor:
        """float32 [n_steps]: [1000, 937.5, 833.3333, 625] at shift 5."""
        return self.table()[0][list(self.indices)]

    def sigmas(self) -> torch.Tensor:
        """float32 [n_steps]: each step's sigma', [1, 0.9375, 0.8333, 0.625] at shift 5 (the x0
        conversion's sigma of step s, the re-noising's of step s + 1)."""
        return self.table()[1][list(self.indices)]


__all__ = ["SelfForcingSchedule"]
