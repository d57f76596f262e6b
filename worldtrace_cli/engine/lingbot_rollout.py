"""The LingBot-World chunk loop behind the product's rollout interface (lingbot-architecture.md §9.1).

:class:`LingbotRollout` is LingBot-World's backbone in the one chunk loop
(:class:`~worldtrace_cli.engine.rollout.ChunkRollout`, as :class:`~worldtrace_cli.engine.rollout.Rollout`
is MG2's): one chunk of F = 4 latent frames per :meth:`~LingbotRollout.step` through any cache writer,
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
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..errors import RunError
from ..memory import CacheWriter
from ..model.lingbot.config import TRAINED_WINDOW
from ..model.lingbot.dit import LingbotChunk
from ..model.lingbot.sampler import CausalFastSchedule, add_noise, flow_to_x0
from .feed import ChunkRequest, ConditioningFeed
from .rollout import ChunkRollout


class LingbotRollout(ChunkRollout):
    """LingBot-World's backbone in the chunk loop (:class:`~worldtrace_cli.engine.rollout.ChunkRollout`).

    Args:
        dit: a :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` on ``device``.
        writer: the self-attention cache writer (reset here, then given ``poses``).
        conditioning: object with ``cond_concat(start, count) -> [1, 20, count, lh, lw]`` (mask at
            latent frame 0 + the VAE latents of the image and grey frames, spec §10.2).
        text_context: umT5 rows [L, 4096] float32 (L <= 512).
        camera: the rollout's :class:`~worldtrace_cli.model.lingbot.camera.CameraTrack` (``chunk(a, f)`` ->
            [1, 384, f, lh, lw], ``num_frames``: explicit poses, normalised over the whole trajectory, so
            made up front; the run feeds itself), or a
            :class:`~worldtrace_cli.model.lingbot.camera.StreamingCamera` made from each chunk's poses
            (:class:`~worldtrace_cli.engine.feed.ChunkRequest`: the actions' camera, live or not).
        seed: noise seed (chunk c draws from ``chunk_generator(seed, c)`` on the CPU).
        device: where the DiT runs; latent_hw: (lh, lw); frames_per_chunk: F (4).
        window: the trained attention window in latent frames, current chunk included (18):
            records compare slot offsets with ``window - 1``.
        schedule: :class:`CausalFastSchedule` (shift 10, rows [0, 250, 500, 750]).
        noise: optional ``noise(chunk, draw, shape)`` replacing the seeded draws (fixture replay).
        on_step: optional ``on_step(chunk, step, x0)`` observer of every denoising call's x0.
        poses: float64 [N, 4, 4] camera-to-world pose of every latent frame (OpenCV axes), handed to
            :meth:`~worldtrace_cli.memory.base.CacheWriter.set_poses`.
    Raises (from :meth:`step`):
        RunError: past the camera's last latent frame, or non-finite latents (names the chunk;
            nothing of the chunk is committed).
    """

    def __init__(self, dit, writer: CacheWriter, conditioning, text_context: torch.Tensor, camera: torch.Tensor,
                 seed: int, device: torch.device, latent_hw: tuple[int, int], frames_per_chunk: int = 4,
                 window: int = TRAINED_WINDOW, schedule: CausalFastSchedule = CausalFastSchedule(), noise=None,
                 on_step=None, poses: torch.Tensor | None = None):
        from ..model.lingbot.camera import CameraTrack

        self.conditioning, self.text_context, self.camera = conditioning, text_context, camera
        self.track = camera if isinstance(camera, CameraTrack) else None  # whole-run poses: fed by themselves
        self.timesteps = schedule.timesteps()
        self.x0_sigmas, self.noise_sigmas = schedule.x0_sigmas(), schedule.add_noise_sigmas()
        self._setup(dit, writer, seed, device, latent_hw, frames_per_chunk, window - 1,
                    dit.patch_embedding.weight.dtype, len(self.timesteps), noise, on_step, poses)
        if self.track is not None or poses is not None:  # a whole run's camera: it feeds itself
            self.feed = ConditioningFeed.whole(poses=None if self.track is not None else poses)

    # the 14B DiT's rotated past for all 40 layers would take 22.2 GB at the default cache: one layer's
    # buffer, re-filled per call, takes 0.55 GB (docs/gpu-memory.md; CacheView.shared_buffer: the same values)
    shared_kv_buffer = True

    def check_chunk(self, chunk: int, frame_start: int, request: ChunkRequest) -> None:
        covered = self.track.num_frames if self.track is not None else \
            (0 if request.poses is None else len(request.poses))
        if frame_start + self.frames_per_chunk > covered:
            raise RunError(f"chunk {chunk}: the camera covers {covered} latent frames only")
        if self.track is not None and request.poses is not None:
            raise ValueError(f"chunk {chunk}: a rollout of explicit poses takes no poses with its requests")

    def chunk_inputs(self, read, frame_start: int, frames: int, request: ChunkRequest):
        with unset_fake_temporarily():  # a host array, real also when the memory plan runs this (FakeTensorMode)
            camera = (self.track.chunk(frame_start, frames) if self.track is not None else
                      self.camera.chunk(request.poses.numpy(), frame_start, frames))
        inputs = LingbotChunk(rollout=self.state, past=read.past, text_context=self.text_context,
                              camera=camera.to(self.device), temporal_freq_scale=read.freq_scale,
                              shared_buffer=self.shared_kv_buffer)
        return inputs, self.conditioning.cond_concat(frame_start, frames).to(self.device)

    def flow(self, x, step, inputs, cond, probe=None):
        return self.call_dit(x, self.timesteps[step], cond, inputs, probe=probe)

    def to_x0(self, x, flow, step):
        return flow_to_x0(x, flow, self.x0_sigmas[step])

    def renoise(self, x0, flow, step, draw):
        return add_noise(x0, draw().to(self.device), self.noise_sigmas[step])

    def context(self, x0, inputs, cond, draw=None):
        _, committed = self.call_dit(x0, 0.0, cond, inputs, commit=True)
        return committed
