"""``open``: a live session from a preset name and writer spec, checked before the model loads."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InputError
from .live import Session
from .storage import check_record

MAX_SEED = 2**63 - 1  # as the CLI's SEED and the trajectory's seed: torch generators take 64-bit seeds


def api_words(message: str) -> str:
    """A writer check's message with the CLI's flags in :func:`open`'s keywords: ``--top-k`` ->
    ``top_k``, ``--cache landmark`` -> ``cache='landmark'``."""
    message = re.sub(r"--cache ([^\s:;,()]+(?::[^\s:;,()]+)?)", lambda m: f"cache={m.group(1)!r}", message)
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)


def open(preset: str = "loopworld", cache: str | None = None, *, checkpoint: str | Path | None = None,
         image: str | Path | None = None, world_seed: int = 0, seed: int = 0, device: str = "auto",
         dtype: str = "auto", compile: str = "none", rope_precision: str = "float32", metrics: str = "fast",
         random_weights: bool = False, weights_seed: int = 0, record: str | Path | None = None,
         overwrite: bool = False, pipeline=None, prompt_switch: str = "recache", prompt: str | None = None,
         attention_stats: bool = False, attention_queries: int = 0, prefix: str | Path | None = None,
         prefix_chunks: int | None = None, backend: str = "native", **writer_options) -> Session:
    """Open a live :class:`Session` (``import worldtrace_cli as wt; s = wt.open("loopworld", cache="landmark")``).

    Args:
        preset: a preset name (``worldtrace presets``) or YAML file of a backbone that runs live (its
            registry row: MG2 and LingBot-World take actions, ``step("forward")``; the text-to-video
            ones prompts, ``step(prompt="...")``).
        cache: the writer spec as ``--cache`` takes it (``sliding``, ``field``, ``landmark``,
            ``mixed:2``, ...); None = the model's own cache.
        checkpoint: the preset's checkpoint folder (as ``--checkpoint``). image: a conditioning image (loopworld
            uses its world's start view, with ground truth, unless given). world_seed: loopworld's
            world. seed: the noise seed (chunk c draws from (seed, c)).
        device, dtype, compile, rope_precision: as ``generate``'s flags. metrics: ``none`` | ``fast`` | ``all``.
        record: a run folder to record into (refused when it holds a run, unless ``overwrite``).
        pipeline: a loaded pipeline to share (``worldtrace play`` shares one between sessions).
        prompt_switch: text-to-video presets: ``recache`` (LongLive's), ``recache-keep-sink`` or ``plain``.
        prompt: the whole run's text prompt of a backbone that takes one (LingBot-World; default none).
        attention_stats: measure each chunk's attention per cache slot (``generate --attention-stats``):
            each slot of ``record["cache"]["slots"]`` gets ``attention``, the cache ``attention``
            (:func:`~worldtrace_cli.outputs.records.most_read_slot` reads which slot a chunk read most).
            attention_queries: a seeded sample of that many query tokens per layer (0: all).
        prefix: a real video to continue (an MP4 or a folder of frames, as ``generate --prefix``): its
            first ``prefix_chunks`` chunks (None: all of it, whole chunks) are committed by the first
            steps instead of generated: ``step(actions)`` for chunk c < K commits the clip's chunk c with
            those actions (the ones it was filmed with) and returns its decoded frames and a record
            marked ``prefix``; later steps generate. Frames after the prefix score the steps after it
            (``ref_psnr``, ...). Its first frame is the start image unless ``image`` is given.
        backend: the DiT's implementation, as ``generate --backend``: ``native`` (worldtrace's) or, for the
            Self-Forcing / LongLive presets, ``diffusers`` (diffusers' ``WanTransformer3DModel`` in the same
            loop: docs/diffusers.md); a shared ``pipeline`` must have been loaded with the same one.
        writer_options: ``generate``'s memory flags as keywords: the shared ``positions``,
            ``budget``, ``summary_slots``, ``recent_slots``, and the writer's own settings
            (``landmark_threshold``, ``sink_frames``, ``top_k``, ...: the fields of its options
            class in :data:`~worldtrace_cli.writer_options.WRITER_OPTIONS`).
    Raises:
        InputError: an unknown preset, writer or option, another writer's setting (``top_k`` for
            ``landmark``), a seed outside ``0 <= x < 2**63``, ``record=''``, a bad image, a backbone
            that does not run live, a setting the backbone does not take (``prompt``, ``prompt_switch``,
            ``world_seed``, ``image``).
        CheckpointError: missing checkpoint files. OutputError / FolderBusy: the record folder.
    """
    from ..config import RunConfig, default_cache, load_preset, memory_config
    from ..trajectory.images import load_image
    from ..memory import build_writer
    from ..engine.pipeline import Pipeline
    from ..writer_options import SLOT_FIELDS, writer_flags

    try:
        resolved = load_preset(preset) if isinstance(preset, (str, Path)) else preset
    except InputError as exc:  # "--preset: unknown preset 'x' ..." in the API's words
        raise InputError(f"open: {api_words(str(exc))}") from None
    if record is not None:
        check_record(record)
    from ..config.backbones import titles_where

    backbone = resolved.backbone
    if not backbone.live:
        raise InputError(f"preset {resolved.name}: {backbone.title} does not run live yet; it runs with worldtrace "
                         f"generate")
    from ..trajectory.prompts import SWITCH_MODES

    if prompt_switch not in SWITCH_MODES:
        raise InputError(f"open: prompt_switch must be one of {', '.join(SWITCH_MODES)}, got {str(prompt_switch)[:40]!r}")
    if prompt is not None and not backbone.run_prompt:
        raise InputError(f"open: prompt= is the whole run's text prompt of {titles_where(lambda r: r.run_prompt)}; "
                         f"preset {resolved.name} takes none" + (" (its chunks take theirs: step(prompt=...))"
                                                                  if backbone.takes_prompts else ""))
    if prompt is not None and (not isinstance(prompt, str) or len(prompt) > 4000):
        raise InputError(f"open: prompt must be text (at most 4,000 characters), got {type(prompt).__name__}")
    if prompt_switch != "recache" and not backbone.takes_prompts:
        raise InputError(f"open: prompt_switch={prompt_switch!r} is for {titles_where(lambda r: r.takes_prompts)} "
                         f"presets; preset {resolved.name} ({backbone.title}) takes actions, not prompts")
    if world_seed != 0 and not resolved.has_world:
        raise InputError(f"open: world_seed={world_seed!r} picks a procedural world; preset {resolved.name} has none "
                         f"(only loopworld-style presets walk a world)")
    options = {**default_cache(resolved), **writer_options} if cache is None else {"cache": cache, **writer_options}
    known = {"positions", *SLOT_FIELDS, *writer_flags()}
    unknown = sorted(set(writer_options) - known)
    if unknown:
        raise InputError(f"open: unknown writer option {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    memory = memory_config(preset=resolved, **options)
    if not isinstance(attention_stats, bool):
        raise InputError(f"open: attention_stats must be True or False, got {attention_stats!r}")
    if isinstance(attention_queries, bool) or not isinstance(attention_queries, int) or attention_queries < 0:
        raise InputError(f"open: attention_queries must be an integer >= 0 (0: every query token), "
                         f"got {attention_queries!r}")
    if attention_queries and not attention_stats:
        raise InputError("open: attention_queries samples the queries of attention_stats: add attention_stats=True")
    for name, value in (("seed", seed), ("world_seed", world_seed)):  # the CLI's range (--seed, --world-seed)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
            raise InputError(f"open: {name} must be an integer with 0 <= {name} < 2**63, got {value!r}")
    if image is not None and not backbone.start_image:
        raise InputError(f"open: image=: preset {resolved.name} ({backbone.title}) takes no start image; only "
                         f"{titles_where(lambda r: r.start_image)} presets do")
    if image is not None:
        load_image(image, (resolved.height, resolved.width))  # decoded now: a bad file is refused before the model
    elif backbone.start_image and not resolved.has_world and prefix is None:
        raise InputError(f"preset {resolved.name}: needs a conditioning image: open(..., image=PATH)")
    try:
        from ..writer_options.checks import check_writer_specs

        check_writer_specs([memory], resolved)  # torch-free first, as generate's checks
        build_writer(memory, resolved.default_budget, resolved.window)  # a --bank-device this machine lacks
    except InputError as exc:  # the CLI's words ("--top-k: --cache landmark ..."), in the API's
        raise InputError(f"open: {api_words(str(exc))}") from None
    cfg = RunConfig(preset=resolved, trajectory=Path("<session>"), output=Path("<session>"),
                    image=None if image is None else Path(image).resolve(), seed=seed, device=device, dtype=dtype,
                    checkpoint=None if checkpoint is None else Path(checkpoint).resolve(),
                    random_weights=random_weights, weights_seed=weights_seed, world_seed=world_seed, memory=memory,
                    overwrite=overwrite, progress=False, metrics=metrics, save_every=0, rope_precision=rope_precision,
                    compile=compile, prompt_switch=prompt_switch, prompt=prompt, attention_stats=attention_stats,
                    attention_queries=attention_queries,
                    prefix=None if prefix is None else str(prefix) if str(prefix).startswith("truth:")
                    else str(Path(prefix).resolve()), prefix_chunks=prefix_chunks, backend=backend)
    from .storage import session_prefix

    clip = session_prefix(cfg)  # read before the model loads: a clip that does not fit is refused now
    have = getattr(getattr(pipeline, "preset", None), "to_dict", None)
    if pipeline is not None and (have is None or pipeline.preset.to_dict() != resolved.to_dict()):
        name = getattr(getattr(pipeline, "preset", None), "name", type(pipeline).__name__)
        raise InputError(f"open: pipeline= is a loaded {name}, not preset {resolved.name}: pass a pipeline of the "
                         f"same preset, or none to load one")
    if pipeline is None or not pipeline.serves(cfg):
        pipeline = Pipeline.from_config(cfg)
    session = Session(pipeline, cfg, record, prefix=clip)
    if isinstance(preset, (str, Path)) and Path(preset).suffix in (".yaml", ".yml") and Path(preset).is_file():
        session.preset_ref = str(Path(preset).resolve())  # a preset file: the replay command names it
    return session


__all__ = ["open"]
