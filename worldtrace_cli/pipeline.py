"""A loaded world model with its speed settings, ready to condition and roll out (design.md §2).

:class:`Pipeline` owns what every job used to set up on its own: the preset's networks on one
device and dtype (:func:`~worldtrace_cli.model.checkpoint.load_world_model`), the speed settings
applied to them once (RoPE precision, ``torch.compile``), the model's geometry (latent grid from the
VAE's spatial factor, tokens per latent frame from the DiT's patch size, latent channels, frames per
chunk) and the image conditioning. ``generate``, ``compare``, ``loopbench run`` and ``bench speed``
build one pipeline and pass it to every run they make; nothing is cached per process, and no run
changes a pipeline's settings (a run that needs other settings gets its own pipeline, see
:meth:`Pipeline.serves`).
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass

import torch

from . import __version__
from .errors import InputError

log = logging.getLogger("worldtrace")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available else cpu.

    Raises:
        InputError: ``cuda`` without a CUDA device, or an unknown name.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available (use --device cpu)")
    if name not in ("cpu", "cuda"):
        raise InputError(f"--device: must be auto, cuda or cpu, got {name!r}")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bf16 on cuda, fp32 on cpu; ``bf16`` / ``fp32`` as named.

    Raises:
        InputError: an unknown name.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in ("bf16", "fp32"):
        raise InputError(f"--dtype: must be auto, bf16 or fp32, got {name!r}")
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def versions() -> dict:
    """Versions of Python, torch and the libraries around the core (for summary.json)."""
    import importlib.metadata as md

    out = {"worldtrace": __version__, "python": platform.python_version(), "torch": torch.__version__}
    for name in ("diffusers", "transformers", "imageio-ffmpeg", "safetensors"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    out["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


@dataclass(frozen=True)
class ModelKey:
    """What identifies a loaded pipeline: two runs with equal keys can share one."""

    preset: str          # the preset's resolved settings (JSON, sorted keys)
    checkpoint: str | None
    random_weights: bool
    weights_seed: int
    device: str
    dtype: str
    rope_precision: str
    compile: str
    hash_checkpoint: bool

    @classmethod
    def of(cls, cfg) -> "ModelKey":
        """The key a :class:`~worldtrace_cli.config.RunConfig` needs (device and dtype resolved)."""
        import json

        device = resolve_device(cfg.device)
        return cls(json.dumps(cfg.preset.to_dict(), sort_keys=True, default=str),
                   None if cfg.checkpoint is None else str(cfg.checkpoint), bool(cfg.random_weights),
                   cfg.weights_seed, str(device), str(resolve_dtype(cfg.dtype, device)), cfg.rope_precision,
                   cfg.compile, bool(cfg.hash_checkpoint))


@dataclass
class Conditioned:
    """A start image encoded for one rollout: ``latents`` (cond_concat source, see
    :class:`~worldtrace_cli.model.conditioning.ConditioningLatents`) and ``visual_context``
    float32 [1, 257, clip_dim] CLIP tokens."""

    latents: object
    visual_context: torch.Tensor


class Pipeline:
    """A preset's DiT, VAE and CLIP tower loaded once, with fixed speed settings.

    Build with :meth:`from_preset` (or :meth:`from_config` for a RunConfig). Attributes: ``preset``,
    ``world`` (:class:`~worldtrace_cli.model.checkpoint.WorldModel`), ``device``, ``dtype``,
    ``rope_precision``, ``compile_mode``, ``key`` (:class:`ModelKey`), ``load_seconds``.
    """

    def __init__(self, preset, world, device: torch.device, dtype: torch.dtype, rope_precision: str,
                 compile_mode: str, key: ModelKey | None = None, load_seconds: float = 0.0):
        self.preset, self.world, self.device, self.dtype = preset, world, device, dtype
        self.rope_precision, self.compile_mode = rope_precision, compile_mode
        self.key, self.load_seconds = key, load_seconds

    @classmethod
    def from_preset(cls, preset, checkpoint=None, random_weights: bool = False, weights_seed: int = 0,
                    device: str = "auto", dtype: str = "auto", rope_precision: str = "float32",
                    compile_mode: str = "none", hash_checkpoint: bool = False, key: ModelKey | None = None
                    ) -> "Pipeline":
        """Load ``preset``'s networks (official folder ``checkpoint``, its bundle, or seeded random
        weights) on ``device`` in ``dtype`` and apply the speed settings. A LingBot preset
        (``architecture: lingbot``) gives a :class:`~worldtrace_cli.lingbot_pipeline.LingbotPipeline`.

        Raises:
            InputError: bad device/dtype/precision/compile mode, a checkpoint preset without a folder.
            CheckpointError: missing or mismatched checkpoint files.
        """
        import time

        from .model.checkpoint import load_world_model
        from .model.dit import COMPILE_MODES, ROPE_PRECISIONS, configure_speed

        if preset.is_lingbot and cls is Pipeline:  # the architecture picks the pipeline
            from .lingbot_pipeline import LingbotPipeline

            return LingbotPipeline.from_preset(preset, checkpoint, random_weights, weights_seed, device, dtype,
                                               rope_precision, compile_mode, hash_checkpoint, key)

        if rope_precision not in ROPE_PRECISIONS:
            raise InputError(f"--rope-precision: must be one of {', '.join(ROPE_PRECISIONS)}, got {rope_precision!r}")
        if compile_mode not in COMPILE_MODES:
            raise InputError(f"--compile: must be one of {', '.join(COMPILE_MODES)}, got {compile_mode!r}")
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        start = time.perf_counter()
        world = load_world_model(preset, checkpoint, random_weights, weights_seed, dev, dt, hash_checkpoint)
        configure_speed(world.dit, rope_precision, compile_mode)
        if compile_mode != "none":
            log.info(f"--compile {compile_mode}: the first chunk includes compiling the DiT blocks")
        return cls(preset, world, dev, dt, rope_precision, compile_mode, key, time.perf_counter() - start)

    @classmethod
    def from_config(cls, cfg) -> "Pipeline":
        """The pipeline a :class:`~worldtrace_cli.config.RunConfig` asks for."""
        return cls.from_preset(cfg.preset, cfg.checkpoint, cfg.random_weights, cfg.weights_seed, cfg.device,
                               cfg.dtype, cfg.rope_precision, cfg.compile, cfg.hash_checkpoint, ModelKey.of(cfg))

    def serves(self, cfg) -> bool:
        """True when ``cfg`` asks for exactly this pipeline's model and settings."""
        return self.key is not None and self.key == ModelKey.of(cfg)

    # -- the model's geometry -------------------------------------------------------------------
    @property
    def frames_per_chunk(self) -> int:
        """Latent frames generated per chunk (3 for MG2)."""
        return self.preset.frames_per_chunk

    @property
    def vae_spatial_factor(self) -> int:
        """Pixels per latent cell along height and width (8 for the Wan VAE)."""
        return int(getattr(self.world.vae.config, "scale_factor_spatial", 8))

    @property
    def latent_hw(self) -> tuple[int, int]:
        """Latent grid (height, width) of a frame: the preset's pixels / the VAE's spatial factor."""
        f = self.vae_spatial_factor
        return self.preset.height // f, self.preset.width // f

    @property
    def default_budget(self) -> int:
        """MG2's own past slots: the attention window minus the current chunk's latent frames."""
        return self.world.dit.cfg.local_attn_size - self.frames_per_chunk

    # -- per-run work ---------------------------------------------------------------------------
    @torch.no_grad()
    def condition(self, pil_image, num_chunks: int) -> Conditioned:
        """Encode a PIL start image (resized and centre-cropped to the preset) for a rollout of
        ``num_chunks`` chunks.

        Raises:
            InputError: an image too small for the preset's crop.
        """
        from .model.conditioning import build_conditioning, preprocess_image

        image = preprocess_image(pil_image, self.preset.height, self.preset.width).to(self.device, self.dtype)
        latents, visual_context = build_conditioning(image, self.world.vae, self.world.clip,
                                                     num_chunks * self.frames_per_chunk)
        return Conditioned(latents, visual_context)

    def rollout(self, writer, conditioned: Conditioned, keyboard: torch.Tensor, mouse: torch.Tensor | None,
                seed: int, noise=None, on_step=None):
        """A fresh :class:`~worldtrace_cli.rollout.Rollout` of this model through ``writer`` (reset).

        Args:
            keyboard: [1, R, keyboard_dim] action rows (pixel frames); mouse: [1, R, 2] or None.
            seed: noise seed (chunk c draws from ``chunk_generator(seed, c)``).
        """
        from .model.sampler import FlowMatchSchedule
        from .rollout import Rollout

        schedule = FlowMatchSchedule(self.preset.denoising_steps, self.preset.timestep_shift)
        return Rollout(self.world.dit, writer, conditioned.latents, conditioned.visual_context, keyboard, mouse,
                       schedule, seed, self.device, self.latent_hw, self.frames_per_chunk, noise=noise,
                       on_step=on_step, poses=self.latent_poses(keyboard, mouse))

    def latent_poses(self, keyboard: torch.Tensor, mouse: torch.Tensor | None) -> torch.Tensor:
        """Camera-to-world pose of every latent frame the actions reach, by the one motion model.

        Args:
            keyboard: [1, R, keyboard_dim] action rows; mouse: [1, R, 2] or None.
        Returns:
            float64 [N, 4, 4] (OpenCV axes), N = 1 + (R - 1) // 4 latent frames for R pixel frames.
        """
        from .world.motion import camera_to_world, frame_poses, latent_frame_poses

        pixel = frame_poses(self.preset.mode, keyboard[0].cpu(), None if mouse is None else mouse[0].cpu())
        return camera_to_world(latent_frame_poses(pixel, 1 + (pixel.shape[0] - 1) // 4))

    def decoder(self):
        """A fresh :class:`~worldtrace_cli.model.vae.StreamingDecoder` over this model's VAE."""
        from .model.vae import StreamingDecoder

        return StreamingDecoder(self.world.vae)

    def build_writer(self, memory):
        """The cache writer ``memory`` (a MemoryConfig) names, with this model's default budget.

        Raises:
            InputError: unknown writer, scheme or invalid settings.
        """
        from .memory import build_writer

        return build_writer(memory, self.default_budget)
