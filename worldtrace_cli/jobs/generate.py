"""The ``worldtrace generate`` job: inputs -> pipeline -> rollout -> run folder, safe to interrupt.

Nothing generated is lost:

* ``video.mp4`` and ``chunks.jsonl`` are appended chunk by chunk (fragmented MP4 written by a
  separate ffmpeg; JSONL records fsync'ed), so even SIGKILL leaves every finished chunk.
* Ctrl-C (SIGINT) or SIGTERM stops after the current chunk, saves a resume state and exits 130
  with the command that resumes; a second Ctrl-C aborts at once (exit 131, no new state).
* Every ``save_every`` chunks a resume state is saved (:mod:`worldtrace_cli.runs.resume`).
  ``--resume RUN_DIR`` rebuilds the run from its saved config, cuts the video and records back to
  the saved chunk and continues with bit-identical decoded frames.
* The folder is locked for the whole run (:meth:`~worldtrace_cli.runs.RunFolder.lock`).
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from ..errors import Aborted, Interrupted, OutputError
from ..runs import RunFolder
from ..runs.resume import load_run_state, save_run_state
from ..outputs.video import ffmpeg_exe
from .inputs import RunInputs, check_inputs, prepare_inputs
from .offsets import offset_warning
from .sinks import StopFlag

log = logging.getLogger("worldtrace")


@contextmanager
def stage(label: str, level: int = logging.INFO):
    """Log a start-up stage so the seconds before the first chunk are not silent: ``<label> ...``
    when it starts and ``<label> ... 3.1 s`` when it ends (on stderr through the CLI; ``level``
    DEBUG for the runs of compare and LoopBench, which share one loaded model and log per job)."""
    log.log(level, f"{label} ...")
    start = time.perf_counter()
    yield
    log.log(level, f"{label} ... {time.perf_counter() - start:.1f} s")


def run_generation(cfg, resume: bool = False, pipeline=None) -> dict:
    """Run ``worldtrace generate``; returns the summary also written to ``summary.json``.

    Inputs are validated (options, trajectory, checkpoint files, model size, image:
    :func:`~worldtrace_cli.jobs.inputs.check_inputs`) and the output folder checked (a file, or a run
    already there without ``--overwrite``) before torch is imported, all before any model is loaded.
    With ``resume``, ``cfg`` must be :func:`~worldtrace_cli.runs.resume.resume_config` of
    ``cfg.output``. ``pipeline``: a loaded :class:`~worldtrace_cli.engine.pipeline.Pipeline` to reuse when
    it serves ``cfg`` (compare and loopbench pass theirs), else one is loaded.

    Raises:
        InputError, CheckpointError, OutputError (FolderBusy, FolderInconsistent), RunError: see
            :mod:`worldtrace_cli.errors`.
        Interrupted: Ctrl-C / SIGTERM; the resume state is saved first. Aborted: a second Ctrl-C.
        OutputError: also when every chunk was generated but ``video.mp4`` holds fewer frames than
            the records cover (checked before the run reports success; the summary says "failed").
    """
    started = time.time()
    if not resume:  # absolute paths: a resume may start from another working directory
        cfg = replace(cfg, trajectory=Path(cfg.trajectory).resolve(), output=Path(cfg.output).resolve(),
                      image=None if cfg.image is None else Path(cfg.image).resolve(),
                      checkpoint=None if cfg.checkpoint is None else Path(cfg.checkpoint).resolve(),
                      poses=None if cfg.poses is None else Path(cfg.poses).resolve(),
                      intrinsics=None if cfg.intrinsics is None else Path(cfg.intrinsics).resolve(),
                      prefix=cfg.prefix if cfg.prefix is None or str(cfg.prefix).startswith("truth:")
                      else str(Path(cfg.prefix).resolve()),
                      reference=None if cfg.reference is None else Path(cfg.reference).resolve())
    folder, traj = RunFolder(cfg.output), None
    if not resume:  # a taken -o is refused before the inputs are loaded (the truth rendered, torch imported)
        traj = check_inputs(cfg)
        folder.refuse_occupied(cfg.overwrite)
    ffmpeg_exe()  # the MP4 needs it: fail before the run folder is touched or a model loaded
    level = logging.INFO if pipeline is None else logging.DEBUG  # a batch job's runs: only -v shows their stages
    start = ("rendering the start view" if cfg.preset.has_world and cfg.image is None else
             "reading the prompts" if cfg.preset.backbone.takes_prompts else "reading the start image"
             if cfg.preset.backbone.start_image else "reading the trajectory")
    with stage(f"reading the inputs (importing torch, {start})", level):
        inputs = prepare_inputs(cfg, traj)
    if cfg.offload == "auto" and pipeline is not None and pipeline.key is not None:  # a shared model's own choice
        shared = replace(cfg, offload=pipeline.key.offload)
        cfg = shared if pipeline.serves(shared) else cfg
    if pipeline is None or not pipeline.serves(cfg):  # a CUDA run that cannot fit is refused before it loads
        from .bench_memory import fit_run

        cfg = fit_run(cfg, inputs.plan.num_chunks)
    with folder.lock("generate --resume" if resume else "generate"):
        if not resume:
            folder.prepare(cfg.overwrite)
        return _generate(cfg, inputs, folder, resume, pipeline, started)


class _Generation:
    """One ``generate`` run: a :class:`~worldtrace_cli.runs.run.Run` fed by its trajectory, with the
    job's policy around it: the model (loaded unless a shared one serves the run), a resume state read
    (``resume``), then the whole run in one constructor (writer, conditioning, rollout, the restored
    state, decoder, metrics, the run folder's sinks, the chunk loop: :func:`new_run`). :meth:`chunks`
    drives the run chunk by chunk from the trajectory's feed (``run.feed``), saving
    resume states; :meth:`fail` and :meth:`finish` close it with its ``summary.json``.
    """

    def __init__(self, cfg, inputs: RunInputs, folder: RunFolder, resume: bool, pipeline, started: float):
        import torch

        from ..engine import shard
        from ..engine.pipeline import Pipeline
        from ..trajectory import frames_for_chunks

        self.cfg, self.inputs, self.folder, self.resume = cfg, inputs, folder, resume
        plan, preset = inputs.plan, cfg.preset
        loaded_here = pipeline is None or not pipeline.serves(cfg)
        if loaded_here:
            with stage(f"loading {preset.name}"):
                pipeline = Pipeline.from_config(cfg)
        self.pipeline = pipeline
        # --fsdp, --split-heads: process 0 tells the others before each chunk that it makes one (engine/shard.py)
        gate = shard.announcer() if shard.active() else None
        # process 0 holds the whole cache unless the heads are split across the processes
        self.resumable = shard.head_split()[0] == 1
        self.start, restored, records = 0, None, None
        if resume:
            restored = load_run_state(folder, inputs.hashes)
            self.start = restored.next_chunk
            folder.summary_path.unlink(missing_ok=True)
            layout = lambda n: frames_for_chunks(n, preset.frames_per_chunk)  # noqa: E731
            records = folder.truncate(self.start, layout)  # the chunks after the saved one are regenerated
        peaks = (lambda: torch.cuda.reset_peak_memory_stats(pipeline.device)) if pipeline.device.type == "cuda" else None
        # the wall clock splits into phases only for one whole run in this process that loaded its
        # own model (a shared model loaded before it started)
        with stage(f"conditioning on {inputs.image_label if inputs.image_label != 'none' else 'the trajectory'}",
                   logging.INFO if loaded_here else logging.DEBUG):
            self.run = run = new_run(pipeline, cfg, inputs, started=started, restored=restored, records=records,
                                     folder=folder, start=self.start, show=cfg.progress, overlap=cfg.overlap_decode,
                                     gate=gate, resumed_by=sys.argv if resume else None,
                                     account=loaded_here and not resume, on_conditioned=peaks)
        if resume:
            log.info(f"resuming {folder.path} at chunk {self.start} of {plan.num_chunks}")
        t0 = time.perf_counter()  # a host store page-locked now, not on the generating thread (docs/gpu-memory.md)
        reserved = run.writer.reserve_host((plan.num_chunks - self.start) * preset.frames_per_chunk)
        if reserved:
            log.info(f"host store: {reserved / 1e9:.1f} GB page-locked ahead in {time.perf_counter() - t0:.1f} s")

    def chunks(self, stop: StopFlag) -> int | None:
        """Generate every chunk from the start one through the run's chunk loop (built after any
        decoder restore), saving a resume state before the first chunk, every ``save_every`` chunks
        and when a signal asks to stop. Returns the chunk the run stopped after, or None when every chunk was generated."""
        cfg, plan, run = self.cfg, self.inputs.plan, self.run
        if self.start == 0 and cfg.save_every and self.resumable and plan.num_chunks > 1:
            # a state before the first chunk: a run killed before its first save resumes (from chunk 0)
            # instead of refusing as one with chunks and no state
            save_run_state(self.folder, run, self.inputs.hashes)
        for c in range(self.start, plan.num_chunks):
            # generated (fed the chunk's actions, camera or prompt), decoded (one chunk behind with overlap),
            # written; on a failure the chunks decoded before it are written first
            run.advance(run.feed.request(c))
            last = c == plan.num_chunks - 1
            signalled = stop.signal is not None  # read once: a signal arriving now counts next chunk
            save = not last and (signalled or (cfg.save_every and (c + 1) % cfg.save_every == 0)) and self.resumable
            if save or last or signalled:
                run.flush()  # the decoder state must cover every chunk saved
            if save:
                save_run_state(self.folder, run, self.inputs.hashes)
            if signalled and not last:
                return c
        return None

    def summary(self, status: str) -> dict:
        """Write and return ``summary.json`` with ``status`` (complete, stopped, failed, aborted)."""
        from ..outputs import write_json_atomic

        cfg, run = self.cfg, self.run
        told = offset_warning(cfg.memory, run.tally.max_offset(), cfg.preset, self.inputs.plan.num_chunks,
                              run.rollout.geometry.trained_offset)
        result = run.summary(status, told)
        write_json_atomic(self.folder.summary_path, result)
        return result

    def fail(self, status: str) -> None:
        """Close after an error and record ``status`` (failed | aborted); a failure to write the
        summary is logged, not raised: the original error is the one to report."""
        self.run.close(failing=True)
        try:
            self.summary(status)
        except Exception as exc:
            log.warning(f"while writing the partial summary: {exc}")

    def finish(self, stopped: int | None) -> dict:
        """Close a run that ended without an error: ``stopped`` (saved, exit 130) or complete once
        ``video.mp4`` holds every frame (then the resume state goes). Returns the summary.

        Raises:
            Interrupted: stopped after chunk ``stopped``. OutputError: the video lacks frames."""
        from ..trajectory import frames_for_chunks

        plan, folder = self.inputs.plan, self.folder
        self.run.close(failing=False)
        if stopped is not None:
            self.summary("stopped")
            again = (f"resume with: worldtrace generate --resume {folder.path}" if self.resumable else
                     "a --split-heads run keeps no resume state (each process holds its heads' share of the cache): "
                     "run it again with --overwrite")
            raise Interrupted(f"interrupted after chunk {stopped} of {plan.num_chunks}; every finished chunk is in "
                              f"{folder.path}; {again}")
        have, need = folder.video_frames(), frames_for_chunks(plan.num_chunks, self.cfg.preset.frames_per_chunk)
        if have < need:  # e.g. video.mp4 deleted or replaced while the run wrote it: not a success
            self.summary("failed")
            raise OutputError(f"{folder.video}: holds {have} of the run's {need} pixel frames (deleted or replaced "
                              f"while the run wrote it?); chunks.jsonl has every chunk, the video does not: "
                              f"run again with --overwrite")
        prefix = self.inputs.prefix
        if prefix is not None:  # the continuation alone, beside video.mp4 (the prefix marked, then the continuation)
            from ..continuation import write_frames_after
            from ..runs.folder import CONTINUATION

            write_frames_after(folder.video, folder.path / CONTINUATION,
                                   frames_for_chunks(prefix.plan.chunks, self.cfg.preset.frames_per_chunk),
                                   self.cfg.preset.fps)
        result = self.summary("complete")
        folder.clear_state()
        return result


def new_run(pipeline, cfg, inputs: RunInputs, **options):
    """The whole :class:`~worldtrace_cli.runs.run.Run` of ``cfg`` on ``pipeline`` from its checked inputs:
    conditioned on :func:`run_conditioning`, with their seed, start label, ground truth, prefix and the
    warnings the inputs gave; ``options``: the Run's other keywords (``restored``, ``folder``, ``overlap``, ...).

    Raises:
        InputError: what the pipeline's conditioning refuses, a restored state that does not fit."""
    from ..runs.run import Run

    truth = inputs.truth
    return Run(pipeline, cfg, inputs.plan, seed=inputs.seed, image_label=inputs.image_label,
               conditioning=run_conditioning(cfg, inputs), world_seed=None if truth is None else truth.world_seed,
               truth=truth, prefix=inputs.prefix, warnings=inputs.warnings, **options)


def run_conditioning(cfg, inputs: RunInputs):
    """The run's :class:`~worldtrace_cli.engine.base.RunConditioning` (:meth:`~worldtrace_cli.engine.base.RunConditioning.of`:
    its start image, its prompt, every chunk's prompt, camera files and ``--prompt-switch``, as its row takes them)."""
    from ..engine.base import RunConditioning

    return RunConditioning.of(cfg, inputs.plan.num_chunks, image=inputs.image, prompt=inputs.prompt,
                              prompts=inputs.prompts, camera=inputs.camera)


def follow_generation(cfg) -> int:
    """A ``generate --fsdp`` or ``--split-heads`` process other than 0 (:mod:`~worldtrace_cli.engine.shard`):
    the same inputs, model shard and run (writer, conditioning, rollout) as process 0, then each chunk it
    makes; nothing written. Returns the chunks made."""
    from ..engine import shard
    from ..engine.pipeline import Pipeline

    from .bench_memory import fit_run

    inputs = prepare_inputs(cfg)
    cfg = fit_run(cfg, inputs.plan.num_chunks)  # the offload process 0 chose: the same decision, made once
    run = new_run(Pipeline.from_config(cfg), cfg, inputs)
    # its host store page-locked ahead too (its share of the host: pinned.affordable), or process 0 waits for it
    run.writer.reserve_host(inputs.plan.num_chunks * cfg.preset.frames_per_chunk)
    return shard.follow(run.rollout, run.feed)


def _generate(cfg, inputs: RunInputs, folder: RunFolder, resume: bool, pipeline, started: float) -> dict:
    """Build the run (:class:`_Generation`), then generate its chunks with Ctrl-C / SIGTERM caught
    between chunks (:class:`~worldtrace_cli.jobs.sinks.StopFlag`, held until the summary is written:
    a late Ctrl-C finishes cleanly) and close it with its summary."""
    job = _Generation(cfg, inputs, folder, resume, pipeline, started)
    with StopFlag() as stop:
        try:
            stopped = job.chunks(stop)
        except KeyboardInterrupt:  # a second Ctrl-C
            job.fail("aborted")
            raise Aborted(f"aborted after {len(job.run.records)} chunks; {folder.path} keeps every written chunk "
                          f"but no resume state for them: start again with --overwrite") from None
        except BaseException:
            job.fail("failed")
            raise
        return job.finish(stopped)
