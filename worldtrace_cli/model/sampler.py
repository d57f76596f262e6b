"""MG2's few-step flow-matching sampler (MG2 spec §10).

Flow matching with ``x_t = (1 - sigma) x0 + sigma * eps`` and a model that predicts the flow
``v = eps - x0``. The distilled model is sampled in 3 steps (4 for templerun): predict x0, then
re-noise it to the next step's sigma with fresh noise (an LCM-style step, not an Euler step).
The schedule is short enough to state here; ``tests/test_sampler.py`` cross-checks it against
diffusers' ``FlowMatchEulerDiscreteScheduler``.

A preset may instead ask for the deterministic ``euler`` step on the same schedule: re-noise x0 with
the model's own predicted noise ``x0 + v`` instead of fresh noise, which is exactly an Euler step
of the flow ODE, ``x_{s+1} = x_s + (sigma_{s+1} - sigma_s) v`` (DDIM with eta 0; diffusers'
``FlowMatchEulerDiscreteScheduler.step``). An undistilled model (``loopworld``) sampled this way in
10 steps keeps the structure that the re-noising sampler averages away
(benchmarks/results/loopworld-sampler/).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .config import SAMPLERS  # the names a preset's ``sampler`` takes

NUM_TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class FlowMatchSchedule:
    """The warped timestep schedule of MG2.

    Args:
        denoising_steps: the nominal step list, e.g. ``(1000, 666, 333)`` or ``(1000, 750, 500, 250)``.
        shift: timestep shift (5.0 for every MG2 mode).
        sampler: how x moves from one step's sigma to the next (:data:`SAMPLERS`; :func:`next_x`):
            ``renoise`` (MG2's, fresh noise) or ``euler`` (deterministic).
    """

    denoising_steps: tuple[int, ...] = (1000, 666, 333)
    shift: float = 5.0
    sampler: str = "renoise"

    def table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sigmas, timesteps), float32 [1000]: ``s_i = 1 - i/1000``, ``sigma = shift*s/(1+(shift-1)*s)``."""
        s = torch.linspace(1.0, 0.0, NUM_TRAIN_TIMESTEPS + 1)[:-1]
        sigmas = self.shift * s / (1 + (self.shift - 1) * s)
        return sigmas, sigmas * NUM_TRAIN_TIMESTEPS

    def timesteps(self) -> torch.Tensor:
        """Warped timesteps fed to the model, float32 [n_steps]: ``t -> timestep[1000 - t]`` on the
        table extended by a trailing 0 (e.g. 1000, 666, 333 -> 1000.0, 908.8427, 713.9794)."""
        _, ts = self.table()
        ext = torch.cat([ts, torch.zeros(1)])
        return ext[[NUM_TRAIN_TIMESTEPS - t for t in self.denoising_steps]]

    def sigmas(self) -> torch.Tensor:
        """sigma of each step (the table entry nearest to its timestep), float32 [n_steps]."""
        sig, ts = self.table()
        return sig[torch.stack([(ts - t).abs().argmin() for t in self.timesteps()])]  # one gather: no host read


def flow_to_x0(x_t: torch.Tensor, flow: torch.Tensor, sigma: float | torch.Tensor) -> torch.Tensor:
    """x0 = x_t - sigma * v, computed in float64 and returned in ``x_t.dtype`` (MG2 spec §5 step 7)."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    return (x_t.double() - sigma * flow.double()).to(x_t.dtype)


def add_noise(x0: torch.Tensor, noise: torch.Tensor, sigma: float | torch.Tensor) -> torch.Tensor:
    """Forward process ``(1 - sigma) x0 + sigma * noise`` (same dtype as x0)."""
    sigma = torch.as_tensor(sigma, device=x0.device).to(x0.dtype)
    return (1 - sigma) * x0 + sigma * noise


def next_x(x0: torch.Tensor, flow: torch.Tensor, sigma_next: float | torch.Tensor, sampler: str, draw) -> torch.Tensor:
    """The sampler's input at the next step, from this step's x0 and flow (both [B, C, F, H, W], x0's
    dtype): ``renoise`` (MG2 spec §10) ``add_noise(x0, draw(), sigma_next)`` with a fresh Gaussian
    draw; ``euler`` ``add_noise(x0, x0 + flow, sigma_next)``, the noise the model predicts, which
    equals the Euler step ``x + (sigma_next - sigma) flow`` of the flow ODE (``draw`` is not called:
    no randomness after the initial noise). Raises ValueError for another ``sampler``."""
    if sampler == "renoise":
        return add_noise(x0, draw().to(x0.device), sigma_next)
    if sampler == "euler":
        return add_noise(x0, x0 + flow.to(x0.dtype), sigma_next)
    raise ValueError(f"unknown sampler {sampler!r} (expected one of {', '.join(SAMPLERS)})")


def chunk_generator(seed: int, chunk: int) -> torch.Generator:
    """CPU generator for one chunk's random draws, derived from (seed, chunk) alone.

    Each chunk's noise depends only on the run seed and the chunk index, so a resumed run draws
    exactly what an uninterrupted one does, and CPU and GPU runs share their noise.
    """
    state = np.random.SeedSequence([seed, chunk]).generate_state(2, dtype=np.uint32)
    return torch.Generator(device="cpu").manual_seed(int(state[0]) << 32 | int(state[1]))
