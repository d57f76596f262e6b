"""Resume states of ``worldtrace generate``: explicit ``state_dict()`` of every stateful part, saved
as safetensors + JSON (no pickle; :mod:`worldtrace_cli.runs.state`) in ``RUN_DIR/resume/``.

What is saved: the cache writer's :meth:`~worldtrace_cli.memory.CacheWriter.state_dict` (its
contents and host stores), the DiT's action caches (:meth:`RolloutState.state_dict`), the
streaming VAE decoder's causal feature cache, the metric accumulators
(:meth:`~worldtrace_cli.metrics.OnlineMetrics.state_dict`), totals so far, the next chunk, the
run's config and the sha256 of its trajectory and image. Noise depends only on (seed, chunk), so a
resumed run decodes bit-identical frames (each record's ``frames_sha256``); the MP4 bytes at the
seam may differ (the encoder restarts).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..config import PRESET_ADDED, PRESET_DEFAULTS_ONLY, RUN_ADDED
from ..errors import InputError, WorldtraceError
from ..writer_options import MemoryConfig
from .folder import RunFolder

STATE_VERSION = 2


def save_run_state(folder: RunFolder, run, inputs: dict) -> None:
    """Atomically save everything a resume needs after ``run.rollout.chunk`` chunks of ``run`` (a
    :class:`~worldtrace_cli.runs.run.Run`; call after its decode pipeline was flushed): its
    :meth:`~worldtrace_cli.runs.run.Run.parts`, progress, config and original command line;
    ``inputs``: the trajectory's and image's sha256. Raises OutputError (disk full, permissions)."""
    from .state import remove_state_folder, save_state

    cfg, rollout, command = run.cfg, run.rollout, run.command
    parts = {**run.parts(), "progress": run.progress}
    meta = {"config": cfg.to_dict(), "next_chunk": rollout.chunk, "version": STATE_VERSION, "inputs": inputs,
            "command": list(command)}
    # the run folder's scratch is the run's own: one a kill left under an older version (no mark) goes
    remove_state_folder(folder.state.with_name(folder.state.name + ".tmp"))
    save_state(folder.state, meta, parts)


def load_run_state(folder: RunFolder, inputs: dict):
    """The saved state of ``folder``'s run, to build the resumed :class:`~worldtrace_cli.runs.run.Run` from
    (its ``restored``): the parts (every tensor back on the device it was saved from: host stores stay
    on the host), the next chunk, progress and original command line.

    Returns:
        a :class:`~worldtrace_cli.runs.run.Restored` (a state that does not fit the run becomes an
        InputError saying to start again when the run is built).
    Raises:
        InputError: no or an unreadable state, one whose tensors fail the sha256 recorded in
            ``state.json``, one from another version, or a trajectory / image changed since the run
            started (each message says to start again with ``--overwrite``).
    """
    from .run import Restored
    from .state import load_state, unpack

    meta, parts, tensors = load_state(folder.state, remedy="start again with --overwrite")
    if meta.get("version") != STATE_VERSION:
        raise InputError(f"{folder.path}: resume state from another worldtrace version "
                         f"(state version {meta.get('version')!r}, this one reads {STATE_VERSION}); "
                         f"start again with --overwrite")
    if meta.get("inputs") != inputs:
        raise InputError(f"{folder.path}: the trajectory or image changed since the run started; resume would "
                         f"not continue the same video (use --overwrite to start again)")

    def refuse(exc):
        return InputError(f"{folder.path}: resume state does not fit this run ({type(exc).__name__}: {exc}); "
                          f"start again with --overwrite")

    try:
        state = {name: unpack(parts[name], tensors, "cpu" if name == "metrics" else None)
                 for name in ("writer", "action_caches", "decoder", "metrics")}
        return Restored(state, int(meta["next_chunk"]), unpack(parts["progress"], tensors),
                        list(meta.get("command") or []), refuse)
    except (KeyError, ValueError, TypeError) as exc:
        raise refuse(exc) from None


def resume_config(run_dir: str | Path):
    """The :class:`~worldtrace_cli.config.RunConfig` saved with a run's resume state.

    Raises:
        InputError: no state (the message says how to restart), an unreadable one, or a folder whose
            run already completed.
    """
    from ..config import RunConfig
    from .state import load_meta

    folder = RunFolder(run_dir)
    if folder.is_complete():
        raise InputError(f"{folder.path}: the run already completed; nothing to resume")
    if not folder.has_state():
        what = "holds chunks but no saved state" if folder.holds_run() else "holds no run"
        raise InputError(f"{folder.path}: {what}, so there is nothing to resume; start it again with "
                         f"`worldtrace generate TRAJECTORY -o {folder.path} --overwrite` (same flags)")
    meta = load_meta(folder.state)
    try:
        return RunConfig.from_dict(meta["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{folder.path}: resume state from another worldtrace version "
                         f"({type(exc).__name__}: {exc})") from None


VOLATILE = ("output", "progress", "overwrite", "save_every", "overlap_decode")  # settings that do not change the video


def resumable(folder: str | Path, cfg):
    """The RunConfig saved in ``folder``'s resume state when it is the same run as ``cfg`` (the
    settings that change the video are equal), with ``cfg``'s volatile settings; else None."""
    folder = RunFolder(folder)
    if not folder.has_state():
        return None
    try:
        saved = resume_config(folder.path)
    except InputError:  # an unreadable state only means: start again
        return None
    if differences(saved.to_dict(), cfg):
        return None
    return replace(saved, output=folder.path, progress=cfg.progress, overlap_decode=cfg.overlap_decode)


def absolute(cfg):
    """``cfg`` with absolute trajectory, output, image and checkpoint paths (what a run records)."""
    return replace(cfg, trajectory=Path(cfg.trajectory).resolve(), output=Path(cfg.output).resolve(),
                   image=None if cfg.image is None else Path(cfg.image).resolve(),
                   checkpoint=None if cfg.checkpoint is None else Path(cfg.checkpoint).resolve())


def _video_settings(d: dict) -> dict:
    """A RunConfig dict reduced to what makes its video and records, on one footing for runs of every
    version: settings added later take the value older runs were made with
    (:data:`~worldtrace_cli.config.RUN_ADDED`: no attention stats), preset keys added later take the
    value older runs were made with
    (:data:`~worldtrace_cli.config.PRESET_ADDED`), the preset's defaults-only keys are dropped
    (:data:`~worldtrace_cli.config.PRESET_DEFAULTS_ONLY`: the value used is in ``memory``), and
    ``memory`` takes its current flat form (:meth:`~worldtrace_cli.writer_options.MemoryConfig.from_dict`
    then ``to_dict``: the writer's own settings, resolved; older runs recorded every writer's settings,
    ``landmark_threshold`` included, for every writer). A ``memory`` this version cannot read (a
    damaged record) is compared as it is."""
    d = {k: v for k, v in {**RUN_ADDED, **d}.items() if k not in VOLATILE}
    if isinstance(d.get("preset"), dict):
        d["preset"] = {k: v for k, v in {**PRESET_ADDED, **d["preset"]}.items() if k not in PRESET_DEFAULTS_ONLY}
    memory = d.get("memory")
    if isinstance(memory, dict):
        try:
            d["memory"] = MemoryConfig.from_dict(memory).to_dict()
        except (TypeError, ValueError, AttributeError, WorldtraceError):  # damaged: compared as it is
            pass
    return d


def differences(saved: dict, cfg) -> list[str]:
    """The settings that change the video and differ between a saved config dict and ``cfg``
    (``name saved (now new)``; :func:`_video_settings`); empty when it is the same run."""
    saved, now = _video_settings(saved), _video_settings(absolute(cfg).to_dict())
    out = []
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) == now.get(key):
            continue
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{k} {a.get(k)!r} (now {b.get(k)!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            out.append(f"{key} {a!r} (now {b!r})")
    return out


def next_step(folder: str | Path, cfg, remedy: str = "use another -o folder, --overwrite, or delete it") -> tuple[str, object]:
    """What a batch job (compare, loopbench) does with a run folder for ``cfg``:

    * ``("reuse", summary)``: a complete run of the same settings;
    * ``("resume", saved_cfg)``: a stopped run of the same settings with a resume state;
    * ``("run", cfg)``: nothing usable (empty, killed without a state, another run's state):
      generate from chunk 0 (with ``overwrite``).

    Raises:
        OutputError: a complete run made with other settings (reusing it would mix settings in one
            comparison, overwriting it would delete results): the differences are named, then
            ``remedy`` (the caller's ways out); a file or folder of a user's at a name a run writes
            (:meth:`RunFolder.foreign`: never replaced, so refused before anything loads).
    """
    from ..errors import OutputError

    folder = RunFolder(folder)
    folder.refuse_occupied(overwrite=True)  # names a run writes that worldtrace did not write: refused now
    if folder.is_complete():
        summary = folder.read_summary()
        diff = differences(summary.get("config") or {}, cfg)
        if diff:
            raise OutputError(f"{folder.path} holds a complete run made with {'; '.join(diff)[:400]}: {remedy}")
        return "reuse", summary
    saved = resumable(folder.path, cfg)
    if saved is not None:
        return "resume", saved
    return "run", replace(cfg, overwrite=True)
