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
from .base import ModelKey, PipelineBase, check_speed


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
    :class:`~worldtrace_cli.engine.base.PipelineBase`.
    """

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
    def condition(self, pil_image, num_chunks: int, inputs: LingbotInputs | None = None) -> LingbotConditioned:
        """Encode a PIL start image (squashed to the preset's size, spec §10.2) and the prompt for a
        rollout of ``num_chunks`` chunks."""
        from ..model.conditioning import ConditioningLatents
        from ..model.lingbot.conditioning import preprocess_image
        from ..model.vae import encode_conditioning_latents

        inputs = inputs or LingbotInputs()
        image = preprocess_image(pil_image, self.preset.height, self.preset.width).to(self.device, self.dtype)
        latents = encode_conditioning_latents(self.world.vae, image, num_chunks * self.frames_per_chunk)
        text = self.world.text.encode(inputs.prompt)
        return LingbotConditioned(ConditioningLatents(latents), text, inputs)

    def camera(self, keyboard: torch.Tensor, mouse: torch.Tensor | None, inputs: LingbotInputs):
        """The rollout's :class:`~worldtrace_cli.model.lingbot.camera.CameraTrack` for R action rows
        (R = 4 N - 3 pixel frames, N latent frames): the first R rows of ``inputs.poses`` when given,
        else the actions' poses by the motion model (:func:`~worldtrace_cli.world.motion.frame_poses`,
        :func:`~worldtrace_cli.world.motion.camera_to_world`).

        Raises:
            InputError: fewer pose rows than pixel frames, or invalid poses / intrinsics.
        """
        from ..model.lingbot.camera import CameraTrack
        from ..world.motion import camera_to_world, frame_poses

        rows = keyboard.shape[1]
        if inputs.poses is not None:
            if len(inputs.poses) < rows:
                raise InputError(f"poses: {len(inputs.poses)} rows, the run needs one per pixel frame ({rows})")
            c2w = inputs.poses[:rows]
        else:
            pixel = frame_poses(self.preset.mode, keyboard[0].cpu(), None if mouse is None else mouse[0].cpu())
            c2w = camera_to_world(pixel).numpy()
        pixel_hw = (self.latent_hw[0] * self.vae_spatial_factor, self.latent_hw[1] * self.vae_spatial_factor)
        return CameraTrack(c2w, inputs.intrinsics, (rows + 3) // 4, pixel_hw)

    def rollout(self, writer, conditioned: LingbotConditioned, keyboard: torch.Tensor, mouse: torch.Tensor | None,
                seed: int, noise=None, on_step=None):
        """A fresh :class:`~worldtrace_cli.engine.lingbot_rollout.LingbotRollout` through ``writer`` (reset;
        given every latent frame's camera-to-world pose).

        Args:
            keyboard: [1, R, keyboard_dim] action rows (pixel frames); mouse: [1, R, 2] or None.
            seed: noise seed (chunk c draws from ``chunk_generator(seed, c)``).
        """
        from .lingbot_rollout import LingbotRollout
        from ..model.lingbot.sampler import CausalFastSchedule

        track = self.camera(keyboard, mouse, conditioned.inputs)
        return LingbotRollout(self.world.dit, writer, conditioned.latents, conditioned.text_context, track, seed,
                              self.device, self.latent_hw, self.frames_per_chunk, self.window,
                              CausalFastSchedule(self.preset.timestep_shift), noise=noise, on_step=on_step,
                              poses=torch.from_numpy(track.latent_poses))

    def latent_poses(self, keyboard: torch.Tensor, mouse: torch.Tensor | None) -> torch.Tensor:
        """Camera-to-world pose of every latent frame the actions reach: float64 [N, 4, 4]."""
        return torch.from_numpy(self.camera(keyboard, mouse, LingbotInputs()).latent_poses)
