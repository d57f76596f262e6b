"""The LoopBench job loop (``worldtrace loopbench run``): every job of a sweep plan
(:mod:`worldtrace_cli.loopbench.plan`) run idempotently in this process, one pipeline for all.

A folder whose ``summary.json`` says ``complete`` is done; a stopped one with a saved state resumes;
anything else is (re)generated, so a sweep killed at any moment resumes where it stopped. A job that
fails is recorded (``failures.jsonl``, ``<job>/failed.json``) and the sweep goes on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import Aborted, InputError, Interrupted, OutputError
from ..loopbench.plan import FAILED_NAME, FAILURES_NAME, Job, SweepCounts
from ..runs import RunFolder
from .sinks import StopFlag

log = logging.getLogger("worldtrace")


def check_jobs(jobs: Sequence[Job], preset, chunks: int | None = None, memory: dict | None = None,
               checkpoint: str | Path | None = None, random_weights: bool = False, writers: bool = True) -> None:
    """Check a sweep's inputs before the model loads, as ``generate`` does
    (:func:`~worldtrace_cli.jobs.inputs.check_inputs`): every distinct trajectory (size, syntax, its
    mode against the preset's) with every image (header, large enough for the aspect crop) and
    ``chunks``, torch-free; then every writer's flags and sizes for the preset's window
    (:func:`~worldtrace_cli.jobs.inputs.check_writers`: torch-free first), named ``--caches``.

    Args:
        jobs: the sweep's jobs; preset: the :class:`~worldtrace_cli.config.Preset`; chunks: the
            ``--chunks`` override; memory: the memory keywords every writer gets; checkpoint,
            random_weights: as ``generate``'s; writers: False leaves out the writer checks that
            import torch (only :func:`~worldtrace_cli.writer_options.check_memory`'s run).
    Raises:
        InputError / TrajectoryError: the first bad input, one line naming the file or flag;
            CheckpointError: a ``--checkpoint`` the sweep would read that is not a folder.
    """
    from ..config import RunConfig, memory_configs
    from .inputs import check_inputs, check_writers

    parsed: dict[Path, object] = {}
    for trajectory, image, prefix in sorted({(j.trajectory, j.image, j.prefix) for j in jobs}, key=str):
        cfg = RunConfig(preset=preset, trajectory=trajectory, output=Path("."), image=image, chunks=chunks,
                        checkpoint=checkpoint, random_weights=random_weights, prefix=prefix or None)
        parsed[trajectory] = check_inputs(cfg, parsed.get(trajectory))
    memories = list(memory_configs(sorted({j.cache for j in jobs}), preset, **(memory or {})).values())
    if writers:
        check_writers(memories, preset, "--caches")
    else:
        from ..writer_options import check_memory

        try:
            for m in memories:
                check_memory(m, preset.window, preset.default_budget)
        except InputError as exc:
            raise InputError(re.sub(r"--cache\b", "--caches", str(exc))) from None



def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:500]


def record_failure(out_dir: Path, job: Job, exc: BaseException) -> dict:
    """Append the failure to ``out_dir/failures.jsonl`` and write ``failed.json`` in the job's
    folder. One ``write`` per line in append mode keeps lines whole when shards share the file."""
    rec = {"job": job.key, "config": job.config, "cache": job.cache, "scene": job.scene,
           "image": None if job.image is None else str(job.image), "world": job.world, "seed": job.seed,
           "error": type(exc).__name__, "exit_code": getattr(exc, "exit_code", 1), "message": _one_line(exc),
           "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    line = json.dumps(rec) + "\n"
    try:
        folder = job.folder(out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / FAILED_NAME).write_text(json.dumps(rec, indent=1) + "\n")
        with open(out_dir / FAILURES_NAME, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise OutputError(f"cannot record the failure of {job.key} in {out_dir}: {err.strerror or err}") from None
    return rec


def _duration(seconds: float) -> str:
    """``4000`` -> ``"1 h 7 min"``, ``95`` -> ``"2 min"``, ``20`` -> ``"20 s"``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def run_jobs(jobs: Sequence[Job], out_dir: str | Path, preset: str = "tiny", device: str = "auto",
             dtype: str = "auto", metrics: str = "all", chunks: int | None = None,
             checkpoint: str | Path | None = None, random_weights: bool = False,
             progress: bool = False, speed: dict | None = None, memory: dict | None = None,
             overall: bool = False, attention: dict | None = None) -> SweepCounts:
    """Run ``jobs`` one after another in this process (the model is loaded once and reused).

    Each job's folder decides (:func:`~worldtrace_cli.runs.resume.next_step`): a complete run of the
    same settings is skipped, a stopped one with a saved state resumes (generate saves one on SIGTERM
    and every 16 chunks), anything else is regenerated from chunk 0; complete runs of other settings
    (e.g. another ``--chunks``) refuse the whole sweep before any job runs. One :class:`~worldtrace_cli.engine.pipeline.Pipeline` serves every job. A job that raises is recorded by
    :func:`record_failure` and the loop goes on; Ctrl-C / SIGTERM (exit code 130, the state
    saved) and KeyboardInterrupt stop it. One log line per job goes to the ``worldtrace`` logger.

    Args:
        preset: preset name or YAML; device: ``auto|cuda|cpu|cuda:N`` (``cuda:N`` makes GPU N the
            current device); dtype: ``auto|bf16|fp32``; metrics: ``none|fast|all``; chunks:
            rollout length override (None = each configuration's own N); speed: RunConfig speed
            fields (:func:`~worldtrace_cli.cli.options.speed_config`; the model compiles once per process);
            memory: the memory settings every job's writer gets besides its spec (``--budget``,
            ``--summary-slots``, ...: :func:`~worldtrace_cli.config.memory_configs` keywords);
            overall: one tqdm bar on stderr over the jobs (``progress``: each job's per-chunk bar).
            attention: RunConfig's ``attention_stats`` / ``attention_queries`` for every job
            (:func:`~worldtrace_cli.cli.options.attention_config`: recall attention in the report).

    Returns:
        :class:`SweepCounts` (done, skipped, failed).

    Raises:
        InputError: a bad preset, trajectory, image or writer flag (:func:`check_jobs`, before any job
            runs); OutputError: job folders hold complete runs made with other settings (before any
            job runs; the first one's differences named), or failures cannot be recorded.
    """
    from ..config import RunConfig, load_preset, memory_configs
    from . import generate as generate_job  # looked up per call so tests can replace run_generation
    from ..runs.resume import next_step

    out_dir = Path(out_dir)
    preset_obj = load_preset(preset)
    # a typo stops the sweep, not each job; torch-free first, so the refusals below come before torch loads
    check_jobs(jobs, preset_obj, chunks, memory, checkpoint, random_weights, writers=False)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputError(f"output folder {out_dir} exists and is not a folder") from None
    except OSError as err:
        raise OutputError(f"cannot create output folder {out_dir}: {err.strerror or err}") from None
    device = _select_device(device)

    memories = memory_configs(sorted({j.cache for j in jobs}), preset_obj, **(memory or {}))

    def job_config(job):
        return RunConfig(preset=preset_obj, trajectory=job.trajectory, output=job.folder(out_dir), image=job.image,
                         world_seed=job.world or 0, chunks=chunks, seed=job.seed, device=device, dtype=dtype,
                         checkpoint=checkpoint, random_weights=random_weights,
                         memory=memories[job.cache], progress=progress, prefix=job.prefix or None,
                         metrics=metrics, **(speed or {}), **(attention or {}))

    # every job's next step, decided once before any runs: complete runs of other settings refuse the
    # sweep now (one line, not one failure per job); any other error is that job's failure, recorded below
    remedy = "use another -o folder or delete the sweep's runs"
    steps, clashes = [], []
    for job in jobs:
        try:
            steps.append(next_step(job.folder(out_dir), job_config(job), remedy))
        except OutputError as exc:
            clashes.append(str(exc))
        except Exception as exc:  # noqa: BLE001
            steps.append(("error", exc))
    if clashes:
        raise OutputError(f"{len(clashes)} of {len(jobs)} jobs: {clashes[0]}")
    from .inputs import check_writers

    check_writers(list(memories.values()), preset_obj, "--caches")  # then with torch: e.g. a --bank-device this machine lacks
    with StopFlag("stopping after the current job (Ctrl-C again to abort now)") as sweep_stop:
        from tqdm import tqdm

        with tqdm(total=len(jobs), unit="job", desc="loopbench", file=sys.stderr, disable=not overall,
                  dynamic_ncols=True) as bar:
            return _run_steps(jobs, steps, out_dir, sweep_stop, generate_job, bar)


def _run_steps(jobs, steps, out_dir, sweep_stop, generate_job, bar=None) -> SweepCounts:
    """The job loop of :func:`run_jobs`: each job's decided step in turn. A signal heard between jobs
    or during a job that then finished anyway (its last chunk) stops the sweep before the next job;
    one heard while a job sets up reaches that job's own flag (:class:`StopFlag` nesting)."""
    from ..engine.pipeline import Pipeline  # torch and the model only after the inputs passed

    to_run = sum(step != "reuse" for step, _ in steps)
    done = skipped = failed = 0
    pipeline = None
    job_seconds: list[float] = []
    for k, (job, (step, what)) in enumerate(zip(jobs, steps), 1):
        folder, tag = job.folder(out_dir), f"[{k}/{len(jobs)}] {job.key}"
        if bar is not None and k > 1:
            bar.update()  # the job before this one is done (complete, skipped or failed)
        if sweep_stop.signal is not None:
            raise Interrupted(f"stopped before job {tag}; finished jobs are kept: rerun the same command to "
                              f"resume the sweep")
        started, load_s = time.perf_counter(), 0.0
        try:
            if step == "error":
                raise what
            if step == "reuse":
                skipped += 1
                (folder / FAILED_NAME).unlink(missing_ok=True)  # a refusal of other settings is history now
                log.info(f"{tag}: complete, skipped")
                continue
            if step == "resume":
                log.info(f"{tag}: resuming from its saved state")
            if pipeline is None or not pipeline.serves(what):
                t0 = time.perf_counter()
                pipeline = Pipeline.from_config(what)
                load_s = time.perf_counter() - t0  # paid once, not per job: kept out of the estimate
            summary = generate_job.run_generation(what, resume=step == "resume", pipeline=pipeline)
        except Exception as exc:  # noqa: BLE001  (a sweep records every failure and goes on)
            if isinstance(exc, Aborted):  # a second Ctrl-C: stop the sweep, not record a failure and go on
                raise
            if isinstance(exc, Interrupted):  # the sweep's way back, not generate's --resume of one job
                stopped_at = str(exc).split(";")[0]  # "interrupted after chunk N of M"
                raise Interrupted(f"{tag}: {stopped_at}; finished jobs and this job's chunks are kept: rerun the "
                                  f"same command to resume the sweep") from None
            failed += 1
            to_run -= 1
            rec = record_failure(out_dir, job, exc)
            log.info(f"{tag}: FAILED ({rec['error']}: {rec['message']})")
            # A resume state that failed may be the cause: the next attempt starts from chunk 0.
            RunFolder(folder).clear_state()
            continue
        (folder / FAILED_NAME).unlink(missing_ok=True)  # an earlier failure of this job is history now
        done += 1
        seconds = time.perf_counter() - started
        job_seconds.append(seconds - load_s)
        # the jobs left to generate (complete ones are skipped at no cost) at the mean time per job so far
        left = to_run - done
        mean = sum(job_seconds) / len(job_seconds)
        eta = f"; about {_duration(left * mean)} for the {left} left" if left > 0 else ""
        log.info(f"{tag}: done in {seconds:.1f} s ({_brief(summary)}){eta}")
    if bar is not None and jobs:
        bar.update()  # the last job
    return SweepCounts(done, skipped, failed)


def _select_device(device: str) -> str:
    """``cuda:N`` -> make GPU N current and return ``cuda`` (RunConfig takes auto|cuda|cpu)."""
    if not device.startswith("cuda:"):
        return device
    import torch

    try:
        index = int(device.split(":", 1)[1])
    except ValueError:
        raise InputError(f"--device: expected cuda:N, got {device!r}") from None
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise InputError(f"--device {device}: no such CUDA device")
    torch.cuda.set_device(index)
    return "cuda"


def _brief(summary: dict) -> str:
    """``1.23 s/chunk, PAC 0.812, TempSSIM 0.771, GT-PSNR 18.2`` from a summary dict (metrics may be absent)."""
    parts = [f"{summary.get('totals', {}).get('seconds_per_chunk', float('nan')):.3f} s/chunk"]
    metrics = summary.get("metrics") or {}
    pac = metrics.get("pac")
    if isinstance(pac, dict) and pac.get("mean") is not None:
        parts.append(f"PAC {pac['mean']:.3f}")
    if metrics.get("temp_ssim") is not None:
        parts.append(f"TempSSIM {metrics['temp_ssim']:.3f}")
    gt = metrics.get("gt") or {}
    if gt.get("psnr") is not None:
        parts.append(f"GT-PSNR {gt['psnr']:.2f} dB")
    return ", ".join(parts)


__all__ = ["check_jobs", "record_failure", "run_jobs"]
