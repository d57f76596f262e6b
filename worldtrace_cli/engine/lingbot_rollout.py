"""The LingBot-World chunk loop behind the product's rollout interface (lingbot-architecture.md §9.1).

:class:`LingbotRollout` is to the LingBot DiT what :class:`~worldtrace_cli.engine.rollout.Rollout` is to
MG2's: one chunk of F = 4 latent frames per :meth:`~LingbotRollout.step` through any cache writer,
returning a :class:`~worldtrace_cli.engine.rollout.ChunkOutput` with the same ``chunks.jsonl`` record, so
``generate``, ``compare``, ``loopbench``, ``bench speed`` and resume states treat both models alike.
Per chunk: four denoising calls at timesteps [999, 967, 908, 768] with the spec's two sigma
look-ups (§8), then the context pass at t = 0 whose canonical K/V the writer commits (§14).

Noise: chunk c draws from ``chunk_generator(seed, c)`` (its initial noise, then three re-noising
draws), so a resumed run continues with the same numbers; the official pipeline's single
sequential generator is :class:`~worldtrace_cli.model.lingbot.sampler.OfficialNoise`, which the parity
replay passes as ``noise``.
"""

from __future__ import annotations

import torch

from ..errors import RunError
from ..memory import CacheGeometry, CacheWriter
from ..model.lingbot.config import TRAINED_WINDOW
from ..model.lingbot.dit import LingbotChunk
from ..model.lingbot.sampler import CausalFastSchedule, add_noise, flow_to_x0
from .record import chunk_record
from .rollout import ChunkOutput, PhaseTimer, begin_chunk, noise_draws



class LingbotRollout:
    """Autoregressive LingBot-World generation with a pluggable KV-cache writer.

    Args:
        dit: a :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` on ``device``.
        writer: the self-attention cache writer (reset here, then given ``poses``).
        conditioning: object with ``cond_concat(start, count) -> [1, 20, count, lh, lw]`` (mask at
            latent frame 0 + the VAE latents of the image and grey frames, spec §10.2).
        text_context: umT5 rows [L, 4096] float32 (L <= 512).
        camera: the rollout's :class:`~worldtrace_cli.model.lingbot.camera.CameraTrack` (``chunk(a, f)`` ->
            [1, 384, f, lh, lw], ``num_frames``; the translation normalisation needs the whole
            trajectory, so it is made up front).
        seed: noise seed (chunk c draws from ``chunk_generator(seed, c)`` on the CPU).
        device: where the DiT runs; latent_hw: (lh, lw); frames_per_chunk: F (4).
        window: the trained attention window in latent frames, current chunk included (18):
            records compare slot offsets with ``window - 1``.
        schedule: :class:`CausalFastSchedule` (shift 10, rows [0, 250, 500, 750]).
        noise: optional ``noise(chunk, draw, shape)`` replacing the seeded draws (fixture replay).
        on_step: optional ``on_step(chunk, step, x0)`` observer of every denoising call's x0.
        poses: float64 [N, 4, 4] camera-to-world pose of every latent frame (OpenCV axes), handed to
            :meth:`~worldtrace_cli.memory.base.CacheWriter.set_poses`.
    """

    def __init__(self, dit, writer: CacheWriter, conditioning, text_context: torch.Tensor, camera: torch.Tensor,
                 seed: int, device: torch.device, latent_hw: tuple[int, int], frames_per_chunk: int = 4,
                 window: int = TRAINED_WINDOW, schedule: CausalFastSchedule = CausalFastSchedule(), noise=None,
                 on_step=None, poses: torch.Tensor | None = None):
        self.dit, self.writer, self.conditioning = dit, writer, conditioning
        self.text_context, self.camera = text_context, camera
        self.noise, self.on_step, self.seed = noise, on_step, seed
        self.device, self.latent_hw, self.frames_per_chunk = device, latent_hw, frames_per_chunk
        self.dtype = dit.patch_embedding.weight.dtype
        self.timesteps = schedule.timesteps()
        self.x0_sigmas, self.noise_sigmas = schedule.x0_sigmas(), schedule.add_noise_sigmas()
        cfg = dit.cfg
        tokens = dit.tokens_per_frame(latent_hw)
        self.latent_channels = cfg.out_dim
        self.geometry = CacheGeometry(cfg.num_layers, cfg.num_heads, cfg.head_dim, tokens, frames_per_chunk,
                                      window - 1, device, self.dtype)
        writer.reset(self.geometry)
        writer.set_poses(poses)
        self.state = dit.new_rollout_state()
        self.chunk = 0

    @torch.no_grad()
    def step(self) -> ChunkOutput:
        """Generate and commit the next chunk (decoding: :class:`~worldtrace_cli.engine.decode.DecodePipeline`).

        Returns:
            :class:`ChunkOutput` with latents [1, 16, F, lh, lw] float32 and the chunk's record.
        Raises:
            RunError: past the camera's last latent frame, or non-finite latents (names the chunk;
                nothing of the chunk is committed).
        """
        c, f = self.chunk, self.frames_per_chunk
        a = c * f
        if a + f > self.camera.num_frames:
            raise RunError(f"chunk {c}: the camera covers {self.camera.num_frames} latent frames only")
        timer = PhaseTimer(self.device)
        with timer.phase("cache"):
            read = begin_chunk(self.writer, a, self.geometry.num_layers)  # before this chunk's commit
        chunk = LingbotChunk(rollout=self.state, past=read.past, text_context=self.text_context,
                             camera=self.camera.chunk(a, f).to(self.device), temporal_freq_scale=read.freq_scale)
        y = self.conditioning.cond_concat(a, f).to(self.device)
        draw = noise_draws(self.seed, c, (1, self.latent_channels, f, *self.latent_hw), self.noise)
        x = draw(0).to(self.device)
        with timer.phase("denoise"):
            for s, t in enumerate(self.timesteps):
                flow = self.dit(x, t, y, chunk)
                x0 = flow_to_x0(x, flow, self.x0_sigmas[s])
                if self.on_step is not None:
                    self.on_step(c, s, x0)
                if s < len(self.timesteps) - 1:
                    x = add_noise(x0, draw(s + 1).to(self.device), self.noise_sigmas[s])
        if not torch.isfinite(x0).all():
            raise RunError(f"chunk {c}: the denoised latents contain NaN or inf")
        with timer.phase("context"):
            _, committed = self.dit(x0, 0.0, y, chunk, commit=True)
        with timer.phase("cache"):
            self.writer.commit(committed, list(range(a, a + f)))
        del chunk
        self.chunk += 1
        record = chunk_record(self.writer, self.geometry, c, a, read, timer, x0)
        return ChunkOutput(x0, None, record)
