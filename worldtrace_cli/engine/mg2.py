"""A loaded Matrix-Game-2.0 model with its speed settings, ready to condition and roll out (docs/architecture.md §1).

:class:`MG2Pipeline` owns the preset's networks on one device and dtype
(:func:`~worldtrace_cli.model.checkpoint.load_world_model`), the speed settings applied to them once
(RoPE precision, ``torch.compile``), the model's geometry (latent grid from the VAE's spatial factor,
tokens per latent frame from the DiT's patch size, latent channels, frames per chunk) and the image
conditioning. Jobs get it from :class:`worldtrace_cli.engine.pipeline.Pipeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ModelKey, PipelineBase, RunConditioning, check_speed


@dataclass
class Conditioned:
    """A start image encoded for one rollout: ``latents`` (cond_concat source, see
    :class:`~worldtrace_cli.model.conditioning.ConditioningLatents`) and ``visual_context``
    float32 [1, 257, clip_dim] CLIP tokens."""

    latents: object
    visual_context: torch.Tensor


class MG2Pipeline(PipelineBase):
    """An MG2 preset's DiT, VAE and CLIP tower loaded once, with fixed speed settings.

    ``world`` is a :class:`~worldtrace_cli.model.checkpoint.WorldModel`; other attributes as
    :class:`~worldtrace_cli.engine.base.PipelineBase`. It reads a start image, the CLIP tokens its DiT is
    conditioned on, and gives camera poses.
    """

    reads = frozenset({"image", "clip", "poses"})

    @classmethod
    def from_preset(cls, preset, checkpoint=None, random_weights: bool = False, weights_seed: int = 0,
                    device: str = "auto", dtype: str = "auto", rope_precision: str = "float32",
                    compile_mode: str = "none", hash_checkpoint: bool = False, key: ModelKey | None = None
                    ) -> "MG2Pipeline":
        """Load ``preset``'s networks (official folder ``checkpoint``, its bundle, or seeded random
        weights) on ``device`` in ``dtype`` and apply the speed settings.

        Raises:
            InputError: bad device/dtype/precision/compile mode, a checkpoint preset without a folder.
            CheckpointError: missing or mismatched checkpoint files.
        """
        from ..model.checkpoint import load_world_model

        check_speed(rope_precision, compile_mode)
        return cls._loaded(preset, lambda dev, dt: load_world_model(preset, checkpoint, random_weights, weights_seed,
                                                                    dev, dt, hash_checkpoint),
                           device, dtype, rope_precision, compile_mode, key)

    # -- per-run work ---------------------------------------------------------------------------
    @torch.no_grad()
    def condition(self, request: RunConditioning) -> Conditioned:
        """Encode ``request.image`` (a PIL start image, resized and centre-cropped to the preset) for a
        rollout of ``request.num_chunks`` chunks: its VAE latents and CLIP tokens.

        Raises:
            InputError: no image, or one too small for the preset's crop.
        """
        from ..errors import InputError
        from ..model.conditioning import build_conditioning, preprocess_image

        if request.image is None:
            raise InputError(f"preset {self.preset.name}: {self.preset.backbone.title} needs a start image")
        image = preprocess_image(request.image, self.preset.height, self.preset.width).to(self.device, self.dtype)
        latents, visual_context = build_conditioning(image, self.world.vae, self.world.clip,
                                                     request.num_chunks * self.frames_per_chunk)
        return Conditioned(latents, visual_context)

    def plan_conditioning(self, text_rows: int = 512) -> Conditioned:
        """What :meth:`condition` returns, at the run's shapes and without computing it (the memory plan
        builds it under FakeTensorMode): conditioning latents and CLIP tokens."""
        from ..model.conditioning import CONDITIONING_ENCODE_LATENT_FRAMES, ConditioningLatents

        latents = ConditioningLatents(torch.empty(1, 16, CONDITIONING_ENCODE_LATENT_FRAMES, *self.latent_hw))
        return Conditioned(latents, torch.empty(1, 257, self.world.clip.hidden_size))  # float32, as build_conditioning

    def rollout(self, writer, conditioned: Conditioned, keyboard: torch.Tensor | None = None,
                mouse: torch.Tensor | None = None, seed: int = 0, noise=None, on_step=None, rows: int | None = None):
        """A fresh :class:`~worldtrace_cli.engine.rollout.Rollout` of this model through ``writer`` (reset).

        Args:
            keyboard: [1, R, keyboard_dim] action rows (pixel frames) of a whole run, which then feeds
                itself; None: each chunk's rows come with its request (``step(request)``); mouse: [1, R, 2] or None.
            seed: noise seed (chunk c draws from ``chunk_generator(seed, c)``). rows: unused (no camera track).
        """
        from ..model.sampler import FlowMatchSchedule
        from .rollout import Rollout

        schedule = FlowMatchSchedule(self.preset.denoising_steps, self.preset.timestep_shift, self.preset.sampler)
        poses = None if keyboard is None else self.latent_poses(keyboard, mouse)
        return Rollout(self.world.dit, writer, conditioned.latents, conditioned.visual_context, keyboard, mouse,
                       schedule, seed, self.device, self.latent_hw, self.frames_per_chunk, noise=noise,
                       on_step=on_step, poses=poses, context_noise=self.preset.context_noise)

    def latent_poses(self, keyboard: torch.Tensor, mouse: torch.Tensor | None) -> torch.Tensor:
        """Camera-to-world pose of every latent frame the actions reach, by the one motion model
        (:class:`~worldtrace_cli.world.motion.PoseTrack`, the numbers a live feed makes chunk by chunk).

        Args:
            keyboard: [1, R, keyboard_dim] action rows; mouse: [1, R, 2] or None.
        Returns:
            float64 [N, 4, 4] (OpenCV axes), N = 1 + (R - 1) // 4 latent frames for R pixel frames.
        """
        from ..world.motion import PoseTrack

        track = PoseTrack(self.preset.mode)
        track.extend_to(keyboard[0].cpu(), None if mouse is None else mouse[0].cpu(), keyboard.shape[1])
        return track.latent_c2w(1 + (keyboard.shape[1] - 1) // 4).clone()


__all__ = ["Conditioned", "MG2Pipeline"]
