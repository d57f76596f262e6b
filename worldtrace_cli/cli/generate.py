"""``worldtrace generate``: one run folder from a trajectory, or ``--resume`` of a stopped one."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from ..config import memory_config
from .common import run_job
from ..config.backbones import titles_where
from .options import (CHUNKS, SEED, NonEmptyPath, attention_config, attention_options, checkpoint_option,
                      device_options, memory_options, prefix_config, prefix_options, preset_option,
                      speed_config, speed_options, backend_option)
from .shared_options import MODEL_CACHE, option


def command_line(ctx, drop: tuple[str, ...] = ()) -> list[str]:
    """The command line of ``ctx``'s command as given (the values its parameters took from the command line,
    not from defaults), less the parameters named in ``drop``: what a launched process runs again."""
    args: list[str] = []
    for param in ctx.command.params:
        if (param.name in drop or param.name not in ctx.params  # not exposed (--threads: the environment carries it)
                or ctx.get_parameter_source(param.name) != click.core.ParameterSource.COMMANDLINE):
            continue
        value = ctx.params[param.name]
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif param.is_flag and param.secondary_opts:  # --x/--no-x pairs: the form given
            args.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            args.append(param.opts[0])
        elif value is not None:
            args += [max(param.opts, key=len), str(value)]
    return args


@click.command("generate")
@click.argument("trajectory", type=click.Path(path_type=Path), required=False)
@preset_option(note="default: mg2-<trajectory mode> with --checkpoint, else loopworld (universal) or tiny-<mode>; "
                    "prompt segments (mode: text): self-forcing-tiny")
@checkpoint_option
@option("--prompt", default=None, note=" (overrides the trajectory's top-level `prompt`; text-to-video segments with "
                                       "their own prompt keep it)")
@click.option("--prompt-switch", type=click.Choice(["recache", "recache-keep-sink", "plain"]), default="recache",
              show_default=True,
              help=f"{titles_where(lambda r: r.takes_prompts)} presets, at a prompt switch: recache = LongLive's K/V re-cache of the window "
                   "under the new prompt (its official behaviour: a switch within the first window also rewrites "
                   "the sink); recache-keep-sink = the same, the sink always kept; plain = no re-cache "
                   "(Self-Forcing's: the cache keeps the old prompt's K/V).")
@click.option("--poses", type=click.Path(path_type=Path), default=None, metavar="NPY",
              help=f"{titles_where(lambda r: r.camera_files)} presets: camera-to-world poses [N, 4, 4] (LingBot's "
                   "poses.npy, one per pixel frame, OpenCV axes) instead of the camera the actions drive.")
@click.option("--intrinsics", type=click.Path(path_type=Path), default=None, metavar="NPY",
              help=f"{titles_where(lambda r: r.camera_files)} presets: intrinsics.npy [N, 4] (fx, fy, cx, cy at "
                   "480x832; row 0 used).")
@option("--image", type=click.Path(path_type=Path), default=None, default_text="the trajectory's `image`",
        note="; with loopworld the start image is the world's own view unless this is given")
@option("--world-seed", type=SEED, default=0, show_default=True,
        note="; its start view conditions the model; refused by presets without a world")
@option("--chunks", type=CHUNKS, default=None, default_text="the trajectory's length",
        note="; repeats the last segment or truncates the trajectory")
@option("--seed", type=SEED, default=None, note="the noise, >= 0", default_text="the trajectory's seed, else 0")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=None, metavar="DIR", note=": the run folder",
        default_text="runs/<trajectory>-<cache>")
@option("--overwrite", is_flag=True, note=" (a run, finished or not)")
@option("--cache", default=None, metavar="WRITER", default_text=MODEL_CACHE)
@memory_options
@device_options
@option("--metrics", type=click.Choice(["none", "fast", "all"]), default="fast", show_default=True)
@click.option("--hash-checkpoint", is_flag=True, help="sha256 whole checkpoint files (default: first MiB).")
@option("--save-every", type=int, default=16, show_default=True,
        note="chunks, and before the first chunk (0: only on Ctrl-C/SIGTERM)")
@speed_options
@backend_option
@attention_options
@prefix_options
@option("--weights-dtype", type=click.Choice(["auto", "fp8", "fit"]), default="auto", show_default=True,
        note="; fit = auto when the run's memory plan fits the card, else fp8 when that does (logged, and "
             "summary.json's config says which)")
@option("--device-gb", type=click.FloatRange(0, 1e6, min_open=True), default=None, expose_value=False,
        callback=lambda ctx, param, value: _plan_for_card(ctx, value), metavar="N",
        default_text="this machine's GPU; without one, as if it had it",
        note=": --offload auto and --weights-dtype fit choose for that card and log why, the run goes on here with "
             "that choice, and a run that would not fit there is refused (exit 2)")
@option("--offload", type=click.Choice(["auto", "text", "blocks"]), default="auto", show_default=True,
        note="; auto = text when the run's memory plan fits the card, else blocks")
@click.option("--fsdp", is_flag=True,
              help="Under torchrun --nproc-per-node N: the DiT's weights sharded across the N processes with FSDP2 "
                   "(1/N of them each; one GPU per process, gloo on a CPU); process 0 writes the run. Not with "
                   "--resume, --compile, fp8 weights or block offloading.")
@click.option("--split-heads", is_flag=True,
              help="Under torchrun --nproc-per-node N: tensor parallel, each process computing H/N of the attention "
                   "heads and 1/N of the FFN, and holding its heads' slice of every cache slot (frames within float "
                   "rounding of one process's; meant to be faster per chunk on N GPUs, not measured yet). The "
                   "attention and FFN weights are split (MG2: 86 % of them, LingBot-World 76 %). N must divide the "
                   "heads. No resume state. Not with --fsdp, --resume, --compile, fp8 weights or block offloading.")
@click.option("--nproc-per-node", type=click.IntRange(2, 64), default=None, metavar="N",
              help="With --fsdp or --split-heads: run the N processes on this machine (one GPU each; gloo on a CPU), "
                   "launched through PyTorch's elastic launcher (torchrun's) after the inputs are checked once; a "
                   "refusal is one line and the exit code the README documents. Multi-node: torchrun ... -m "
                   "worldtrace_cli generate --fsdp (docs/gpu-memory.md).")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), default=None, metavar="RUN_DIR",
              help="Continue an interrupted run from its last saved state (other options come from the run, "
                   "except --overlap-decode and --no-progress).")
@click.option("--no-progress/--progress", "no_progress", default=False, help="No progress bar (default: --progress, on stderr).")
def generate(trajectory, preset, checkpoint, prompt, prompt_switch, poses, intrinsics, random_weights, image, world_seed, chunks, seed,
             output, overwrite, cache, device, dtype, metrics, hash_checkpoint, save_every, rope_precision,
             compile_mode, overlap_decode, attention_stats, attention_queries, prefix, prefix_chunks, reference,
             weights_dtype, offload, backend, fsdp, split_heads, nproc_per_node, resume_dir, no_progress, **memory):
    """Generate a video from TRAJECTORY (a YAML file of actions, or of prompt segments for the
    text-to-video presets; see trajectories/README.md).

    Writes to the run folder: video.mp4 (H.264, appended chunk by chunk), chunks.jsonl (one record
    per chunk: actions, cache slots and their virtual positions, timings, memory) and summary.json.

    \b
    Example (CPU, built-in tiny model):
      worldtrace generate --preset tiny --image assets/images/mg2_universal_0000.png \\
          trajectories/aba.yaml --chunks 16 -o out-tiny/
      worldtrace generate --preset self-forcing-tiny trajectories/prompts_aba.yaml \\
          --cache landmark --chunks 400 -o out-text/
    """
    ctx = click.get_current_context()

    from ..engine.launch import torchrun_world

    rank, world = torchrun_world()

    def build_and_run():
        _refuse_launch(nproc_per_node, world, fsdp, split_heads)
        if resume_dir is not None:
            report(_resume(ctx))
        elif not (fsdp or split_heads):
            from ..jobs.generate import run_generation  # checks the inputs before torch loads

            report(run_generation(_run_config(ctx, memory)))
        else:
            _sharded(ctx, _run_config(ctx, memory), report)

    def report(summary):
        t = summary["totals"]
        click.echo(f"worldtrace: wrote {summary['run_dir']}: {t['chunks']} chunks, {t['pixel_frames']} frames, "
                   f"{t['seconds_per_chunk']:.3f} s/chunk", err=True)
        click.echo(summary["run_dir"])  # stdout: the run folder, for scripts

    if world <= 1:
        run_job(build_and_run)
        return
    # one of torchrun's processes: process 0 says what went wrong; the others stay quiet about the refusals
    # every process meets alike (the inputs), leave their own failures' line for --nproc-per-node's launcher
    # and, once in the process group, end without Python's teardown (gloo's threads aborted it: exit 134)
    from ..engine import shard
    from ..engine.launch import ERRORS_ENV, note_failure, wait_for_process_0

    def quiet(line: str, code: int) -> bool:
        note_failure(line, code)
        if not shard.active():
            # a refusal before the process group (the inputs, the folder) is process 0's too: let it say it
            # first; exiting before it made torchrun end process 0 before its line (CI, a loaded machine)
            wait_for_process_0()
            return True
        if os.environ.get(ERRORS_ENV):
            return True
        click.echo(f"worldtrace: process {rank} of {world}: {line}", err=True)
        return True

    code = 0
    try:
        run_job(build_and_run, say=quiet if rank else None)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    note_failure("", code)  # the exit code, for --nproc-per-node's launcher (process 0's line is on stderr)
    if not shard.joined():
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _plan_for_card(ctx, device_gb: float | None) -> None:
    """``--device-gb``: the memory check of this command's runs plans for a card of ``device_gb`` GB
    (:func:`~worldtrace_cli.jobs.bench_memory.planned_card`, for as long as the command runs). Raises
    click.BadParameter: NaN."""
    if device_gb is None:
        return
    if device_gb != device_gb:
        raise click.BadParameter(f"must be a number of GB, got {device_gb}")
    from ..jobs.bench_memory import planned_card

    ctx.with_resource(planned_card(device_gb))


def _refuse_launch(nproc_per_node: int | None, world: int, fsdp: bool, split_heads: bool) -> None:
    """Refuse a process count that does not fit the run (InputError, one line): ``--nproc-per-node``
    without a way to split the DiT or inside torchrun, torchrun's processes without one."""
    from ..errors import InputError

    if nproc_per_node is not None and not (fsdp or split_heads):
        raise InputError(f"--nproc-per-node {nproc_per_node}: splits the DiT across processes; add --fsdp or "
                         f"--split-heads")
    if nproc_per_node is not None and world > 1:
        raise InputError(f"--nproc-per-node: this process is already one of {world} launched by torchrun; drop "
                         f"--nproc-per-node (torchrun's --nproc-per-node says how many)")
    if world > 1 and not (fsdp or split_heads):
        raise InputError(f"launched by torchrun as {world} processes without --fsdp or --split-heads: they would "
                         f"be {world} identical runs racing for one folder; add --fsdp or --split-heads, or run "
                         f"one process")


def _resume(ctx) -> dict:
    """``generate --resume RUN_DIR``: the run's saved config (flags that would change the video are
    ignored, with a warning naming them; ``--no-progress`` and ``--overlap-decode`` are honoured),
    continued. Returns its summary."""
    from dataclasses import replace

    from ..errors import InputError
    from ..jobs.generate import run_generation
    from ..runs.resume import resume_config

    p = ctx.params
    if p["fsdp"] or p["split_heads"]:
        flag = "--fsdp" if p["fsdp"] else "--split-heads"
        raise InputError(f"{flag} with --resume: not supported yet; resume without {flag}")
    flags = {param.name: max(param.opts, key=len) for param in ctx.command.params}
    honoured = ("resume_dir", "no_progress", "overlap_decode")  # they do not change the video
    given = [flags[name] for name, value in p.items()
             if name not in honoured and value is not None
             and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        logging.getLogger("worldtrace").warning(
            f"--resume continues the run with its own settings; ignored: {', '.join(given)}")
    cfg = replace(resume_config(p["resume_dir"]), output=p["resume_dir"], progress=not p["no_progress"])
    if ctx.get_parameter_source("overlap_decode") == click.core.ParameterSource.COMMANDLINE:
        cfg = replace(cfg, overlap_decode=p["overlap_decode"])
    return run_generation(cfg, resume=True)


def _run_config(ctx, memory: dict):
    """The :class:`~worldtrace_cli.config.RunConfig` of a new run from the command line (``ctx.params``;
    ``memory``: the writer options): the preset (default by the trajectory's mode and ``--checkpoint``),
    the model's own cache unless ``--cache`` names one (memory flags given still apply), the output
    folder (default ``runs/<trajectory>-<cache>``). Raises InputError: no TRAJECTORY, several writers."""
    from ..config import RunConfig, default_cache, default_preset_name, load_preset
    from ..errors import InputError
    from ..outputs.files import cache_folder
    from ..trajectory import load_trajectory

    p = ctx.params
    trajectory, cache = p["trajectory"], p["cache"]
    if trajectory is None:
        raise InputError("missing TRAJECTORY (or --resume RUN_DIR); see worldtrace generate --help")
    if cache is not None and "," in cache:
        raise InputError(f"--cache {cache}: generate runs one writer; to run several on one trajectory, side by "
                         f"side: worldtrace compare {trajectory} --cache {cache}")
    name = p["preset"]
    if name is None:
        name = default_preset_name(load_trajectory(trajectory).mode, p["checkpoint"])
        logging.getLogger("worldtrace").info(f"preset: {name}")
    resolved = load_preset(name)
    options = {"cache": cache, **memory}
    if cache is None:  # the model's own cache; memory flags given on the command line still apply
        given = {k: v for k, v in memory.items()
                 if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE}
        options = {**memory, **default_cache(resolved), **given}
    out = p["output"] or Path("runs") / f"{trajectory.stem}-{cache_folder(options['cache'])}"
    same = ("trajectory", "image", "chunks", "world_seed", "prompt", "poses", "intrinsics", "prompt_switch",
            "weights_dtype", "offload", "seed", "device", "dtype", "checkpoint", "random_weights", "overwrite",
            "hash_checkpoint", "metrics", "save_every")
    if p["backend"] != "native" and (p["fsdp"] or p["split_heads"]):
        raise InputError(f"--backend {p['backend']} with {'--fsdp' if p['fsdp'] else '--split-heads'}: not wired yet; "
                         f"run one process")
    return RunConfig(preset=resolved, output=out, memory=memory_config(preset=resolved, **options),
                     progress=not p["no_progress"], **{k: p[k] for k in same},
                     **speed_config(p["rope_precision"], p["compile_mode"], p["overlap_decode"], p["backend"]),
                     **attention_config(p["attention_stats"], p["attention_queries"]),
                     **prefix_config(p["prefix"], p["prefix_chunks"], p["reference"]))


def _sharded(ctx, cfg, report) -> None:
    """``--fsdp`` / ``--split-heads``: with ``--nproc-per-node`` the inputs are checked once here, then
    N processes launched (this process exits with their code); under torchrun this process joins the
    group, process 0 generates and ``report`` s the run, the others make the same chunks
    (:func:`~worldtrace_cli.jobs.generate.follow_generation`)."""
    from ..engine.shard_check import check, check_gpus  # torch-free: every refusal comes before torch loads
    from ..errors import InputError
    from ..jobs.inputs import check_inputs
    from ..runs import RunFolder

    p = ctx.params
    if p["fsdp"] and p["split_heads"]:
        raise InputError("--fsdp and --split-heads: choose one (--split-heads also splits the attention and FFN "
                         "weights across the processes)")
    mode = "fsdp" if p["fsdp"] else "heads"
    check(cfg, mode, world=p["nproc_per_node"])
    check_inputs(cfg)
    RunFolder(cfg.output).refuse_occupied(cfg.overwrite)
    from ..engine import shard  # torch: the process group (engine/shard.py)
    from ..engine.base import resolve_device

    if p["nproc_per_node"] is not None:  # the documented way: inputs checked once here, then the N processes
        import torch

        from ..engine.launch import launch

        check_gpus(p["nproc_per_node"], resolve_device(cfg.device).type, torch.cuda.device_count())
        sys.exit(launch(command_line(ctx, drop=("nproc_per_node",)), p["nproc_per_node"]))
    from ..jobs.generate import follow_generation, run_generation

    shard.start(resolve_device(cfg.device), mode)
    clean = False
    try:
        if shard.rank():
            follow_generation(cfg)  # process 0 writes and reports the run
        else:
            report(run_generation(cfg))
        clean = True
    finally:
        shard.finish(clean)
