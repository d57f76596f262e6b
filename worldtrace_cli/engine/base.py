"""What every loaded world model shares (docs/architecture.md §1): device and dtype resolution, library
versions, the key that says when two runs can share a loaded model, :class:`RunConditioning` (what a
run is conditioned on, passed as an argument) and :class:`PipelineBase`, the interface the jobs use
(:mod:`worldtrace_cli.engine.pipeline` builds the class the preset's backbone row names: MG2's,
LingBot-World's, Self-Forcing / LongLive's or a registered one).
"""

from __future__ import annotations

import logging
import platform
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..errors import InputError

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


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # --dtype's names


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bf16 on cuda, fp32 on cpu; ``bf16`` / ``fp32`` as named.

    Raises:
        InputError: an unknown name.
    """
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise InputError(f"--dtype: must be auto, bf16 or fp32, got {name!r}")
    return DTYPES[name]


def versions() -> dict:
    """Versions of Python, torch and the libraries around the core (for summary.json)."""
    import importlib.metadata as md

    try:  # the installed distribution's version (the package's __version__ is the same; importing it would cycle)
        own = md.version("worldtrace")
    except md.PackageNotFoundError:
        own = None
    out = {"worldtrace": own, "python": platform.python_version(), "torch": torch.__version__}
    for name in ("diffusers", "transformers", "imageio-ffmpeg", "safetensors"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    out["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


@dataclass
class RunConditioning:
    """What a run is conditioned on, for every backbone: :meth:`PipelineBase.condition` reads what its
    backbone's row declares it takes (:mod:`~worldtrace_cli.config.backbones`) and refuses the rest.

    Attributes:
        num_chunks: the run's length in chunks (a live session's: the most its conditioning covers).
        image: the PIL start image (``start_image`` backbones).
        prompt: the run's text prompt (``run_prompt`` backbones: LingBot-World; "" for none).
        prompts: every chunk's prompt known now (prompt-segment backbones; a live session's grow as it goes).
        camera: a LingBot run's :class:`~worldtrace_cli.model.lingbot.inputs.LingbotInputs` (its poses and
            intrinsics files; ``camera_files`` backbones), or None.
        switch: what a prompt switch does to the cache (``recache``, ``recache-keep-sink``, ``plain``).
    """

    num_chunks: int
    image: object = None
    prompt: str | None = None
    prompts: list | None = None
    camera: object = None
    switch: str = "recache"

    @classmethod
    def of(cls, cfg, num_chunks: int, *, image=None, prompt: str | None = None, prompts: list | None = None,
           camera=None) -> "RunConditioning":
        """The one builder of a run's conditioning (``generate``, sessions and ``bench speed`` alike): what
        ``cfg``'s backbone row says it takes, the rest dropped.

        Args:
            cfg: the run's :class:`~worldtrace_cli.config.RunConfig` (its preset's backbone row, its
                ``prompt`` and ``prompt_switch``).
            num_chunks: the chunks the conditioning covers.
            image: the PIL start image, or None (passed on as given: a backbone that takes none refuses one).
            prompt: the run's prompt (``run_prompt`` rows); None: ``cfg.prompt``. Its own field, never read
                off the camera files.
            prompts: every chunk's prompt (prompt-segment rows), or None.
            camera: the camera files (``camera_files`` rows:
                :class:`~worldtrace_cli.model.lingbot.inputs.LingbotInputs`), or None.
        """
        row = cfg.preset.backbone
        prompt = cfg.prompt if prompt is None else prompt
        return cls(num_chunks, image, prompt if row.run_prompt else None, prompts if row.takes_prompts else None,
                   camera if row.camera_files else None, cfg.prompt_switch)


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
    weights_dtype: str = "auto"
    offload: str = "text"
    backend: str = "native"  # generate --backend (the text pipeline's DiT: worldtrace's or diffusers')

    @classmethod
    def of(cls, cfg) -> "ModelKey":
        """The key a :class:`~worldtrace_cli.config.RunConfig` needs (device and dtype resolved)."""
        import json

        device = resolve_device(cfg.device)
        return cls(json.dumps(cfg.preset.to_dict(), sort_keys=True, default=str),
                   None if cfg.checkpoint is None else str(cfg.checkpoint), bool(cfg.random_weights),
                   cfg.weights_seed, str(device), str(resolve_dtype(cfg.dtype, device)), cfg.rope_precision,
                   cfg.compile, bool(cfg.hash_checkpoint), cfg.weights_dtype, cfg.offload,
                   getattr(cfg, "backend", "native"))


def check_speed(rope_precision: str, compile_mode: str) -> None:
    """Check ``--rope-precision`` and ``--compile`` (:data:`~worldtrace_cli.model.speed.ROPE_PRECISIONS`,
    :data:`~worldtrace_cli.model.speed.COMPILE_MODES`) before a model loads; both pipelines apply
    them with :func:`~worldtrace_cli.model.speed.configure_speed` once it has.

    Raises:
        InputError: an unknown precision or compile mode (names the flag and the choices).
    """
    from ..model.speed import COMPILE_MODES, ROPE_PRECISIONS

    if rope_precision not in ROPE_PRECISIONS:
        raise InputError(f"--rope-precision: must be one of {', '.join(ROPE_PRECISIONS)}, got {rope_precision!r}")
    if compile_mode not in COMPILE_MODES:
        raise InputError(f"--compile: must be one of {', '.join(COMPILE_MODES)}, got {compile_mode!r}")


READS = ("image", "prompt", "prompts", "camera_files", "clip", "text", "poses")  # what a pipeline class may read


def expected_reads(row) -> frozenset:
    """What a pipeline class must declare it reads (:attr:`PipelineBase.reads`) to serve the backbone
    ``row`` (:class:`~worldtrace_cli.config.backbones.Backbone`): ``image`` iff ``start_image``, ``prompt``
    iff ``run_prompt`` without prompt segments (a segment backbone folds ``--prompt`` into its
    ``prompts``), ``prompts`` iff prompt segments, ``camera_files`` iff ``camera_files``, ``clip`` iff
    ``clip_conditioning``, ``text`` iff ``text_encoder``; ``poses`` (``latent_poses`` gives camera poses)
    whenever the row says ``camera`` (a row may leave out a camera its class has: it then runs no pose writer)."""
    wanted = {"image": row.start_image, "prompt": row.run_prompt and not row.takes_prompts,
              "prompts": row.takes_prompts, "camera_files": row.camera_files, "clip": row.clip_conditioning,
              "text": row.text_encoder, "poses": row.camera}
    return frozenset(name for name, on in wanted.items() if on)


def check_row(row, cls) -> None:
    """Refuse a registry row whose capability flags disagree with its pipeline class.

    Raises:
        TypeError: ``cls`` is not a concrete :class:`PipelineBase` (an abstract method left), or its
            :attr:`~PipelineBase.reads` differ from :func:`expected_reads` (``poses``: the class may have
            them when the row leaves them out). The message names the row and the difference.
    """
    import inspect

    if not (isinstance(cls, type) and issubclass(cls, PipelineBase)) or inspect.isabstract(cls):
        missing = sorted(getattr(cls, "__abstractmethods__", ())) or ["PipelineBase"]
        raise TypeError(f"backbone {row.architecture!r}: {getattr(cls, '__name__', cls)} is not a whole PipelineBase "
                        f"(missing: {', '.join(missing)})")
    want, have = expected_reads(row), frozenset(cls.reads)
    if not row.camera:
        have = have - {"poses"}
    if want != have:
        raise TypeError(f"backbone {row.architecture!r}: its row says {sorted(want)}, {cls.__name__}.reads "
                        f"{sorted(have)} (docs/architecture.md, section 1b)")


class PipelineBase(ABC):
    """A preset's networks loaded once on one device and dtype, with fixed speed settings: the declared
    interface every backbone's pipeline implements (one class per backbone, each named by its registry
    row: :mod:`~worldtrace_cli.config.backbones`; :func:`check_row` holds a row to its class).

    Abstract: :meth:`from_preset`, :meth:`condition`, :meth:`plan_conditioning`, :meth:`rollout`,
    :meth:`latent_poses`. Declared: :attr:`reads`, what :meth:`condition` and the rollout read (names
    in :data:`READS`). Attributes: ``preset``, ``world`` (the loaded networks), ``device``, ``dtype``,
    ``rope_precision``, ``compile_mode``, ``key`` (:class:`ModelKey`), ``load_seconds``.
    """

    reads: frozenset = frozenset()

    def __init__(self, preset, world, device: torch.device, dtype: torch.dtype, rope_precision: str,
                 compile_mode: str, key: ModelKey | None = None, load_seconds: float = 0.0):
        self.preset, self.world, self.device, self.dtype = preset, world, device, dtype
        self.rope_precision, self.compile_mode = rope_precision, compile_mode
        self.key, self.load_seconds = key, load_seconds

    @classmethod
    @abstractmethod
    def from_preset(cls, preset, checkpoint=None, random_weights: bool = False, weights_seed: int = 0,
                    device: str = "auto", dtype: str = "auto", rope_precision: str = "float32",
                    compile_mode: str = "none", hash_checkpoint: bool = False, key: ModelKey | None = None):
        """Load ``preset``'s networks (the subclass's loader) and return the pipeline."""

    @abstractmethod
    def condition(self, request: RunConditioning):
        """The backbone's prepared conditioning of one run from ``request`` (what :attr:`reads` names).

        Raises:
            InputError: an input the backbone needs and did not get, or one it refuses."""

    @abstractmethod
    def plan_conditioning(self, text_rows: int = 512):
        """What :meth:`condition` returns at the run's shapes, without computing it (the memory plan)."""

    @abstractmethod
    def rollout(self, writer, conditioned, keyboard=None, mouse=None, seed: int = 0, noise=None, on_step=None,
                rows: int | None = None):
        """A fresh :class:`~worldtrace_cli.engine.rollout.ChunkRollout` of ``conditioned`` through ``writer``
        (reset). ``keyboard`` [1, R, kd] / ``mouse`` [1, R, 2]: a whole run's rows, from which it feeds itself
        (its own :class:`~worldtrace_cli.engine.feed.ConditioningFeed`); None: each step is given its
        request. ``rows``: the run's pixel frames when fed per chunk (a camera track's length)."""

    @abstractmethod
    def latent_poses(self, keyboard, mouse):
        """float64 [N, 4, 4] camera-to-world pose of every latent frame the actions reach, or None (no camera)."""

    @classmethod
    def _loaded(cls, preset, load_world, device: str, dtype: str, rope_precision: str, compile_mode: str,
                key: ModelKey | None):
        """The common tail of :meth:`from_preset`: resolve ``device`` and ``dtype``, load the networks
        with ``load_world(device, dtype)`` (timed: ``load_seconds``), apply the speed settings
        (:func:`~worldtrace_cli.model.speed.configure_speed`) and build the pipeline."""
        import time

        from ..model.speed import configure_speed

        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        start = time.perf_counter()
        world = load_world(dev, dt)
        configure_speed(world.dit, rope_precision, compile_mode)
        if compile_mode != "none":
            log.info(f"--compile {compile_mode}: the first chunk includes compiling the DiT blocks")
        return cls(preset, world, dev, dt, rope_precision, compile_mode, key, time.perf_counter() - start)

    @classmethod
    def from_config(cls, cfg) -> "PipelineBase":
        """The pipeline a :class:`~worldtrace_cli.config.RunConfig` asks for (its ``weights_dtype``:
        :func:`~worldtrace_cli.model.speed.store_weights`; its ``offload`` ``blocks``: the networks load
        into host memory, all but the DiT move to the device, and the DiT's blocks visit it one at a
        time, :func:`~worldtrace_cli.model.speed.offload_blocks`).

        Raises:
            InputError: ``fp8`` weights or block offloading with ``--compile`` (not measured together yet)."""
        from ..model.layout import check_weight_hooks
        from ..model.speed import offload_blocks, store_weights
        from . import shard

        check_weight_hooks(cfg.weights_dtype, cfg.offload, cfg.compile)

        device, dtype = cfg.device, cfg.dtype
        hosted = cfg.offload == "blocks" or shard.active()
        if hosted:  # load on the host in the device's dtype, then move all but the DiT
            target = shard.device() if shard.active() else resolve_device(cfg.device)
            dtype = next(name for name, dt in DTYPES.items() if dt == resolve_dtype(cfg.dtype, target))
            device = "cpu"
        pipe = cls.from_preset(cfg.preset, cfg.checkpoint, cfg.random_weights, cfg.weights_seed, device,
                               dtype, cfg.rope_precision, cfg.compile, cfg.hash_checkpoint, ModelKey.of(cfg))
        stored = store_weights(pipe.world.dit, cfg.weights_dtype, pipe.dtype)
        if stored:
            log.info(f"--weights-dtype {cfg.weights_dtype}: {stored / 1e6:.1f} M DiT parameters stored in float8")
        if hosted:
            for net in (pipe.world.vae, pipe.world.clip):
                if net is not None:
                    net.to(target)
            if getattr(pipe.world, "text", None) is not None:
                pipe.world.text.keep_on_host(target)
            pipe.device = target
        if shard.active():
            log.info(shard.place_dit(pipe.world.dit, target))
        elif cfg.offload == "blocks":
            blocks = offload_blocks(pipe.world.dit, target)
            log.info(f"--offload blocks: {blocks} DiT blocks in host memory, each on {target} for its own forward")
        return pipe

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
    def window(self) -> int:
        """Latent frames the model attends over, current chunk included (:attr:`Preset.window`)."""
        return self.preset.window

    @property
    def default_budget(self) -> int:
        """The model's own past slots: window - frames per chunk (:attr:`Preset.default_budget`)."""
        return self.preset.default_budget

    def feed(self, plan, conditioned):
        """The one feed of a run of ``conditioned`` over ``plan`` (an ActionPlan, which may grow): a
        :class:`~worldtrace_cli.engine.feed.ConditioningFeed` whose requests carry the camera's poses when
        the backbone has a camera (its row's ``camera``)."""
        from .feed import ConditioningFeed

        return ConditioningFeed(plan, camera=self.preset.backbone.camera)

    @torch.no_grad()
    def encode_prefix(self, frames) -> torch.Tensor:
        """A real video's latents, to commit as a run's first chunks (``--prefix``;
        :meth:`~worldtrace_cli.engine.rollout.ChunkRollout.set_prefix`): the frames encoded by this
        preset's VAE in one causal pass, the posterior's mode normalised per channel as generated
        latents are (:func:`~worldtrace_cli.model.vae.encode_video`, MG2 spec §14).

        Args:
            frames: uint8 ``[T, H, W, 3]`` (numpy or torch) at the preset's size, ``T = 1 + 4 (K F - 1)``
                pixel frames for ``K`` whole chunks of ``F`` latent frames (9 + 12 (K - 1) for MG2).
        Returns:
            float32 ``[1, C, K F, H / 8, W / 8]`` on the CPU.
        Raises:
            ValueError: another frame size, or a frame count that is not whole chunks.
        """
        from ..model.vae import encode_video

        video = torch.as_tensor(frames)
        T = int(video.shape[0])
        fpc = self.frames_per_chunk
        if (video.dim() != 4 or tuple(video.shape[1:]) != (self.preset.height, self.preset.width, 3)
                or T < 1 or (T - 1) % 4 or ((T - 1) // 4 + 1) % fpc):
            raise ValueError(f"prefix frames {list(video.shape)}: expected [1 + 4 (K * {fpc} - 1), "
                             f"{self.preset.height}, {self.preset.width}, 3]")
        vae = self.world.vae
        param = next(vae.parameters())
        x = video.to(param.device).permute(3, 0, 1, 2).to(param.dtype).div(127.5).sub(1.0)[None]
        return encode_video(vae, x).cpu()

    def decoder(self):
        """A fresh :class:`~worldtrace_cli.model.vae.StreamingDecoder` over this model's VAE."""
        from ..model.vae import StreamingDecoder

        return StreamingDecoder(self.world.vae)

    def build_writer(self, memory):
        """The cache writer ``memory`` (a MemoryConfig) names, with this model's default budget and window.

        Raises:
            InputError: unknown writer, scheme or invalid settings.
        """
        from ..memory import build_writer

        return build_writer(memory, self.default_budget, self.window)


__all__ = ["DTYPES", "READS", "ModelKey", "PipelineBase", "RunConditioning", "check_row", "check_speed", "expected_reads", "resolve_device", "resolve_dtype", "versions"]
