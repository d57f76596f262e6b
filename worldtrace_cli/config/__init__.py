"""Frozen run configuration: dataclass defaults < preset YAML < command-line flags.

Presets are data-only YAML files shipped in ``worldtrace_cli/presets/`` (or any path given to
``--preset``). Unknown keys are errors naming the file and key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import InputError
from ..writer_options import LANDMARK_TAU, MemoryConfig  # noqa: F401  (re-exported: RunConfig.memory's type)
from .backbones import BACKBONES, DEFAULT_ARCHITECTURE, Backbone, backbone, load_plugins, register_backbone  # noqa: F401  (re-exported)
from .rules import BACKENDS, check_backend, check_family, check_preset_values  # noqa: F401  (re-exported)

MODES = ("universal", "gta_drive", "templerun", "text")  # text: prompt segments (the selfforcing architecture)
_PRESET_KEYS = {"description", "mode", "height", "width", "fps", "denoising_steps", "timestep_shift",
                "weights", "vae", "clip", "files", "dit", "frames_per_chunk", "bundle", "world", "architecture",
                "landmark_threshold", "sampler", "context_noise", "extends"}
_FILE_ROLES = ("dit", "vae", "clip", "text_encoder", "tokenizer", "lora")  # lora: LongLive's adapter
# Preset keys that are only defaults of run settings (the tau a run uses is memory.landmark_threshold): not
# part of what a training run or a generated video is made with
PRESET_DEFAULTS_ONLY = ("landmark_threshold",)
# Preset keys added after runs and training folders were recorded, with the value those were made with
# RunConfig fields added after runs were recorded, and the value older runs were made with
RUN_ADDED = {"attention_stats": False, "attention_queries": 0, "backend": "native"}
PRESET_ADDED = {"architecture": DEFAULT_ARCHITECTURE, "sampler": "renoise", "context_noise": 0}


@dataclass(frozen=True)
class Preset:
    """A model preset: architecture, resolution, sampler and expected checkpoint files.

    Attributes:
        architecture: its backbone row (:mod:`~worldtrace_cli.config.backbones`): ``mg2``
            (Matrix-Game-2.0: ``dit`` is a :class:`~worldtrace_cli.model.config.DiTConfig`), ``lingbot``
            (LingBot-World causal fast, lingbot-architecture.md: ``dit`` is a
            :class:`~worldtrace_cli.model.lingbot.config.LingbotConfig` whose ``local_attn_size`` /
            ``sink_size`` are the official run's cache, 18 / 6; ``frames_per_chunk`` 4) or
            ``selfforcing`` (Self-Forcing / LongLive v1.0, selfforcing-architecture.md: a ``t2v``
            LingbotConfig, mode ``text``, 3 latent frames per chunk; Self-Forcing's global cache -1 / 0,
            LongLive's window 12 with a sink of 3).
        height, width: pixel resolution of generated frames (multiples of 16).
        denoising_steps: nominal steps (warped by the sampler); ``timestep_shift`` 5.0.
        sampler: ``renoise`` (MG2's: x0 at each step, re-noised with fresh noise) or ``euler`` (the
            deterministic flow-ODE step; :func:`~worldtrace_cli.model.sampler.next_x`); MG2
            architecture only (LingBot has its own sampler).
        context_noise: the timestep (0-999) of each chunk's context pass, which then reads the chunk's
            latents noised to sigma = context_noise / 1000 (:meth:`~worldtrace_cli.engine.rollout.Rollout.context`):
            for a DiT trained with ``train dit --context-noise``. MG2's inference configs name it and
            set it to 0 (mg2-architecture.md §2.2), the default: the clean context pass. MG2 architecture only.
        weights: ``random`` (seeded random weights, e.g. ``tiny``), ``checkpoint`` (an official
            folder) or ``bundled`` (one safetensors file shipped with the presets: ``bundle``).
        vae, clip: variant names of the shipped VAE / CLIP configs.
        files: checkpoint-relative paths of the ``dit``, ``vae`` and ``clip`` weight files (LingBot:
            ``dit`` is the diffusers folder ``transformers``, plus ``text_encoder`` / ``tokenizer``
            folders; its ``clip`` file is optional, needed only by ``--metrics all``).
        bundle: file name of a ``bundled`` preset's weights (``dit.*``, ``vae.*``, ``clip.*``), in
            the presets folder (or beside a preset YAML).
        world: ``procedural`` or ``towers`` (a style of the procedural world) for a model of it
            (start image rendered from the world, ground-truth metrics), else None.
        landmark_threshold: the landmark detector's tau calibrated for this model (a cosine
            distance in (0, 2]; ``worldtrace bench tau``), used when ``--landmark-threshold`` is not
            given; None: :data:`LANDMARK_TAU` (0.1, the paper's). Only a default: the value a run
            uses is its ``memory.landmark_threshold`` (:func:`memory_config`).
    """

    name: str
    mode: str
    height: int
    width: int
    dit: object  # the backbone row's ``dit_config`` (DiTConfig, LingbotConfig)
    description: str = ""
    fps: float = 25.0
    denoising_steps: tuple[int, ...] = (1000, 666, 333)
    timestep_shift: float = 5.0
    frames_per_chunk: int = 3
    weights: str = "checkpoint"
    vae: str = "wan2.1"
    clip: str = "vit-h-14"
    files: dict[str, str] = field(default_factory=dict)
    bundle: str | None = None
    world: str | None = None
    architecture: str = DEFAULT_ARCHITECTURE
    landmark_threshold: float | None = None
    sampler: str = "renoise"
    context_noise: int = 0

    @property
    def backbone(self) -> Backbone:
        """What this preset's backbone takes and supports (:mod:`~worldtrace_cli.config.backbones`)."""
        return backbone(self.architecture)

    @property
    def has_world(self) -> bool:
        """True for a model of the procedural world: its start image is the world's view and its
        frames are scored against the world's renders (ground truth)."""
        return self.world is not None  # a world style of world/scene.py (checked at load)

    @property
    def window(self) -> int:
        """Latent frames the model attends over, current chunk included: ``local_attn_size`` (MG2's 6
        for universal, 4 for gta_drive; LingBot's 18, also for a global cache: its trained window;
        Self-Forcing's global cache: the 21 latent frames it was trained on; LongLive's 12)."""
        return self.dit.local_attn_size if self.dit.local_attn_size > 0 else self.backbone.global_window

    @property
    def default_budget(self) -> int:
        """The model's own past latent-frame slots: window - frames per chunk (MG2 universal 6 - 3,
        LingBot 18 - 4)."""
        return self.window - self.frames_per_chunk

    def to_dict(self, training: bool = False) -> dict[str, Any]:
        """JSON-able fields; ``training=True`` leaves out :data:`PRESET_DEFAULTS_ONLY` (defaults of
        inference flags, which do not change what a trainer does)."""
        d = asdict(self)
        d["dit"] = self.dit.to_dict()
        d["denoising_steps"] = list(self.denoising_steps)
        return {k: v for k, v in d.items() if k not in PRESET_DEFAULTS_ONLY} if training else d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Preset":
        """Inverse of :meth:`to_dict` (a resumed run rebuilds its exact preset from summary data)."""
        d = dict(d)
        d["dit"] = backbone(d.get("architecture", DEFAULT_ARCHITECTURE)).load("dit_config").from_dict(d["dit"])
        d["denoising_steps"] = tuple(d["denoising_steps"])
        return cls(**d)


def preset_names() -> list[str]:
    """Names of the built-in presets."""
    return sorted(p.name[:-5] for p in resources.files("worldtrace_cli.presets").iterdir() if p.name.endswith(".yaml"))


def default_preset_name(mode: str, checkpoint) -> str:
    """The preset a run uses when none is named: ``mg2-<mode>`` with a checkpoint, else the trained
    embedded world ``loopworld`` for universal trajectories and the random ``tiny-<mode>`` otherwise;
    prompt segments (mode ``text``): ``self-forcing`` with a checkpoint, else ``self-forcing-tiny``."""
    if mode == "text":
        return "self-forcing" if checkpoint else "self-forcing-tiny"
    if checkpoint:
        return f"mg2-{mode.replace('_', '-')}"
    return "loopworld" if mode == "universal" else f"tiny-{mode.replace('_', '-')}"


def load_preset(name_or_path: str) -> Preset:
    """Load a built-in preset by name (``tiny``, ``mg2-universal``, ...) or a preset YAML file.

    A preset with ``extends: NAME`` starts from the built-in preset NAME's keys and replaces those
    it gives (whole values: a ``dit`` given replaces the base's); an inherited ``bundle`` stays the
    base's file. One level: the base may not extend another.

    Raises:
        InputError: unknown preset, malformed YAML, unknown keys or bad values (message names the file).
    """
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text, source, name = path.read_text(), str(path), path.stem
    else:
        res = resources.files("worldtrace_cli.presets").joinpath(f"{name_or_path}.yaml")
        if not res.is_file():
            raise InputError(f"--preset: unknown preset {name_or_path!r} (built-in: {', '.join(preset_names())})")
        text, source, name = res.read_text(), f"preset {name_or_path}", name_or_path
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())  # a ReaderError has no problem
        raise InputError(f"{source}{where}: invalid YAML: {reason}") from None
    if not isinstance(raw, dict):
        raise InputError(f"{source}: a preset must be a mapping")
    unknown = sorted(set(raw) - _PRESET_KEYS)
    if unknown:
        raise InputError(f"{source}: unknown keys: {', '.join(unknown)}")
    own_bundle = "bundle" in raw
    if "extends" in raw:
        raw = {**_base_preset(raw.pop("extends"), source), **raw}
    missing = [k for k in ("mode", "height", "width", "dit") if k not in raw]
    if missing:
        raise InputError(f"{source}: missing keys: {', '.join(missing)}")
    from ..errors import CheckpointError

    broken: list[str] = []
    if raw.get("architecture", DEFAULT_ARCHITECTURE) not in BACKBONES:
        broken = load_plugins(strict=False)  # a backbone another installed package declares
    if raw.get("architecture", DEFAULT_ARCHITECTURE) not in BACKBONES:
        if broken:  # the plugin that may have declared it did not load: say which
            more = f" (and {len(broken) - 1} more broken plugins)" if len(broken) > 1 else ""
            raise InputError(broken[0] + more)
        raise InputError(f"{source}: architecture: must be one of {', '.join(BACKBONES)}, got {raw['architecture']!r}")
    check_preset_values(raw, source)
    try:
        dit = backbone(raw.get("architecture", DEFAULT_ARCHITECTURE)).load("dit_config").from_dict(raw.pop("dit"), f"{source}: dit")
    except (CheckpointError, TypeError) as exc:
        raise InputError(str(exc)) from None
    if raw["mode"] not in MODES:
        raise InputError(f"{source}: mode: must be one of {', '.join(MODES)}, got {raw['mode']!r}")
    row = backbone(raw.get("architecture", DEFAULT_ARCHITECTURE))
    for key in ("height", "width"):
        if not isinstance(raw[key], int) or raw[key] <= 0 or raw[key] % 16:
            raise InputError(f"{source}: {key}: must be a positive multiple of 16, got {raw[key]!r}")
    if raw.get("weights", "checkpoint") not in ("random", "checkpoint", "bundled"):
        raise InputError(f"{source}: weights: must be 'random', 'checkpoint' or 'bundled'")
    if (raw.get("weights") == "bundled") != bool(raw.get("bundle")):
        raise InputError(f"{source}: bundle: a file name is needed with weights: bundled, and only then")
    if raw.get("world") not in (None, "procedural", "towers"):  # world/scene.py: STYLES
        raise InputError(f"{source}: world: must be 'procedural', 'towers' or absent, got {raw.get('world')!r}")
    files = raw.pop("files", None) or {}
    if set(files) - set(_FILE_ROLES):
        raise InputError(f"{source}: files: unknown roles {sorted(set(files) - set(_FILE_ROLES))}")
    if "denoising_steps" in raw:
        raw["denoising_steps"] = tuple(raw["denoising_steps"])
    check_family(raw, dit, source, row)
    preset = Preset(name=name, dit=dit, files=dict(files), **raw)
    try:
        row.official_cache(preset)  # the release's cache must fit the DiT config's window and sink
    except ValueError as exc:
        raise InputError(f"{source}: dit: {exc}") from None
    if own_bundle and raw.get("bundle") and path.suffix in (".yaml", ".yml") and path.is_file():
        preset = replace(preset, bundle=str((path.parent / raw["bundle"]).resolve()))  # a preset file's bundle lies beside it
    return preset


def _base_preset(base, source: str) -> dict:
    """The keys of the built-in preset ``base`` that a preset ``extends`` (``source`` names the
    extending file in errors). Raises InputError: not a built-in name, or a base that extends."""
    names = preset_names()
    if not isinstance(base, str) or base not in names:
        raise InputError(f"{source}: extends: must name a built-in preset ({', '.join(names)}), got {base!r}"[:300])
    raw = yaml.safe_load(resources.files("worldtrace_cli.presets").joinpath(f"{base}.yaml").read_text())
    if "extends" in raw:
        raise InputError(f"{source}: extends: preset {base} extends another preset itself (one level only)")
    return raw


@dataclass(frozen=True)
class RunConfig:
    """Everything one ``worldtrace generate`` run needs, resolved (written into summary.json).

    Attributes:
        chunks: number of chunks (None = the trajectory's length); seed: noise seed (None = the trajectory's,
            else 0); device: ``auto`` | ``cuda`` | ``cpu``; dtype: ``auto`` | ``bf16`` | ``fp32``.
        checkpoint: official MG2 folder (required by checkpoint presets unless ``random_weights``).
        weights_seed: seed of random weights (tiny preset, ``--random-weights``).
        world_seed: the procedural world a ``world: procedural`` preset (loopworld) runs in; its
            view from the start pose is the conditioning image and its renders are the ground truth.
        metrics: ``none`` | ``fast`` (TempSSIM, LatentDiff) | ``all`` (+ CLIP Scene Drift, PAC).
        save_every: save a resume state every this many chunks (0: only on Ctrl-C / SIGTERM).
        rope_precision: ``float32`` | ``float64``: RoPE tables' dtype (both replay the golden fixtures).
        compile: ``none`` | ``default`` | ``reduce-overhead`` | ``max-autotune``: torch.compile of the
            DiT blocks' pure parts (:func:`~worldtrace_cli.model.speed.compile_blocks`).
        overlap_decode: decode each chunk while the next one is generated
            (:class:`~worldtrace_cli.engine.decode.DecodePipeline`).
        prompt, poses, intrinsics: LingBot presets only: the text prompt and LingBot's own
            ``poses.npy`` / ``intrinsics.npy`` (override the trajectory's ``prompt`` / ``poses`` /
            ``intrinsics``; without poses the trajectory's actions drive the camera).
        prompt_switch: text-to-video presets: ``recache`` (LongLive's), ``recache-keep-sink``, ``plain``.
        attention_stats: measure each chunk's attention per cache slot (``--attention-stats``,
            :meth:`~worldtrace_cli.engine.rollout.ChunkRollout.measure_attention`); attention_queries:
            a seeded sample of that many query tokens per layer (0: all).
        weights_dtype: ``auto`` (the run's dtype) or ``fp8`` (:func:`~worldtrace_cli.model.speed.store_weights`);
            offload: ``text`` (umT5 on the GPU only to encode) or ``blocks`` (:func:`~worldtrace_cli.model.speed.offload_blocks`).
        prefix: a real video the run continues (an MP4, a folder of frames, or ``truth:K``), its
            chunks committed to the cache instead of generated; prefix_chunks: take only its first K
            chunks (the rest scores the continuation); reference: the frames that follow the prefix,
            from another file (:mod:`worldtrace_cli.continuation`, docs/continue.md).
        backend: ``native`` (worldtrace's DiT) or one of the backbone row's ``dit_backends``: ``diffusers``
            (diffusers' ``WanTransformer3DModel`` in the same chunk loop,
            :mod:`worldtrace_cli.integrations.diffusers_backend`; Self-Forcing / LongLive presets).
    Raises:
        InputError: an unknown ``backend``, one the preset's backbone row does not list
            (:attr:`~worldtrace_cli.config.backbones.Backbone.backends`), or settings it does not take
            (:meth:`check_backend`).
    """

    preset: Preset
    trajectory: Path
    output: Path
    image: Path | None = None
    chunks: int | None = None
    seed: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    checkpoint: Path | None = None
    random_weights: bool = False
    weights_seed: int = 0
    world_seed: int = 0
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    overwrite: bool = False
    progress: bool = True
    hash_checkpoint: bool = False
    metrics: str = "fast"
    save_every: int = 16
    rope_precision: str = "float32"
    compile: str = "none"
    overlap_decode: bool = False
    prompt: str | None = None
    poses: Path | None = None
    intrinsics: Path | None = None
    prompt_switch: str = "recache"
    weights_dtype: str = "auto"
    offload: str = "text"
    attention_stats: bool = False
    attention_queries: int = 0
    prefix: str | None = None
    prefix_chunks: int | None = None
    reference: Path | None = None
    backend: str = "native"

    def __post_init__(self):
        self.check_backend()

    def check_backend(self) -> None:
        """Refuse, before anything loads, a ``--backend`` this run cannot take (:func:`check_backend`)."""
        check_backend(self.preset, self.backend, self.compile, self.rope_precision, self.weights_dtype, self.offload)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (``summary.json``'s ``config``, resume states): the preset's dict and the memory
        settings in their flat form (:meth:`MemoryConfig.to_dict`)."""
        d = asdict(self)
        d["preset"] = self.preset.to_dict()
        d["memory"] = self.memory.to_dict()
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunConfig":
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["preset"] = Preset.from_dict(d["preset"])
        d["memory"] = MemoryConfig.from_dict(d["memory"])
        for key in ("trajectory", "output", "image", "checkpoint", "poses", "intrinsics", "reference"):
            if d.get(key) is not None:
                d[key] = Path(d[key])
        return cls(**d)


def default_cache(preset: Preset) -> dict:
    """MemoryConfig fields of the cache a preset's model was run with officially, used when no
    ``--cache`` is given (its backbone's ``official_cache``): MG2 ``sliding`` (its own window);
    LingBot the README's sink of ``sink_size`` frames in a window of ``local_attn_size`` latent frames
    at true offsets (6 and 18 -> ``sink``, budget 14); Self-Forcing's global cache ``full``."""
    return preset.backbone.official_cache(preset)


def memory_config(cache: str, spill_dir=None, preset: Preset | None = None, **options) -> MemoryConfig:
    """:func:`~worldtrace_cli.cli.options.memory_options` values (the shared ``positions``, ``budget``,
    ``summary_slots``, ``recent_slots`` and every writer's own settings by field name, None = not
    given) and a writer spec as a :class:`MemoryConfig` (:meth:`MemoryConfig.of`). For a writer with
    the landmark detector, ``landmark_threshold`` not given is the ``preset``'s calibrated tau when it
    has one (:attr:`Preset.landmark_threshold`: loopworld 0.0047), else :data:`LANDMARK_TAU`.
    Settings the writer does not read stay in the config, so :func:`~worldtrace_cli.writer_options.check_flags`
    refuses them by name."""
    from ..writer_options import WRITER_OPTIONS

    row = WRITER_OPTIONS.get(cache.split(":", 1)[0])
    if (options.get("landmark_threshold") is None and row is not None and "landmark_threshold" in row.flags
            and preset is not None and preset.landmark_threshold is not None):
        options["landmark_threshold"] = preset.landmark_threshold
    if spill_dir is not None:
        options["spill_dir"] = str(spill_dir)
    return MemoryConfig.of(cache, **options)


def memory_configs(caches: list[str], preset: Preset | None = None, **options) -> dict[str, MemoryConfig]:
    """One command line's memory flags for several writers (``compare``, ``loopbench run``), by spec:
    the shared settings go to every writer; a writer's own setting goes to the listed writers that
    read it (``--landmark-threshold 0.3`` with ``sliding,landmark`` sets landmark's tau and leaves
    sliding alone). A setting none of them reads goes to all, so the first writer's check refuses
    it by name (:func:`~worldtrace_cli.writer_options.check_flags`). Each as :func:`memory_config`."""
    from ..writer_options import settings_for

    mine = {c: settings_for(c, options) for c in caches}
    unread = {k: v for k, v in options.items() if v is not None and not any(k in m for m in mine.values())}
    return {c: memory_config(c, preset=preset, **mine[c], **unread) for c in caches}
