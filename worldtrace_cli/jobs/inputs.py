"""Everything a generate run reads, checked before any model is loaded.

:func:`prepare_inputs` parses the trajectory, plans the actions, picks the conditioning image (the
procedural world's start view with ground truth, ``--image`` or the trajectory's ``image:``),
resolves the seed and hashes the inputs a resume must find unchanged.
"""

from __future__ import annotations

import hashlib
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..config.backbones import titles_where
from ..errors import InputError, OutputError
from ..writer_options.checks import check_writer_specs  # noqa: F401  (re-exported: the writers' pre-load check)
from ..model.layout import check_model_size, check_weights_source

log = logging.getLogger("worldtrace")


@dataclass
class RunInputs:
    """A run's checked inputs.

    Attributes:
        plan: the :class:`~worldtrace_cli.trajectory.ActionPlan` (per-pixel-frame action rows).
        image: the PIL start image; image_label: its path, or ``world:N``.
        truth: :class:`~worldtrace_cli.world.truth.GroundTruth` for procedural-world presets, else None.
        seed: the noise seed (``--seed``, else the trajectory's, else 0).
        hashes: ``trajectory_sha256`` and ``image_sha256`` (a resume refuses changed inputs); with
            LingBot pose files also ``poses_sha256`` / ``intrinsics_sha256``.
        camera: the run's prompt and camera files (a ``camera_files`` backbone's
            :class:`~worldtrace_cli.model.lingbot.inputs.LingbotInputs`: LingBot-World), else None.
        prompts: a text-to-video preset's prompt of every chunk (the segments' prompts, the default
            prompt where a segment has none), else None; ``image`` is then None.
        warnings: what the run should be told about its inputs, with what to do (recorded in
            ``summary.json``'s ``warnings``; logged once per process by :func:`warn_once`).
        prefix: the real video the run continues (:class:`~worldtrace_cli.continuation.Prefix`: its
            frames, reference, sha256), else None. prompt: the run's prompt (``--prompt``, else the trajectory's).
    """

    plan: object
    image: object
    image_label: str
    truth: object
    seed: int
    hashes: dict
    camera: object = None
    warnings: list = field(default_factory=list)
    prompts: list | None = None
    prefix: object = None
    prompt: str | None = None


_SAID: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Log ``message`` (INFO, on stderr through the CLI) the first time this command meets ``key``:
    compare and LoopBench run many jobs in one command, and a note that holds for all of them is said
    once, not once per job. Each run still records its own in ``summary.json``'s ``warnings``. The CLI
    starts every command with :func:`reset_warnings`."""
    if key not in _SAID:
        _SAID.add(key)
        log.info(message)


def reset_warnings() -> None:
    """Forget what :func:`warn_once` said: a new command (the CLI calls it for each) says it again."""
    _SAID.clear()


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_image(path: str | Path, height: int, width: int) -> None:
    """Check an image file with PIL, no torch: it exists, is an image, MG2's centre crop to the
    aspect ``height:width`` is not empty (:func:`~worldtrace_cli.model.conditioning.preprocess_image`),
    and its pixel data decode (:func:`~worldtrace_cli.trajectory.images.load_image`, at reduced size for a
    large image: a 24 MP JPEG or PNG of noise took 0.2 s here), so a truncated file is refused before torch loads.

    Raises:
        InputError: ``image <path>: <problem>`` (one line).
    """
    from PIL import Image, UnidentifiedImageError

    from ..trajectory.images import load_image

    path = Path(path)
    if not path.is_file():
        raise InputError(f"image {path}: {'is a directory, not an image file' if path.is_dir() else 'file not found'}")
    try:
        with warnings.catch_warnings():  # a large image is decoded at reduced size: no bomb warning on stderr
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                w, h = img.size
    except UnidentifiedImageError:
        raise InputError(f"image {path}: not a recognised image format") from None
    except Image.DecompressionBombError as exc:
        raise InputError(f"image {path}: too large ({exc})") from None
    except OSError as exc:
        raise InputError(f"image {path}: unreadable ({exc.strerror or type(exc).__name__})") from None
    crop = (w, int(w * height / width)) if h / w > height / width else (int(h * width / height), h)
    if min(crop) < 1:
        raise InputError(f"image {path}: a {w}x{h} image is too small for the preset's {width}x{height} "
                         f"aspect crop")
    load_image(path, (height, width))  # every pixel decoded (at reduced size when large): truncated data fails now


def check_inputs(cfg, traj=None):
    """The checks of :func:`prepare_inputs` that need neither torch nor the model: option ranges,
    the trajectory (size, syntax, mode), the checkpoint folder's files, the model's size against this
    machine's memory, ``--spill-dir`` and the image (fully decoded by PIL). ``generate``, ``compare`` and
    ``loopbench run`` run them first, so a bad input is reported in a fraction of a second. Returns
    the parsed :class:`~worldtrace_cli.trajectory.Trajectory` (``traj``, when the caller parsed
    ``cfg.trajectory`` already).

    Raises:
        InputError / TrajectoryError: as :func:`prepare_inputs`; a ``--world-seed`` other than 0 for a
            preset without a procedural world; ``--checkpoint`` with a preset that
            ships its weights, or none for a checkpoint preset; a model larger than this machine's
            memory (:func:`check_model_size`).
        CheckpointError: ``--checkpoint`` is not a folder or lacks a file the preset reads (one line
            listing them; the files' contents are checked when the model loads).
        OutputError: ``--spill-dir`` names a file.
    """
    from ..trajectory import load_trajectory

    for name, value, low in (("--save-every", cfg.save_every, 0), ("--world-seed", cfg.world_seed, 0),
                             ("--seed", cfg.seed, 0), ("--chunks", cfg.chunks, 1)):
        if value is not None and value < low:
            raise InputError(f"{name}: must be >= {low}, got {value}")
    if cfg.world_seed and not cfg.preset.has_world:  # as a session refuses it (session/opening.py)
        raise InputError(f"--world-seed {cfg.world_seed}: picks a procedural world; preset {cfg.preset.name} has none "
                         f"(only loopworld-style presets walk a world)")
    from ..model.layout import check_weight_hooks

    check_weight_hooks(cfg.weights_dtype, cfg.offload, cfg.compile)  # as the loader does, before anything runs
    traj = load_trajectory(cfg.trajectory) if traj is None else traj
    backbone = cfg.preset.backbone
    if traj.mode != cfg.preset.mode:
        runs_it = presets_of_mode(traj.mode)
        hint = f"; mode {traj.mode} runs on preset {', '.join(runs_it)}" if runs_it else ""
        raise InputError(f"{cfg.trajectory}: mode {traj.mode!r} does not match preset {cfg.preset.name} "
                         f"(mode {cfg.preset.mode!r}){hint}")
    check_taken(cfg, traj)  # what the backbone's row takes (--image, --prompt, --poses, ...)
    check_weights_source(cfg.preset, cfg.checkpoint, cfg.random_weights)  # the folder's files, not their bytes
    check_model_size(cfg.preset, cfg.device, cfg.dtype)
    spill = cfg.memory.options.get("spill_dir")
    if spill is not None and Path(spill).exists() and not Path(spill).is_dir():
        raise OutputError(f"--spill-dir {spill}: exists and is not a folder")
    check_writer_specs([cfg.memory], cfg.preset)  # the writer's flags and sizes, torch-free
    from ..continuation import plan_prefix
    from ..trajectory.actions import chunks_for_frames as covering

    prefix = plan_prefix(cfg, cfg.chunks or covering(traj.num_frames, cfg.preset.frames_per_chunk))
    if backbone.takes_prompts:
        check_text_options(cfg, traj)
        return traj
    path = cfg.image or (None if cfg.preset.has_world or prefix is not None else traj.image)
    if path is not None:
        check_image(path, cfg.preset.height, cfg.preset.width)
    elif backbone.start_image and not cfg.preset.has_world and prefix is None:
        raise InputError(f"{cfg.trajectory}: no conditioning image: pass --image or set `image:` in the trajectory")
    check_conditioning_options(cfg, traj)
    return traj


def check_taken(cfg, traj) -> None:
    """Each conditioning flag against what the preset's backbone row takes (a trajectory's ``image:`` is
    left unread, with a warning, by a backbone without a start image: :func:`prepare_inputs`):
    ``--image`` (``start_image``), ``--prompt`` (``run_prompt`` or prompt segments), ``--poses`` /
    ``--intrinsics`` (``camera_files``), ``--prompt-switch`` (prompt segments).

    Raises:
        InputError: the first flag the backbone does not take, naming the backbones that take it.
    """
    preset, row = cfg.preset, cfg.preset.backbone
    flags = (("--image", cfg.image, lambda r: r.start_image, "start image"),
             ("--prompt", cfg.prompt, lambda r: r.run_prompt or r.takes_prompts, "prompt"),
             ("--poses", cfg.poses, lambda r: r.camera_files, "camera files"),
             ("--intrinsics", cfg.intrinsics, lambda r: r.camera_files, "camera files"),
             ("--prompt-switch", None if cfg.prompt_switch == "recache" else cfg.prompt_switch,
              lambda r: r.takes_prompts, "prompt switch"))
    for flag, value, takes, what in flags:
        if value is not None and not takes(row):
            raise InputError(f"{flag}: preset {preset.name} ({row.title}) takes no {what}; only "
                             f"{titles_where(takes)} presets do")


def presets_of_mode(mode: str) -> list[str]:
    """The built-in presets that run trajectories of ``mode`` (for a mismatch's hint)."""
    from ..config import load_preset, preset_names

    return [name for name in preset_names() if load_preset(name).mode == mode]


def chunk_prompts(cfg, traj, plan=None) -> list[str]:
    """Every chunk's prompt of a text-to-video run: its segment's, else ``--prompt``, else the
    trajectory's top-level ``prompt`` (``plan``: the run's plan, else the trajectory's own length).

    Raises:
        InputError: a chunk with no prompt, or an empty ``--prompt`` (one line naming the segment's line).
    """
    from ..trajectory import plan_actions
    from ..trajectory.prompts import check_prompt

    default = traj.prompt
    if cfg.prompt is not None:
        try:
            default = check_prompt(cfg.prompt, "--prompt")
        except ValueError as exc:
            raise InputError(str(exc)) from None
    seg = next((s for s in traj.segments if s.num_frames and s.prompt is None), None)
    if default is None and seg is not None:  # before the plan (torch): refused in a fraction of a second
        raise InputError(f"{traj.source}:{seg.line}: prompt: this segment has none and there is no default: give it "
                         f"`prompt:`, set a top-level `prompt:`, or pass --prompt")
    plan = plan or plan_actions(traj, None, cfg.preset.frames_per_chunk)
    if default is None and None in plan.prompts:
        seg = next(s for s in traj.segments if s.num_frames and s.prompt is None)
        raise InputError(f"{traj.source}:{seg.line}: prompt: this segment has none and there is no default: give it "
                         f"`prompt:`, set a top-level `prompt:`, or pass --prompt")
    return [p if p is not None else default for p in plan.prompts]


def check_text_options(cfg, traj) -> None:
    """A prompt-segment run's inputs (after :func:`check_taken`): a prompt for every chunk (checked
    without torch: a chunk's prompts are laid out only for a run that passes).

    Raises:
        InputError: a bad ``--prompt-switch`` or ``--prompt``, a chunk without a prompt.
    """
    from ..trajectory.prompts import SWITCH_MODES

    if cfg.prompt_switch not in SWITCH_MODES:
        raise InputError(f"--prompt-switch: must be one of {', '.join(SWITCH_MODES)}, got {cfg.prompt_switch!r}")
    seg = next((s for s in traj.segments if s.num_frames and s.prompt is None), None)
    if cfg.prompt is None and traj.prompt is None and seg is not None:
        raise InputError(f"{traj.source}:{seg.line}: prompt: this segment has none and there is no default: give it "
                         f"`prompt:`, set a top-level `prompt:`, or pass --prompt")
    if cfg.prompt is not None:
        from ..trajectory.prompts import check_prompt

        try:
            check_prompt(cfg.prompt, "--prompt")
        except ValueError as exc:
            raise InputError(str(exc)) from None


def camera_file_paths(cfg, traj) -> tuple[str | None, Path | None, Path | None]:
    """(prompt, poses, intrinsics) of a run: the flags, else the trajectory's."""
    return (cfg.prompt if cfg.prompt is not None else traj.prompt, cfg.poses or traj.poses,
            cfg.intrinsics or traj.intrinsics)


def check_conditioning_options(cfg, traj) -> None:
    """A camera-file backbone's prompt and pose files, validated torch-free (after :func:`check_taken`);
    ``--metrics all`` needs a CLIP tower, which a checkpoint folder of a backbone without CLIP
    conditioning holds only when the optional CLIP file was added.

    Raises:
        InputError: bad pose or intrinsics files, or ``--metrics all`` with a checkpoint folder without
            the CLIP file.
    """
    preset = cfg.preset
    backbone = preset.backbone
    if backbone.takes_prompts:
        return
    if not (backbone.run_prompt or backbone.camera_files):
        return
    from ..model.lingbot.inputs import load_lingbot_inputs

    load_lingbot_inputs(*camera_file_paths(cfg, traj))
    clip = preset.files.get("clip")
    if (cfg.metrics == "all" and preset.weights == "checkpoint" and not cfg.random_weights and clip
            and cfg.checkpoint is not None and not (Path(cfg.checkpoint) / clip).is_file()):
        raise InputError(f"--metrics all: needs a CLIP tower for Scene Drift and PAC; {backbone.title} has none: "
                         f"copy {clip} (Wan2.1 / Matrix-Game-2.0) into {cfg.checkpoint}, or use --metrics fast")


def check_writers(memories, preset, flag: str = "--cache") -> None:
    """Check each :class:`~worldtrace_cli.config.MemoryConfig` for ``preset``'s model before it loads:
    first without torch (:func:`~worldtrace_cli.writer_options.check_memory`: an unknown writer or
    scheme, an invalid value, a flag the writer would ignore, sizes the model's window cannot hold),
    then by building each writer once without a model (torch: a ``--bank-device`` CUDA device this
    machine lacks). Call it after :func:`check_inputs`.

    Args:
        memories: the MemoryConfigs of the runs.
        preset: their :class:`~worldtrace_cli.config.Preset` (its window and default budget).
        flag: the command's writer flag, named in the messages (``loopbench run`` has ``--caches``).
    Raises:
        InputError: the first refusal (one line naming the flag).
    """
    try:
        check_writer_specs(memories, preset)
        from ..memory import build_writer

        for memory in memories:
            build_writer(memory, preset.default_budget, preset.window)
    except InputError as exc:
        if flag == "--cache":
            raise
        raise InputError(re.sub(r"--cache\b", flag, str(exc))) from None


def prepare_inputs(cfg, traj=None) -> RunInputs:
    """Check and load a :class:`~worldtrace_cli.config.RunConfig`'s inputs (no model involved).
    ``traj``: what :func:`check_inputs` returned when the caller ran it already (not repeated).

    Raises:
        InputError / TrajectoryError: a malformed trajectory (file:line: field), a mode other than
            the preset's, no or an unreadable image, a negative seed or world seed, bad flag values,
            a writer flag the writer refuses (:func:`check_writers`).
    """
    if traj is None:
        traj = check_inputs(cfg)  # before torch is imported: a bad input is reported at once
    check_writers([cfg.memory], cfg.preset)  # torch-free first, all before the model loads
    from ..trajectory.images import load_image
    from ..trajectory import plan_actions

    preset = cfg.preset
    plan = plan_actions(traj, cfg.chunks, preset.frames_per_chunk)
    for note in plan.notes:  # the same for every run of a compare or sweep on this trajectory: said once
        warn_once(note, note)
    truth, told = None, []
    backbone = preset.backbone
    from ..continuation import load_prefix, plan_prefix

    prefix_plan = plan_prefix(cfg, plan.num_chunks)  # a real clip: read now, its truth:K after the truth
    prefix = load_prefix(cfg, prefix_plan) if prefix_plan is not None and not prefix_plan.is_truth else None
    if not backbone.start_image:
        image, label, image_sha = None, "prompts" if backbone.takes_prompts else "none", None
        if traj.image is not None:
            told.append(f"{traj.source}: image: preset {preset.name} ({backbone.title}) takes no start image; "
                        f"the trajectory's image {traj.image} is not used")
    elif prefix is not None and cfg.image is None:  # a real clip: its first frame is the start image
        from PIL import Image

        image, label, image_sha = Image.fromarray(prefix.frames[0]), f"prefix:{prefix_plan.source}", prefix.sha256
        if traj.image is not None:
            told.append(f"{traj.source}: image: the start image is the prefix's first frame, not the trajectory's "
                        f"image {traj.image} (pass --image to condition on another image)")
    elif preset.has_world and cfg.image is None:
        from PIL import Image

        from ..world.truth import GroundTruth

        truth = GroundTruth(cfg.world_seed, plan, preset.height, preset.width, preset.world)
        if traj.image is not None:
            told.append(f"preset {preset.name}: the start image is world {cfg.world_seed}'s view, not the "
                        f"trajectory's image {traj.image} (that is what makes ground truth possible; pass "
                        f"--image to condition on the trajectory's image instead, without ground truth)")
        start_view = truth.start_image()
        image, label = Image.fromarray(start_view), f"world:{cfg.world_seed}"
        image_sha = hashlib.sha256(start_view.tobytes()).hexdigest()
    else:
        path = cfg.image or traj.image  # check_inputs made sure there is one
        if preset.has_world:
            log.warning(f"--image replaces world {cfg.world_seed}'s start view: no ground-truth metrics")
        image, label, image_sha = load_image(path, (preset.height, preset.width)), str(path), sha256_file(path)
    seed = cfg.seed if cfg.seed is not None else (traj.seed if traj.seed is not None else 0)
    if seed < 0:
        raise InputError(f"seed: must be >= 0, got {seed} (from {cfg.trajectory})")
    hashes = {"trajectory_sha256": sha256_file(cfg.trajectory), "image_sha256": image_sha}
    camera = None
    if backbone.camera_files:  # its prompt and camera files (LingBot-World)
        from ..model.lingbot.inputs import load_lingbot_inputs

        prompt, poses, intrinsics = camera_file_paths(cfg, traj)
        camera = load_lingbot_inputs(prompt, poses, intrinsics)
        if camera.poses is not None and len(camera.poses) < plan.num_frames:
            fit = (len(camera.poses) + 3) // (4 * preset.frames_per_chunk)
            raise InputError(f"{poses}: {len(camera.poses)} poses, {plan.num_chunks} chunks need one per pixel frame "
                             f"({plan.num_frames}): " + (f"use --chunks {fit} or fewer" if fit else "too few for one chunk"))
        hashes.update({f"{n}_sha256": sha256_file(p) for n, p in (("poses", poses), ("intrinsics", intrinsics)) if p})
    prompts = None
    if backbone.takes_prompts:  # the plan carries the resolved prompts: records name each chunk's
        from ..trajectory.prompts import prompt_label

        plan.prompts = prompts = chunk_prompts(cfg, traj, plan)
        plan.chunk_actions = [prompt_label(text) for text in prompts]
    if prefix_plan is not None and prefix_plan.is_truth:
        prefix = load_prefix(cfg, prefix_plan, truth)
    if prefix is not None:
        hashes["prefix_sha256"] = prefix.sha256
        told += prefix.notes
    for text in told:
        warn_once(text.split(":", 1)[0] + ": start image", text)
    return RunInputs(plan, image, label, truth, seed, hashes, camera, told, prompts, prefix, camera_file_paths(cfg, traj)[0])
