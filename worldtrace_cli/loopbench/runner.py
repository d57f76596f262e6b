"""LoopBench sweeps: a deterministic job list, shards of it, and an idempotent job loop.

A job is one rollout (configuration x cache writer x conditioning image x seed) in its own folder
``DIR/<config>/<cache>/<image stem>/seed<seed>/`` (a ``:`` in the cache spec becomes ``-``). A
folder whose ``summary.json`` says ``complete`` is done; anything else is (re)generated with
``overwrite``, so a sweep killed at any moment resumes where it stopped. Sharding is a pure split of
the sorted job list (design.md §6): ``--shard i/n`` for SLURM arrays or separate machines, and
torchrun's RANK / WORLD_SIZE / LOCAL_RANK for one process per GPU; no scheduler of our own.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..errors import InputError, Interrupted, OutputError
from ..outputs import cache_folder
from ..runs import RunFolder
from .configs import CONFIGS, DEFAULT_FOLDER, render

log = logging.getLogger("worldtrace")

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
FAILURES_NAME = "failures.jsonl"
FAILED_NAME = "failed.json"
# The paper's Table "loopbench_full": tiers 1-4 (the ABA sweep is opt-in, it is long).
DEFAULT_CONFIGS = tuple(name for name, cfg in CONFIGS.items() if cfg.tier in (1, 2, 3, 4))
DEFAULT_SEEDS = (0, 42, 123, 456, 789)  # the paper's multi-seed set (App. "Implementation")


@dataclass(frozen=True, order=True)
class Job:
    """One LoopBench rollout.

    Attributes:
        config: LoopBench configuration name (a key of ``CONFIGS``) or a custom trajectory's stem.
        cache: writer spec as given to ``--cache`` (``sliding``, ``mixed:2``, ...).
        scene: the scene's name: a conditioning image's stem, or ``world<N>`` for world N of a
            procedural-world preset (loopworld).
        seed: noise seed.
        trajectory: the YAML file the rollout follows (not part of the ordering).
        image: the conditioning image file (None for a world scene).
        world: the world seed of a world scene (None for an image scene).
    """

    config: str
    cache: str
    scene: str
    seed: int
    trajectory: Path = field(default=Path(), compare=False)
    image: Path | None = field(default=None, compare=False)
    world: int | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """``config/cache/scene/seedN``: the folder relative to the sweep folder."""
        return f"{self.config}/{cache_folder(self.cache)}/{self.scene}/seed{self.seed}"

    def folder(self, out_dir: str | Path) -> Path:
        """The job's run folder under the sweep folder ``out_dir``."""
        return Path(out_dir) / self.key


class SweepCounts(NamedTuple):
    """What :func:`run_jobs` did: jobs generated, skipped (already complete) and failed."""

    done: int
    skipped: int
    failed: int


# --------------------------------------------------------------------------- inputs


def resolve_config(name: str, scratch: Path | None = None) -> Path:
    """Trajectory YAML of a LoopBench configuration.

    ``name`` is a key of ``CONFIGS`` (looked up in the repository's ``trajectories/loopbench/``,
    where ``configs.py`` writes them) or a path to any trajectory ``.yaml``. Where the committed
    folder is absent (a wheel install) the YAML is rendered from ``CONFIGS`` into
    ``scratch/<name>.yaml``, so the sweep never depends on the working directory.

    Raises:
        InputError: an unknown name (the message lists the valid ones).
    """
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path.resolve()
    if name not in CONFIGS:
        raise InputError(f"--configs: unknown LoopBench configuration {name!r} "
                         f"(choose from {', '.join(CONFIGS)}, or give a trajectory .yaml)")
    committed = DEFAULT_FOLDER / f"{name}.yaml"
    if committed.is_file():
        return committed
    if scratch is None:
        raise InputError(f"--configs: {committed} is missing (regenerate with "
                         "`python -m worldtrace_cli.loopbench.configs`)")
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / f"{name}.yaml"
    out.write_text(render(name), encoding="utf-8")
    return out


def config_name(spec: str) -> str:
    """Folder name of a ``--configs`` entry: the name itself, or a custom YAML's stem."""
    path = Path(spec)
    return path.stem if path.suffix in (".yaml", ".yml") else spec


def resolve_images(spec: str | Sequence[str | Path]) -> list[Path]:
    """Conditioning images: a folder (every image file in it, sorted by name) or a comma list /
    sequence of files. Image stems name the scene folders, so they must be distinct.

    Raises:
        InputError: a missing file or folder, an empty folder, or two images with one stem.
    """
    items = [s.strip() for s in spec.split(",") if s.strip()] if isinstance(spec, str) else list(spec)
    if len(items) == 1 and Path(items[0]).is_dir():
        folder = Path(items[0])
        images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
        if not images:
            raise InputError(f"--images: no image files ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    else:
        images = [Path(p) for p in items]
        missing = [str(p) for p in images if not p.is_file()]
        if missing or not images:
            raise InputError(f"--images: no such file: {', '.join(missing) or '(empty list)'}")
    stems: dict[str, Path] = {}
    for path in images:
        if path.stem in stems:
            raise InputError(f"--images: {stems[path.stem]} and {path} share the scene name {path.stem!r}")
        stems[path.stem] = path
    return [p.resolve() for p in images]


def parse_seeds(spec: str) -> list[int]:
    """``"0,42,123"`` -> [0, 42, 123]. Raises InputError for a non-integer, negative or empty list."""
    try:
        seeds = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--seeds: expected comma-separated integers, got {spec!r}") from None
    if not seeds or min(seeds) < 0:
        raise InputError(f"--seeds: expected comma-separated integers >= 0, got {spec!r}")
    return sorted(set(seeds))


def parse_worlds(spec: str) -> list[int]:
    """``"0-7"`` or ``"0,3,5"`` (or a mix, ``"0-3,9"``) -> sorted distinct world seeds.

    Raises:
        InputError: not integers >= 0, a reversed range, or an empty list.
    """
    out: set[int] = set()
    try:
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            lo, _, hi = part.partition("-")
            a, b = int(lo), int(hi) if hi else int(lo)
            if a < 0 or b < a:
                raise ValueError
            out.update(range(a, b + 1))
    except ValueError:
        raise InputError(f"--worlds: expected world seeds >= 0 like 0-7 or 0,3,5, got {spec!r}") from None
    if not out:
        raise InputError(f"--worlds: empty list {spec!r}")
    return sorted(out)


def plan_jobs(configs: Iterable[str], caches: Iterable[str], images: Iterable[str | Path],
              seeds: Iterable[int], scratch: Path | None = None, worlds: Iterable[int] = ()) -> list[Job]:
    """Every (config, cache, scene, seed) job, sorted by (config, cache, scene, seed) so that every
    process of a sweep computes the same list whatever order the flags list them in. Scenes are the
    ``images`` (named by stem) and the ``worlds`` (named ``world<N>``).

    Raises:
        InputError: unknown configs (see :func:`resolve_config`), duplicates, an empty dimension.
    """
    configs, caches, seeds = list(configs), list(caches), list(seeds)
    images, worlds = [Path(p) for p in images], list(worlds)
    scenes = [(p.stem, p, None) for p in images] + [(f"world{w}", None, int(w)) for w in worlds]
    for flag, values in (("--configs", configs), ("--caches", caches), ("--images/--worlds", scenes),
                         ("--seeds", seeds)):
        if not values:
            raise InputError(f"{flag}: empty list")
        if len(set(values)) != len(values):
            raise InputError(f"{flag}: duplicate entries in {', '.join(map(str, values))}")
    names = [config_name(c) for c in configs]
    if len(set(names)) != len(names):
        raise InputError(f"--configs: two entries share a name: {', '.join(names)}")
    if len({name for name, _, _ in scenes}) != len(scenes):
        raise InputError("--images/--worlds: two scenes share a name")
    trajectories = {name: resolve_config(spec, scratch) for name, spec in zip(names, configs)}
    return sorted(Job(name, cache, scene, int(seed), trajectories[name], image, world)
                  for name in names for cache in caches for scene, image, world in scenes for seed in seeds)


# --------------------------------------------------------------------------- shards


def parse_shard(spec: str | None) -> tuple[int, int]:
    """``"i/n"`` -> (i, n) with 0 <= i < n; None -> (0, 1). Raises InputError otherwise."""
    if spec is None:
        return 0, 1
    try:
        index, count = (int(v) for v in spec.split("/"))
    except ValueError:
        raise InputError(f"--shard: expected i/n (e.g. 0/4), got {spec!r}") from None
    if count < 1 or not 0 <= index < count:
        raise InputError(f"--shard: expected i/n with 0 <= i < n, got {spec!r}")
    return index, count


def shard_from_env(environ: dict | None = None) -> tuple[int, int, str | None]:
    """torchrun's process placement: ``(RANK, WORLD_SIZE, device)``.

    ``device`` is ``cuda:<LOCAL_RANK>`` when LOCAL_RANK is set and CUDA is available (one GPU per
    rank on a node), else None (keep ``--device``). Without WORLD_SIZE: ``(0, 1, None)``.

    Raises:
        InputError: RANK / WORLD_SIZE / LOCAL_RANK not integers, or RANK outside [0, WORLD_SIZE).
    """
    env = os.environ if environ is None else environ
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local = env.get("LOCAL_RANK")
        local = None if local is None else int(local)
    except ValueError:
        raise InputError("RANK / WORLD_SIZE / LOCAL_RANK must be integers (torchrun sets them)") from None
    if world < 1 or not 0 <= rank < world:
        raise InputError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    device = None
    if local is not None:
        import torch

        if torch.cuda.is_available():
            device = f"cuda:{local}"
    return rank, world, device


def shard(jobs: Sequence[Job], index: int, count: int) -> list[Job]:
    """Shard ``index`` of ``count``: every count-th job from ``index`` (round robin, so each shard
    gets a mix of short and long configurations). The shards partition ``jobs``."""
    if count < 1 or not 0 <= index < count:
        raise InputError(f"shard {index}/{count}: expected 0 <= i < n")
    return list(jobs[index::count])


def combine_shards(flag: tuple[int, int], env: tuple[int, int]) -> tuple[int, int]:
    """``--shard i/n`` on top of torchrun's ``rank/world``: shard i*world + rank of n*world, so n
    machines (a SLURM array) each running torchrun over their GPUs still split the list exactly."""
    (i, n), (rank, world) = flag, env
    return i * world + rank, n * world


# --------------------------------------------------------------------------- running


def check_jobs(jobs: Sequence[Job], preset, chunks: int | None = None, memory: dict | None = None) -> None:
    """Check a sweep's inputs before the model loads, as ``generate`` does
    (:func:`~worldtrace_cli.jobs.inputs.check_inputs`): every distinct trajectory (size, syntax, its
    mode against the preset's) with every image (header, large enough for the aspect crop) and
    ``chunks``, torch-free; then every writer's flags (:func:`~worldtrace_cli.jobs.inputs.check_writers`,
    which imports torch), named ``--caches``.

    Args:
        jobs: the sweep's jobs; preset: the :class:`~worldtrace_cli.config.Preset`; chunks: the
            ``--chunks`` override; memory: the memory keywords every writer gets.
    Raises:
        InputError / TrajectoryError: the first bad input, one line naming the file or flag.
    """
    from ..config import RunConfig, memory_config
    from ..jobs.inputs import check_inputs, check_writers

    parsed: dict[Path, object] = {}
    for trajectory, image in sorted({(j.trajectory, j.image) for j in jobs}, key=str):
        cfg = RunConfig(preset=preset, trajectory=trajectory, output=Path("."), image=image, chunks=chunks)
        parsed[trajectory] = check_inputs(cfg, parsed.get(trajectory))
    check_writers([memory_config(c, **(memory or {})) for c in sorted({j.cache for j in jobs})], "--caches")



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


def run_jobs(jobs: Sequence[Job], out_dir: str | Path, preset: str = "tiny", device: str = "auto",
             dtype: str = "auto", metrics: str = "all", chunks: int | None = None,
             checkpoint: str | Path | None = None, random_weights: bool = False,
             progress: bool = False, speed: dict | None = None, memory: dict | None = None) -> SweepCounts:
    """Run ``jobs`` one after another in this process (the model is loaded once and reused).

    Each job's folder decides (:func:`~worldtrace_cli.runs.resume.next_step`): a complete run of the
    same settings is skipped, a stopped one with a saved state resumes (generate saves one on SIGTERM
    and every 16 chunks), anything else is regenerated from chunk 0; a complete run of other settings
    is recorded as a failure. One :class:`~worldtrace_cli.pipeline.Pipeline` serves every job. A job that raises is recorded by
    :func:`record_failure` and the loop goes on; Ctrl-C / SIGTERM (exit code 130, the state
    saved) and KeyboardInterrupt stop it. One log line per job goes to the ``worldtrace`` logger.

    Args:
        preset: preset name or YAML; device: ``auto|cuda|cpu|cuda:N`` (``cuda:N`` makes GPU N the
            current device); dtype: ``auto|bf16|fp32``; metrics: ``none|fast|all``; chunks:
            rollout length override (None = each configuration's own N); speed: RunConfig speed
            fields (:func:`~worldtrace_cli.options.speed_config`; the model compiles once per process);
            memory: the memory settings every job's writer gets besides its spec (``--budget``,
            ``--summary-slots``, ...: :func:`~worldtrace_cli.options.memory_config` keywords).

    Returns:
        :class:`SweepCounts` (done, skipped, failed).

    Raises:
        InputError: a bad preset, trajectory, image or writer flag (:func:`check_jobs`, before any job
            runs); OutputError: failures cannot be recorded.
    """
    from ..config import RunConfig, load_preset, memory_config
    from ..jobs import generate as generate_job  # looked up per call so tests can replace run_generation
    from ..runs.resume import next_step

    out_dir = Path(out_dir)
    preset_obj = load_preset(preset)
    check_jobs(jobs, preset_obj, chunks, memory)  # a typo stops the sweep now, not every job of it
    from ..pipeline import Pipeline  # torch and the model only after the inputs passed
    out_dir.mkdir(parents=True, exist_ok=True)
    device = _select_device(device)
    done = skipped = failed = 0
    pipeline = None
    for k, job in enumerate(jobs, 1):
        folder, tag = job.folder(out_dir), f"[{k}/{len(jobs)}] {job.key}"
        started = time.perf_counter()
        try:
            cfg = RunConfig(preset=preset_obj, trajectory=job.trajectory, output=folder, image=job.image,
                            world_seed=job.world or 0, chunks=chunks, seed=job.seed, device=device, dtype=dtype,
                            checkpoint=checkpoint, random_weights=random_weights,
                            memory=memory_config(job.cache, **(memory or {})), progress=progress, metrics=metrics,
                            **(speed or {}))
            step, what = next_step(folder, cfg)
            if step == "reuse":
                skipped += 1
                log.info(f"{tag}: complete, skipped")
                continue
            if step == "resume":
                log.info(f"{tag}: resuming from its saved state")
            if pipeline is None or not pipeline.serves(what):
                pipeline = Pipeline.from_config(what)
            summary = generate_job.run_generation(what, resume=step == "resume", pipeline=pipeline)
        except Exception as exc:  # noqa: BLE001  (a sweep records every failure and goes on)
            if isinstance(exc, Interrupted):
                log.info(f"{tag}: interrupted; rerun the same command to resume the sweep")
                raise
            failed += 1
            rec = record_failure(out_dir, job, exc)
            log.info(f"{tag}: FAILED ({rec['error']}: {rec['message']})")
            # A resume state that failed may be the cause: the next attempt starts from chunk 0.
            RunFolder(folder).clear_state()
            continue
        (folder / FAILED_NAME).unlink(missing_ok=True)  # an earlier failure of this job is history now
        done += 1
        log.info(f"{tag}: done in {time.perf_counter() - started:.1f} s ({_brief(summary)})")
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


__all__ = ["DEFAULT_CONFIGS", "DEFAULT_SEEDS", "Job", "SweepCounts", "check_jobs", "combine_shards",
           "parse_seeds", "parse_shard", "parse_worlds", "plan_jobs", "record_failure", "resolve_config", "resolve_images",
           "run_jobs", "shard", "shard_from_env"]
