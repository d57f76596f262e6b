"""LoopBench sweeps: a deterministic job list and shards of it (torch-free). The job loop that runs
them is :mod:`worldtrace_cli.jobs.loopbench`.

A job is one rollout (configuration x cache writer x conditioning image x seed) in its own folder
``DIR/<config>/<cache>/<image stem>/seed<seed>/`` (a ``:`` in the cache spec becomes ``-``). A
folder whose ``summary.json`` says ``complete`` is done; anything else is (re)generated with
``overwrite``, so a sweep killed at any moment resumes where it stopped. Sharding is a pure split of
the sorted job list (docs/loopbench.md): ``--shard i/n`` for SLURM arrays or separate machines, and
torchrun's RANK / WORLD_SIZE / LOCAL_RANK for one process per GPU; no scheduler of our own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
import re
from pathlib import Path
from typing import NamedTuple

from ..errors import InputError
from ..outputs import cache_folder
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
        prefix: the real clip the job continues (``--prefix``: ``truth:K``, a video), ``""`` for a free
            rollout; a prefixed job's folder is ``config@<prefix>`` and its writer is reported as
            ``cache@<prefix>`` beside the free one (docs/continue.md).
    """

    config: str
    cache: str
    scene: str
    seed: int
    prefix: str = ""
    trajectory: Path = field(default=Path(), compare=False)
    image: Path | None = field(default=None, compare=False)
    world: int | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """``config/cache/scene/seedN``: the folder relative to the sweep folder."""
        return f"{self.config}{prefix_tag(self.prefix)}/{cache_folder(self.cache)}/{self.scene}/seed{self.seed}"

    def folder(self, out_dir: str | Path) -> Path:
        """The job's run folder under the sweep folder ``out_dir``."""
        return Path(out_dir) / self.key


def prefix_tag(prefix: str) -> str:
    """The folder suffix of a prefixed job: ``truth:4`` -> ``@truth4``, a video -> ``@<its stem>``; ``""``
    for a free rollout."""
    if not prefix:
        return ""
    name = prefix.replace(":", "") if prefix.startswith("truth:") else Path(prefix).stem
    return "@" + re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def parse_prefixes(spec: str | None) -> list[str]:
    """``--prefix`` of ``loopbench run``: comma-separated modes, ``free`` (a rollout from the start image),
    ``truth:K`` (the first K chunks of the world's true render committed) or a video; None: ``[""]``.

    Raises:
        InputError: an empty entry or a duplicate."""
    if spec is None:
        return [""]
    items = [s.strip() for s in spec.split(",")]
    if any(not s for s in items):
        raise InputError(f"--prefix {spec}: an empty entry")
    modes = ["" if s == "free" else s for s in items]
    if len(set(modes)) != len(modes):
        raise InputError(f"--prefix {spec}: duplicate entries")
    return modes


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
              seeds: Iterable[int], scratch: Path | None = None, worlds: Iterable[int] = (),
              prompt_scenes: dict | None = None, prefixes: Iterable[str] = ("",)) -> list[Job]:
    """Every (config, cache, scene, seed) job, sorted by (config, cache, scene, seed) so that every
    process of a sweep computes the same list whatever order the flags list them in. Scenes are the
    ``images`` (named by stem) and the ``worlds`` (named ``world<N>``), or for a text-to-video sweep
    the ``prompt_scenes`` (name -> {label: prompt}; configs are then prompt loops,
    :mod:`~worldtrace_cli.loopbench.prompts`, each written per scene into ``scratch``). Every job runs in
    each of ``prefixes`` (:func:`parse_prefixes`: ``""`` free, ``truth:K``, a video).

    Raises:
        InputError: unknown configs (see :func:`resolve_config`), duplicates, an empty dimension.
    """
    configs, caches, seeds = list(configs), list(caches), list(seeds)
    images, worlds = [Path(p) for p in images], list(worlds)
    scenes = [(p.stem, p, None) for p in images] + [(f"world{w}", None, int(w)) for w in worlds]
    if prompt_scenes is not None:
        return _prompt_jobs(configs, caches, seeds, prompt_scenes, scratch)
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
    return sorted(Job(name, cache, scene, int(seed), prefix, trajectories[name], image, world)
                  for name in names for cache in caches for scene, image, world in scenes for seed in seeds
                  for prefix in prefixes)


def _prompt_jobs(loops: list[str], caches: list[str], seeds: list[int], scenes: dict, scratch: Path | None
                 ) -> list[Job]:
    """:func:`plan_jobs` of a text-to-video sweep: one trajectory per (prompt loop, scene)."""
    from .prompts import PROMPT_LOOPS, write_prompt_loop

    for flag, values in (("--configs", loops), ("--caches", caches), ("--prompts", list(scenes)), ("--seeds", seeds)):
        if not values:
            raise InputError(f"{flag}: empty list")
        if len(set(values)) != len(values):
            raise InputError(f"{flag}: duplicate entries in {', '.join(map(str, values))}")
    unknown = [c for c in loops if c not in PROMPT_LOOPS]
    if unknown:
        raise InputError(f"--configs: {unknown[0]!r} is not a prompt loop (a text-to-video preset runs "
                         f"{', '.join(PROMPT_LOOPS)})")
    if scratch is None:
        raise InputError("a text-to-video sweep writes its trajectories into the sweep folder: none given")
    paths = {(loop, name): write_prompt_loop(loop, name, prompts, scratch)
             for loop in loops for name, prompts in scenes.items()}
    return sorted(Job(loop, cache, name, int(seed), "", paths[loop, name])
                  for loop in loops for cache in caches for name in scenes for seed in seeds)


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


__all__ = ["DEFAULT_CONFIGS", "DEFAULT_SEEDS", "FAILED_NAME", "FAILURES_NAME", "IMAGE_SUFFIXES", "Job", "SweepCounts",
           "combine_shards", "config_name", "parse_seeds", "parse_shard", "parse_worlds", "plan_jobs", "resolve_config",
           "resolve_images", "shard", "shard_from_env"]
