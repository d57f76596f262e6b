"""A loaded LingBot-World model behind the :class:`~worldtrace_cli.engine.base.PipelineBase` interface.

``Pipeline.from_preset`` returns a :class:`LingbotPipeline` for a preset with ``architecture:
lingbot``; the jobs call the same methods as for MG2 (``build_writer``, ``condition``, ``rollout``,
``decoder``). What differs (lingbot-architecture.md): the image is squashed to the preset's size
without a crop (§10.2), the text prompt is encoded by umT5 (§10.4), the camera comes from
camera-to-world poses (§10.3) -- LingBot's own ``poses.npy`` / ``intrinsics.npy``, or the
trajectory's actions through the project's one motion model
(:func:`~worldtrace_cli.world.motion.frame_poses` -> :func:`~worldtrace_cli.world.motion.camera_to_world`,
one pose per pixel frame, as ``poses.npy`` holds one per video frame) -- and chunks are 4 latent
frames (16 pixel frames, 13 for the first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from ..model.lingbot.inputs import LingbotInputs
from .base import ModelKey, PipelineBase, RunConditioning, check_speed


@dataclass
class LingbotConditioned:
    """A start image and prompt encoded for one rollout: ``latents`` (ConditioningLatents: mask +
    VAE latents of the image followed by grey frames), ``text_context`` umT5 rows [L, 4096] float32,
    and the run's :class:`~worldtrace_cli.model.lingbot.inputs.LingbotInputs`."""

    latents: object
    text_context: torch.Tensor
    inputs: LingbotInputs


class LingbotPipeline(PipelineBase):
    """A LingBot preset's DiT, VAE, umT5 encoder (and optional CLIP tower for metrics), loaded once.

    ``world`` is a :class:`~worldtrace_cli.model.lingbot.world.LingbotWorld`; other attributes as
    :class:`~worldtrace_cli.engine.base.PipelineBase`. It reads a start image, the run's prompt (umT5)
    and camera files, and gives camera poses.
    """

    reads = frozenset({"image", "prompt", "camera_files", "text", "poses"})

    @classmethod
    def from_preset(cls, preset, checkpoint=None, random_weights: bool = False, weights_seed: int = 0,
                    device: str = "auto", dtype: str = "auto", rope_precision: str = "float32",
                    compile_mode: str = "none", hash_checkpoint: bool = False, key: ModelKey | None = None
                    ) -> "LingbotPipeline":
        """Load a LingBot preset (checkpoint folder, or seeded random weights).

        Raises:
            InputError: a bad precision/device/dtype, a preset whose ``denoising_steps`` are not the schedule's,
                a checkpoint preset without a folder.
            CheckpointError: missing (one line) or mismatched checkpoint files.
        """
        from ..model.lingbot.sampler import CausalFastSchedule
        from ..model.lingbot.world import load_lingbot_world

        check_speed(rope_precision, compile_mode)
        steps = CausalFastSchedule(preset.timestep_shift).timesteps().tolist()
        if list(preset.denoising_steps) != steps:
            raise InputError(f"preset {preset.name}: denoising_steps {list(preset.denoising_steps)} are not the "
                             f"causal-fast schedule at shift {preset.timestep_shift} ({steps})")
        return cls._loaded(preset, lambda dev, dt: load_lingbot_world(preset, checkpoint, random_weights, weights_seed,
                                                                      dev, dt, hash_checkpoint),
                           device, dtype, rope_precision, compile_mode, key)

    @torch.no_grad()
    def condition(self, request: RunConditioning) -> LingbotConditioned:
        """Encode ``request.image`` (squashed to the preset's size, spec §10.2) and ``request.prompt``
        (umT5; "" for none: the camera files' own prompt field is not read) for a rollout of ``request.num_chunks`` chunks; ``request.camera`` (LingbotInputs: poses,
        intrinsics) goes with them.

        Raises:
            InputError: no image.
        """
        from dataclasses import replace

        from ..model.conditioning import ConditioningLatents
        from ..model.lingbot.conditioning import preprocess_image
        from ..model.vae import encode_conditioning_latents

        if request.image is None:
            raise InputError(f"preset {self.preset.name}: {self.preset.backbone.title} needs a start image")
        inputs = replace(request.camera or LingbotInputs(), prompt=request.prompt or "")  # the prompt: its own field
        image = preprocess_image(request.image, self.preset.height, self.preset.width).to(self.device, self.dtype)
        latents = encode_conditioning_latents(self.world.vae, image, request.num_chunks * self.frames_per_chunk)
        text = self.world.text.encode(inputs.prompt)
        return LingbotConditioned(ConditioningLatents(latents), text, inputs)

    @property
    def pixel_hw(self) -> tuple[int, int]:
        """The generated frames' (h, w) in pixels."""
        return self.latent_hw[0] * self.vae_spatial_factor, self.latent_hw[1] * self.vae_spatial_factor

    def camera(self, rows: int, inputs: LingbotInputs):
        """The rollout's camera: with ``inputs.poses`` (LingBot's ``poses.npy``) the
        :class:`~worldtrace_cli.model.lingbot.camera.CameraTrack` of their first ``rows`` rows (R = 4 N - 3
        pixel frames, N latent frames; normalised over the whole trajectory, spec §10.3); else a
        :class:`~worldtrace_cli.model.lingbot.camera.StreamingCamera` over the actions' poses, which
        each chunk's request brings (the motion model's, its step per latent frame the translation scale).

        Raises:
            InputError: fewer pose rows than pixel frames, or invalid poses / intrinsics.
        """
        from ..model.lingbot.camera import CameraTrack, StreamingCamera
        from ..world.motion import UNITS_PER_FRAME

        if inputs.poses is None:
            return StreamingCamera(inputs.intrinsics, self.pixel_hw, 4 * UNITS_PER_FRAME)
        if len(inputs.poses) < rows:
            raise InputError(f"poses: {len(inputs.poses)} rows, the run needs one per pixel frame ({rows})")
        return CameraTrack(inputs.poses[:rows], inputs.intrinsics, (rows + 3) // 4, self.pixel_hw)

    def plan_conditioning(self, text_rows: int = 512) -> LingbotConditioned:
        """What :meth:`condition` returns, at the run's shapes and without computing it (the memory plan
        builds it under FakeTensorMode): conditioning latents and ``text_rows`` umT5 rows."""
        from ..model.conditioning import CONDITIONING_ENCODE_LATENT_FRAMES, ConditioningLatents

        latents = ConditioningLatents(torch.empty(1, 16, CONDITIONING_ENCODE_LATENT_FRAMES, *self.latent_hw))
        return LingbotConditioned(latents, torch.empty(text_rows, 4096), LingbotInputs())

    def rollout(self, writer, conditioned: LingbotConditioned, keyboard: torch.Tensor | None = None,
                mouse: torch.Tensor | None = None, seed: int = 0, noise=None, on_step=None, rows: int | None = None):
        """A fresh :class:`~worldtrace_cli.engine.lingbot_rollout.LingbotRollout` through ``writer`` (reset).

        Args:
            keyboard: [1, R, keyboard_dim] action rows (pixel frames) of a whole run, which then feeds
                itself (its camera: the explicit poses, else the actions' by the motion model); None:
                each chunk's poses come with its request (a live session); mouse: [1, R, 2] or None.
            seed: noise seed (chunk c draws from ``chunk_generator(seed, c)``).
            rows: the run's pixel frames when fed per chunk (explicit poses: the track's rows, normalised
                over them); a whole run's ``keyboard`` gives its own.
        """
        from ..model.lingbot.camera import CameraTrack
        from .lingbot_rollout import LingbotRollout
        from ..model.lingbot.sampler import CausalFastSchedule

        rows = keyboard.shape[1] if keyboard is not None else rows
        camera = self.camera(rows or 0, conditioned.inputs)
        if isinstance(camera, CameraTrack):
            poses = torch.from_numpy(camera.latent_poses)
        else:  # the actions' camera: a whole run's poses now (it feeds itself), else each request's
            poses = None if keyboard is None else self.latent_poses(keyboard, mouse)
        return LingbotRollout(self.world.dit, writer, conditioned.latents, conditioned.text_context, camera, seed,
                              self.device, self.latent_hw, self.frames_per_chunk, self.window,
                              CausalFastSchedule(self.preset.timestep_shift), noise=noise, on_step=on_step,
                              poses=poses)

    def latent_poses(self, keyboard: torch.Tensor, mouse: torch.Tensor | None) -> torch.Tensor:
        """Camera-to-world pose of every latent frame the actions reach, by the one motion model
        (:class:`~worldtrace_cli.world.motion.PoseTrack`): float64 [N, 4, 4], N = 1 + (R - 1) // 4."""
        from ..world.motion import PoseTrack

        track = PoseTrack(self.preset.mode)
        track.extend_to(keyboard[0].cpu(), None if mouse is None else mouse[0].cpu(), keyboard.shape[1])
        return track.latent_c2w(1 + (keyboard.shape[1] - 1) // 4).clone()

    def feed(self, plan, conditioned: LingbotConditioned):
        """The run's :class:`~worldtrace_cli.engine.feed.ConditioningFeed`: with explicit poses (camera files,
        the rollout's own track) its requests carry no poses; else (or ``conditioned`` None: not conditioned
        yet, a session's, which takes no camera files) the actions' poses so far."""
        from .feed import ConditioningFeed

        return ConditioningFeed(plan, camera=conditioned is None or conditioned.inputs.poses is None)
