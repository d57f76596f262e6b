"""The causal-fast chunk loop of LingBot-World (spec §9.1) over the project's cache writers.

Per chunk of F = 4 latent frames starting at latent frame a: ``writer.begin_chunk(a)``, every layer's
``writer.read`` (canonical keys, values, per-slot offsets), four denoising calls at timesteps
[999, 967, 908, 768] (x0 conversion and re-noising with the spec's two sigma look-ups), then the
context pass at t = 0 on the clean x0 and ``writer.commit`` of its canonical K/V (design.md §3).

The official rolling buffer (spec §7: sink of s frames + window of W frames including the current
chunk) maps onto existing writers (:func:`official_memory`); the denoising calls' own cache writes in
the official code only touch the current chunk's slots, so writing on the context pass alone is
equivalent (spec §14). This module does not import :mod:`worldtrace_cli.memory`: the caller builds
and resets the writer (``model/`` knows nothing of writers, design.md §2).
"""

from __future__ import annotations

from typing import Callable

import torch

from .config import FRAMES_PER_CHUNK, official_memory
from .dit import LayerPast, LingbotChunk, LingbotDiT
from .sampler import CausalFastSchedule, add_noise, flow_to_x0

__all__ = ["FRAMES_PER_CHUNK", "CausalFastLoop", "OfficialNoise", "conditioning_y", "geometry_fields",
           "official_memory"]
NoiseFn = Callable[[int, int, tuple[int, ...]], torch.Tensor]


def geometry_fields(dit: LingbotDiT, latent_hw: tuple[int, int], frames_per_chunk: int = FRAMES_PER_CHUNK) -> dict:
    """``CacheGeometry`` keyword arguments for this model and latent grid (tokens = (lh/2)(lw/2))."""
    cfg = dit.cfg
    window = cfg.local_attn_size if cfg.local_attn_size > 0 else 18  # trained window of the release (spec §2.2)
    return {"num_layers": cfg.num_layers, "heads": cfg.num_heads, "head_dim": cfg.head_dim,
            "tokens_per_frame": (latent_hw[0] // 2) * (latent_hw[1] // 2), "frames_per_chunk": frames_per_chunk,
            "trained_offset": window - 1, "dtype": dit.patch_embedding.weight.dtype,
            "device": dit.patch_embedding.weight.device}


def conditioning_y(image_latent: torch.Tensor) -> torch.Tensor:
    """y [1, 20, F, lh, lw]: 4 mask channels (ones at latent frame 0, zeros after) then the VAE latent
    [16, F, lh, lw] or [1, 16, F, lh, lw] of the image followed by grey frames (spec §10.2)."""
    lat = image_latent if image_latent.dim() == 5 else image_latent[None]
    mask = lat.new_zeros(1, 4, *lat.shape[2:])
    mask[:, :, 0] = 1
    return torch.cat([mask, lat], dim=1)


class OfficialNoise:
    """The official pipeline's draws (spec §9.1) from one generator seeded with ``seed``: the whole
    rollout's initial noise [16, lat_f, lh, lw] first, then three [16, F, lh, lw] re-noising draws per
    chunk, in order. On the CPU this reproduces the official CPU run's draws exactly; CUDA generators
    draw different numbers. Use as the ``noise`` of :class:`CausalFastLoop` (chunks in order only)."""

    def __init__(self, seed: int, latent_frames: int, latent_hw: tuple[int, int], device="cpu"):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.initial = torch.randn(16, latent_frames, *latent_hw, generator=self.gen, device=device)

    def __call__(self, chunk: int, draw: int, shape: tuple[int, ...]) -> torch.Tensor:
        if draw == 0:
            f = shape[2]
            return self.initial[None, :, chunk * f:(chunk + 1) * f]
        return torch.randn(shape[1:], generator=self.gen, device=self.initial.device)[None]


class CausalFastLoop:
    """Autoregressive causal-fast generation, one chunk per :meth:`step` (spec §9.1).

    Args:
        dit: a :class:`LingbotDiT`.
        writer: a cache writer already reset with a geometry from :func:`geometry_fields`
            (``begin_chunk`` / ``read`` / ``commit`` of design.md §3).
        text_context: umT5 rows [L, 4096] (L <= 512).
        y: conditioning [1, 20, lat_f, lh, lw] (:func:`conditioning_y`).
        camera: [1, 384, lat_f, lh, lw] (:func:`~worldtrace_cli.model.lingbot.camera.camera_embedding`).
        noise: ``noise(chunk, draw, shape) -> [1, 16, F, lh, lw]`` (draw 0: the chunk's initial noise,
            draw s: the re-noising before step s), e.g. :class:`OfficialNoise`.
        schedule: :class:`CausalFastSchedule`.
        frames_per_chunk: F (4).
        on_step: optional ``on_step(chunk, step, x0)`` observer of every denoising call's x0.
    Raises:
        ValueError: y and camera cover different frames or grids, or lat_f is not a multiple of F.
    """

    def __init__(self, dit: LingbotDiT, writer, text_context: torch.Tensor, y: torch.Tensor, camera: torch.Tensor,
                 noise: NoiseFn, schedule: CausalFastSchedule = CausalFastSchedule(),
                 frames_per_chunk: int = FRAMES_PER_CHUNK, on_step=None):
        if y.shape[2:] != camera.shape[2:]:
            raise ValueError(f"y {list(y.shape)} and camera {list(camera.shape)} differ in frames or latent grid")
        if y.shape[2] % frames_per_chunk:
            raise ValueError(f"{y.shape[2]} latent frames is not a multiple of the chunk size {frames_per_chunk}")
        self.dit, self.writer, self.noise, self.on_step = dit, writer, noise, on_step
        self.text_context, self.y, self.camera = text_context, y, camera
        self.frames_per_chunk = frames_per_chunk
        self.timesteps = schedule.timesteps()
        self.x0_sigmas, self.noise_sigmas = schedule.x0_sigmas(), schedule.add_noise_sigmas()
        self.state = dit.new_rollout_state()
        self.chunk = 0
        self.num_chunks = y.shape[2] // frames_per_chunk

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Generate and commit the next chunk; returns its latents [1, 16, F, lh, lw] float32.

        Raises:
            RuntimeError: past the last chunk, or non-finite latents (nothing of the chunk committed).
        """
        c, f = self.chunk, self.frames_per_chunk
        if c >= self.num_chunks:
            raise RuntimeError(f"all {self.num_chunks} chunks are generated")
        a = c * f
        device = self.dit.patch_embedding.weight.device
        self.writer.begin_chunk(a)
        past = [LayerPast(*self.writer.read(layer), self.writer.token_counts(layer))
                for layer in range(self.dit.cfg.num_layers)]
        chunk = LingbotChunk(rollout=self.state, past=past, text_context=self.text_context,
                             camera=self.camera[:, :, a:a + f].to(device))
        y = self.y[:, :, a:a + f].to(device)
        shape = (1, 16, f, *self.y.shape[3:])
        x = self.noise(c, 0, shape).to(device)
        for s, t in enumerate(self.timesteps):
            flow = self.dit(x, t, y, chunk)
            x0 = flow_to_x0(x, flow, self.x0_sigmas[s])
            if self.on_step is not None:
                self.on_step(c, s, x0)
            if s < len(self.timesteps) - 1:
                x = add_noise(x0, self.noise(c, s + 1, shape).to(device), self.noise_sigmas[s])
        if not torch.isfinite(x0).all():
            raise RuntimeError(f"chunk {c}: the denoised latents contain NaN or inf")
        _, committed = self.dit(x0, 0.0, y, chunk, commit=True)  # context pass: clean K/V for the cache
        self.writer.commit(committed, list(range(a, a + f)))
        self.chunk += 1
        return x0

    def run(self) -> torch.Tensor:
        """Every remaining chunk; returns all latents generated by this call [1, 16, frames, lh, lw]."""
        return torch.cat([self.step() for _ in range(self.chunk, self.num_chunks)], dim=2)
