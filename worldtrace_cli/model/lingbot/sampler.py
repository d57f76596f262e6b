"""The causal-fast sampler of LingBot-World (spec §8): 4 steps, integer timesteps, two sigma look-ups.

The official pipeline builds a flow UniPC scheduler table (1000 train steps) and uses only its
timestep and sigma tables; no UniPC update is taken. Flow matching: ``x_t = (1 - sigma) x0 + sigma eps``,
the model predicts ``v = eps - x0``. Because timesteps are truncated to integers several table rows
share one timestep, and the x0 conversion and the re-noising look sigma up differently (spec §8,
§15.3): x0 uses the *first* row with that timestep, add_noise the *second* when there are several.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

NUM_TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class CausalFastSchedule:
    """The 4-step schedule of causal-fast generation (spec §8).

    Args:
        shift: timestep shift (10.0, the released config).
        indices: table rows of the denoising timesteps (``[0, 250, 500, 750]``, spec §2.2).
    """

    shift: float = 10.0
    indices: tuple[int, ...] = (0, 250, 500, 750)

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(timesteps int64 [1000], sigmas float32 [1001] with a trailing 0).

        ``s_i = linspace(sigma_max, 0, 1001)[:1000]`` with ``sigma_max`` = float32(1 - 1/1000)
        (the shift-1 table's first entry), ``sigma_i = shift s_i / (1 + (shift-1) s_i)`` in float64,
        ``timestep_i = int64(1000 sigma_i)`` (truncated).
        """
        sigma_max = float(np.float32(1.0) - np.float32(1.0 / NUM_TRAIN_TIMESTEPS))
        s = np.linspace(sigma_max, 0.0, NUM_TRAIN_TIMESTEPS + 1)[:-1]
        sig = self.shift * s / (1 + (self.shift - 1) * s)
        timesteps = (sig * NUM_TRAIN_TIMESTEPS).astype(np.int64)
        return timesteps, np.concatenate([sig, [0.0]]).astype(np.float32)

    def timesteps(self) -> torch.Tensor:
        """Denoising timesteps, int64 [n_steps]: ``[999, 967, 908, 768]`` at shift 10."""
        ts, _ = self.table()
        return torch.from_numpy(ts[list(self.indices)].copy())

    def x0_rows(self) -> list[int]:
        """Rows used by the x0 conversion: the first row whose timestep equals each step's ([0, 248, 500, 750])."""
        ts, _ = self.table()
        return [int(np.flatnonzero(ts == t)[0]) for t in ts[list(self.indices)]]

    def x0_sigmas(self) -> torch.Tensor:
        """float64 [n_steps]: the float32 table sigma of each step's :meth:`x0_rows`
        (0.99989992, 0.96794939, 0.90892547, 0.76899391 at shift 10)."""
        _, sig = self.table()
        return torch.from_numpy(sig[self.x0_rows()].astype(np.float64))

    def add_noise_rows(self) -> list[int]:
        """Rows used by add_noise towards steps 1..n-1: the second row with that timestep when it
        occurs more than once, else the only one ([249, 501, 751])."""
        ts, _ = self.table()
        rows = []
        for t in ts[list(self.indices[1:])]:
            hits = np.flatnonzero(ts == t)
            rows.append(int(hits[1] if len(hits) > 1 else hits[0]))
        return rows

    def add_noise_sigmas(self) -> torch.Tensor:
        """float32 [n_steps - 1]: sigma' used to re-noise x0 towards steps 1..n-1
        (0.96778339, 0.90859413, 0.76804417 at shift 10)."""
        _, sig = self.table()
        return torch.from_numpy(sig[self.add_noise_rows()].copy())


class OfficialNoise:
    """The official pipeline's draws (spec §9.1) from one generator seeded with ``seed``: the whole
    rollout's initial noise [16, lat_f, lh, lw] first, then three [16, F, lh, lw] re-noising draws per
    chunk, in order. On the CPU this reproduces the official CPU run's draws exactly; CUDA generators
    draw different numbers. Use as the ``noise`` of
    :class:`~worldtrace_cli.engine.lingbot_rollout.LingbotRollout` (chunks in order only; the product draws
    per chunk instead, so a resumed run continues with the same numbers)."""

    def __init__(self, seed: int, latent_frames: int, latent_hw: tuple[int, int], device="cpu"):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.initial = torch.randn(16, latent_frames, *latent_hw, generator=self.gen, device=device)

    def __call__(self, chunk: int, draw: int, shape: tuple[int, ...]) -> torch.Tensor:
        """Draw 0: chunk ``chunk``'s slice of the initial noise [1, 16, F, lh, lw]; draw s > 0: the
        next re-noising draw of ``shape`` [1, 16, F, lh, lw] from the one generator."""
        if draw == 0:
            f = shape[2]
            return self.initial[None, :, chunk * f:(chunk + 1) * f]
        return torch.randn(shape[1:], generator=self.gen, device=self.initial.device)[None]


def flow_to_x0(x_t: torch.Tensor, flow: torch.Tensor, sigma: float | torch.Tensor) -> torch.Tensor:
    """``x0 = x_t - sigma v`` in float64, returned as float32 (spec §8). Shapes: any, equal."""
    sigma = torch.as_tensor(sigma, dtype=torch.float64)
    return (x_t.double() - sigma * flow.double()).float()


def add_noise(x0: torch.Tensor, noise: torch.Tensor, sigma: float | torch.Tensor) -> torch.Tensor:
    """``(1 - sigma') x0 + sigma' eps`` in float32 with sigma' a float32 scalar (spec §8). Shapes equal."""
    sigma = torch.as_tensor(sigma, dtype=torch.float32, device=x0.device)
    return (1 - sigma) * x0.float() + sigma * noise.float()
