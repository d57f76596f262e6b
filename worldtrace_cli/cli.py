"""``worldtrace`` command line: parse flags, call one library function, map errors to exit codes.

Heavy imports (torch, diffusers) happen inside commands so ``--help`` is instant. Logs go to
stderr; results go to files. Exit codes are listed in :mod:`worldtrace_cli.errors`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from . import __version__
from .errors import Interrupted, WorldtraceError
from .options import SEED, device_options, memory_config, memory_options, speed_config, speed_options



class _EchoHandler(logging.Handler):
    """Log records as ``worldtrace: message`` lines on the current stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"worldtrace: {record.getMessage()}", err=True)


def _run(fn, *args, **kwargs):
    """Call ``fn``; print WorldtraceErrors as one line and exit with their code."""
    try:
        return fn(*args, **kwargs)
    except WorldtraceError as exc:
        kind = "stopped" if isinstance(exc, Interrupted) else "error"
        click.echo(f"worldtrace: {kind}: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("worldtrace: interrupted; the run folder holds every finished chunk", err=True)
        sys.exit(Interrupted.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="worldtrace")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr.")
def main(verbose: bool) -> None:
    """Long-horizon video generation with Matrix-Game-2.0 and addressable KV-cache memory.

    Generate a video from a conditioning image and a trajectory of keyboard/mouse actions,
    chunk by chunk, through a chosen KV-cache writer. Run `worldtrace COMMAND --help` for details.
    """
    logger = logging.getLogger("worldtrace")
    if not any(isinstance(h, _EchoHandler) for h in logger.handlers):
        logger.addHandler(_EchoHandler())
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


@main.command()
@click.argument("trajectory", type=click.Path(path_type=Path), required=False)
@click.option("--preset", default=None, metavar="NAME|FILE",
              help="Model preset: loopworld (trained embedded world, CPU), tiny (random weights, CPU), "
                   "mg2-universal, mg2-gta-drive, mg2-templerun, or a preset YAML. Default: mg2-<trajectory mode> "
                   "with --checkpoint, else loopworld (universal) or tiny.")
@click.option("--checkpoint", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Official Matrix-Game-2.0 folder (Wan2.1_VAE.pth, the CLIP .pth, the DiT safetensors).")
@click.option("--random-weights", is_flag=True, help="Run a checkpoint preset at full size with seeded random weights.")
@click.option("--image", type=click.Path(path_type=Path), default=None,
              help="Conditioning image (any format PIL reads; overrides the trajectory's `image`). With "
                   "loopworld the start image is the world's own view unless this is given.")
@click.option("--world-seed", type=SEED, default=0, show_default=True,
              help="loopworld: the procedural world to walk (its start view conditions the model, its renders "
                   "are the ground truth).")
@click.option("--chunks", type=int, default=None,
              help="Chunks to generate (3 latent frames = 12 pixel frames each); repeats the last segment "
                   "or truncates the trajectory. Default: the trajectory's length.")
@click.option("--seed", type=SEED, default=None,
              help="Noise seed >= 0 (default: the trajectory's seed, else 0).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Run folder (default: runs/<trajectory>-<cache>).")
@click.option("--overwrite", is_flag=True, help="Replace a finished run already in the output folder.")
@click.option("--cache", default="sliding", show_default=True, metavar="WRITER",
              help="KV-cache writer: sliding, sink, full, field, field-streaming, landmark, mixed:K, naive, "
                   "memrope, yarn (README: 'Memory writers').")
@memory_options
@device_options
@click.option("--metrics", type=click.Choice(["none", "fast", "all"]), default="fast", show_default=True,
              help="Per-chunk metrics: fast = TempSSIM + LatentDiff; all = + CLIP Scene Drift and PAC "
                   "(one CLIP forward per pixel frame).")
@click.option("--hash-checkpoint", is_flag=True, help="sha256 whole checkpoint files (default: first MiB).")
@click.option("--save-every", type=int, default=16, show_default=True,
              help="Save a resume state every N chunks (0: only on Ctrl-C/SIGTERM).")
@speed_options
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), default=None, metavar="RUN_DIR",
              help="Continue an interrupted run from its last saved state (other options come from the run, "
                   "except --overlap-decode and --no-progress).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def generate(trajectory, preset, checkpoint, random_weights, image, world_seed, chunks, seed, output, overwrite, cache,
             device, dtype, metrics, hash_checkpoint, save_every, rope_precision, compile_mode,
             overlap_decode, resume_dir, no_progress, **memory):
    """Generate a video from TRAJECTORY (a YAML file of actions; see trajectories/README.md).

    Writes to the run folder: video.mp4 (H.264, appended chunk by chunk), chunks.jsonl (one record
    per chunk: actions, cache slots and their virtual positions, timings, memory) and summary.json.

    \b
    Example (CPU, built-in tiny model):
      worldtrace generate --preset tiny --image assets/images/mg2_universal_0000.png \\
          trajectories/aba.yaml --chunks 16 -o out/
    """
    from .config import RunConfig, default_preset_name, load_preset
    from .errors import InputError
    from .outputs import cache_folder
    from .rollout import generate as run_generate
    from .trajectory import load_trajectory

    ctx = click.get_current_context()

    def build_and_run():
        if resume_dir is not None:
            from dataclasses import replace

            flags = {p.name: max(p.opts, key=len) for p in ctx.command.params}
            honoured = ("resume_dir", "no_progress", "overlap_decode")  # they do not change the video
            given = [flags[name] for name, value in ctx.params.items()
                     if name not in honoured and value is not None
                     and ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
            if given:
                logging.getLogger("worldtrace").warning(
                    f"--resume continues the run with its own settings; ignored: {', '.join(given)}")

            from .run import resume_config

            cfg = replace(resume_config(resume_dir), output=resume_dir, progress=not no_progress)
            if ctx.get_parameter_source("overlap_decode") == click.core.ParameterSource.COMMANDLINE:
                cfg = replace(cfg, overlap_decode=overlap_decode)
            report(run_generate(cfg, resume=True))
            return
        if trajectory is None:
            raise InputError("missing TRAJECTORY (or --resume RUN_DIR); see worldtrace generate --help")
        name = preset
        if name is None:
            name = default_preset_name(load_trajectory(trajectory).mode, checkpoint)
            logging.getLogger("worldtrace").info(f"preset: {name}")
        out = output or Path("runs") / f"{trajectory.stem}-{cache_folder(cache)}"
        cfg = RunConfig(preset=load_preset(name), trajectory=trajectory, output=out, image=image, chunks=chunks,
                        world_seed=world_seed,
                        seed=seed, device=device, dtype=dtype, checkpoint=checkpoint, random_weights=random_weights,
                        memory=memory_config(cache, **memory),
                        overwrite=overwrite, progress=not no_progress, hash_checkpoint=hash_checkpoint,
                        metrics=metrics, save_every=save_every,
                        **speed_config(rope_precision, compile_mode, overlap_decode))
        report(run_generate(cfg))

    def report(summary):
        t = summary["totals"]
        click.echo(f"worldtrace: wrote {summary['run_dir']}: {t['chunks']} chunks, {t['pixel_frames']} frames, "
                   f"{t['seconds_per_chunk']:.3f} s/chunk", err=True)

    _run(build_and_run)


@main.command("metrics")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--level", type=click.Choice(["fast", "all"]), default="all", show_default=True,
              help="fast = TempSSIM; all = + CLIP Scene Drift and PAC (builds the run's CLIP tower).")
@click.option("--trajectory", type=click.Path(path_type=Path), default=None,
              help="Trajectory for revisit pairing (default: the one in summary.json).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Write the JSON here (default: RUN_DIR/metrics.json). Also printed on stdout.")
def metrics_cmd(run_dir, level, trajectory, device, output):
    """Compute metrics afterwards from a finished or interrupted RUN_DIR (video.mp4 + chunks.jsonl)."""
    import json

    from .errors import InputError

    def job():
        import torch

        from .config import RunConfig
        from .metrics import summarise_run
        from .model.checkpoint import load_clip_tower
        from .rollout import resolve_device
        from .run import resume_config

        if not (run_dir / "video.mp4").is_file():
            raise InputError(f"{run_dir}: no video.mp4 (not a worldtrace run folder)")
        tower = None
        if level == "all":  # the CLIP tower of the model that made the run (its own preset, even a YAML one)
            summary_path = run_dir / "summary.json"
            if summary_path.is_file():
                cfg = RunConfig.from_dict(json.loads(summary_path.read_text())["config"])
            else:
                cfg = resume_config(run_dir)  # an interrupted run: its saved settings (InputError if none)
            tower = load_clip_tower(cfg.preset, cfg.checkpoint, cfg.random_weights, cfg.weights_seed,
                                    resolve_device(device), torch.float32)
        with torch.no_grad():
            result = summarise_run(run_dir, tower, level, trajectory)
        text = json.dumps(result, indent=1)
        (output or run_dir / "metrics.json").write_text(text)
        click.echo(text)

    _run(job)


def _csv(value: str | None, cast=str) -> list | None:
    return None if value is None else [cast(v.strip()) for v in value.split(",") if v.strip()]


@main.group()
def bench():
    """Benchmarks: memory mechanism on synthetic scenes, speed, landmark tau calibration."""


@bench.command("mechanism")
@click.option("--writers", default=None, help="Comma-separated writers (default: all registered; mixed as mixed:2).")
@click.option("--schemes", default=None, help="Comma-separated position schemes (default: all).")
@click.option("--routes", default="ABA,ABCA", show_default=True, help="Loops; the return query is in the last scene.")
@click.option("--legs", default="2,8,32", show_default=True, help="Chunks per leg of the loop.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--landmark-threshold", type=float, default=0.1, show_default=True, help="tau of the landmark detector.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("benchmarks/results"), show_default=True,
              help="Folder for the results.")
@click.option("--name", default="mechanism", show_default=True, help="File stem of the results.")
def bench_mechanism(writers, schemes, routes, legs, seed, landmark_threshold, output, name):
    """Attention mismatch ||alpha_hat P - alpha||_1 and scene-A recall mass of every writer x scheme
    on synthetic scene keys (paper App. B), computed with the real RoPE code."""
    from .bench import SceneSetup, mechanism_benchmark, write_mechanism_report

    def job():
        setup = SceneSetup(seed=seed)
        rows = mechanism_benchmark(_csv(writers), _csv(schemes), tuple(_csv(routes)), tuple(_csv(legs, int)),
                                   setup, landmark_threshold)
        for path in write_mechanism_report(rows, output, name, setup):
            click.echo(f"worldtrace: wrote {path}", err=True)

    _run(job)


@bench.command("tau")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--min-change", type=click.FloatRange(0, min_open=True), default=10.0, show_default=True,
              help="View change (degrees per latent frame) that counts as a scene entry (ground-truth runs).")
@click.option("--rate", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.1, show_default=True,
              help="Landmark share of frames for the suggestion without ground truth.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Folder for tau.json and tau.md (default: print only).")
def bench_tau(run_dirs, min_change, rate, output):
    """Suggest the landmark threshold tau from the detector distances that landmark runs logged
    (RUN_DIRS: run folders of --cache landmark; for loopworld runs, against the true view changes)."""
    from .calibrate import calibrate, calibration_markdown
    from .outputs import write_json_atomic

    def job():
        try:
            result = calibrate(list(run_dirs), min_change, rate)
        except ValueError as exc:
            from .errors import InputError

            raise InputError(str(exc)) from None
        text = calibration_markdown(result)
        if output is not None:
            output.mkdir(parents=True, exist_ok=True)
            write_json_atomic(output / "tau.json", result, indent=1)
            (output / "tau.md").write_text(text)
        click.echo(text)

    _run(job)


@bench.command("speed")
@click.option("--preset", default="tiny", show_default=True, help="Model preset (random weights at its full size).")
@click.option("--random-weights", is_flag=True, help="Accepted for clarity: the speed bench always uses random weights.")
@click.option("--caches", default="sliding,field,landmark", show_default=True, help="Comma-separated writers.")
@click.option("--chunks", default="8,16", show_default=True,
              help="Comma-separated chunk counts: one rollout per writer to the largest, snapshots at each.")
@device_options
@click.option("--image", type=click.Path(path_type=Path), default=None, help="Conditioning image (default: a gradient).")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Chunks excluded from the timings (3 or more with --compile: compilation and CUDA-graph recording).")
@click.option("--no-decode", is_flag=True, help="Skip the VAE decode (DiT and cache only).")
@speed_options
@click.option("--budget", type=int, default=None,
              help="Past latent-frame slots of every writer (default: each writer's own: sliding 3, WorldTrace 6). "
                   "Use 6 to compare writers at one cache size.")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True,
              help="Run the writers in turn this many times; the summary takes medians.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("benchmarks/results"), show_default=True)
@click.option("--name", default=None, help="File stem of the results (default: speed-<preset>-<device>).")
def bench_speed(preset, random_weights, caches, chunks, device, dtype, image, warmup, no_decode, rope_precision,
                compile_mode, overlap_decode, budget, repeats, output, name):
    """Seconds per chunk by phase, wall-clock seconds per chunk, DiT forward time, fps and peak memory
    of each writer (JSON + Markdown with the device, versions and command).

    Phase timers synchronise the generating CUDA stream; fps is pixel frames over wall-clock time.
    Runs on CPU with the tiny preset for smoke tests.

    \b
    Full-size MG2 on a GPU (the targets in benchmarks/README.md):
      worldtrace bench speed --preset mg2-universal --random-weights \\
          --caches sliding,field,landmark --chunks 64,256,512
    """
    import json

    from .bench import speed_benchmark, speed_markdown

    def job():
        result = speed_benchmark(preset, tuple(_csv(caches)), tuple(_csv(chunks, int)), device, dtype, image,
                                 warmup, not no_decode, rope_precision=rope_precision, compile_mode=compile_mode,
                                 overlap_decode=overlap_decode, budget=budget, repeats=repeats)
        result["meta"]["command"] = sys.argv
        output.mkdir(parents=True, exist_ok=True)
        stem = name or f"speed-{preset}-{result['meta']['device'].split(':')[0]}"
        (output / f"{stem}.json").write_text(json.dumps(result, indent=1))
        (output / f"{stem}.md").write_text(f"# Speed: {stem}\n\n`{' '.join(sys.argv)}`\n\n" + speed_markdown(result) + "\n")
        click.echo(speed_markdown(result))
        click.echo(f"worldtrace: wrote {output / stem}.json and .md", err=True)

    _run(job)


@main.command("presets")
def list_presets():
    """List the built-in model presets."""
    from .config import load_preset, preset_names

    for name in preset_names():
        p = load_preset(name)
        click.echo(f"{name:16s} {p.mode:10s} {p.height}x{p.width}  {p.description}")


def _register() -> None:
    from .compare import compare
    from .loopbench.cli import loopbench
    from .train.cli import train
    from .world.cli import world

    main.add_command(loopbench)
    main.add_command(compare)
    main.add_command(train)
    main.add_command(world)


_register()

if __name__ == "__main__":
    main()
