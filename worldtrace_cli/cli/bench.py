"""``worldtrace bench``: mechanism (synthetic scenes), speed, landmark tau calibration."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import click

from .common import run_job
from .options import (NonEmptyPath, attention_config, attention_options, device_options, int_list, name_list,
                      preset_option, speed_options, writer_flag_help)
from .shared_options import MODEL_CACHE, option


def _finite(ctx, param, value):
    """A click callback refusing NaN (which passes every range check) as a usage error naming the option."""
    if value is not None and value != value:
        raise click.BadParameter(f"must be a number of GB, got {value}")
    return value


def _writers(ctx, param, value):
    """Comma-separated writer specs, each known and with a valid ``:arg`` (``mixed:2``, ``worldkv:0.25``),
    checked at parse time, without torch, by the writers' own flag check."""
    import re

    from ..config import MemoryConfig
    from ..errors import InputError
    from ..writer_options import check_flags

    items = name_list(ctx, param, value)
    for spec in items or []:
        try:
            check_flags(MemoryConfig(cache=spec))
        except InputError as e:  # "--cache: unknown writer ..." / "--cache mixed:x: ...": click names the option
            raise click.BadParameter(re.sub(r"^--cache:? ", "", str(e))) from None
    return items


def _schemes(ctx, param, value):
    """Comma-separated position schemes, each known."""
    from ..writer_options import POSITION_SCHEMES

    items = name_list(ctx, param, value)
    for scheme in items or []:
        if scheme not in POSITION_SCHEMES:
            raise click.BadParameter(f"unknown scheme {scheme!r} (choose from {', '.join(POSITION_SCHEMES)})")
    return items


def _routes(ctx, param, value):
    """Comma-separated loops of scene letters, two or more each, ending in a scene visited before
    (``ABA``: A, B, back to A): the return query is in the last scene."""
    items = name_list(ctx, param, value)
    for route in items:
        if len(route) < 2 or not route.isalpha():
            raise click.BadParameter(f"{route!r}: a route is two or more scene letters, e.g. ABA or ABCA")
        if route[-1] not in route[:-1]:
            raise click.BadParameter(f"{route!r}: the last scene is the return, so it must be one visited "
                                     f"before (e.g. {route + route[0]})")
    return items


@click.group()
def bench():
    """Benchmarks: memory mechanism on synthetic scenes, speed, landmark tau calibration."""


@bench.command("mechanism")
@click.option("--writers", "--caches", "--cache", "writers", default=None, callback=_writers,
              help="Comma-separated writers (default: all registered; mixed as mixed:2).")
@click.option("--schemes", default=None, callback=_schemes, help="Comma-separated position schemes (default: all).")
@click.option("--routes", default="ABA,ABCA", show_default=True, callback=_routes,
              help="Loops of scene letters; the return query is in the last scene.")
@click.option("--legs", default="2,8,32", show_default=True, callback=int_list(1), help="Chunks per leg of the loop.")
@option("--seed", type=int, default=0, show_default=True, note="the synthetic scene keys and their noise")
@click.option("--landmark-threshold", type=click.FloatRange(0, 2, min_open=True), default=0.1, show_default=True,
              help=writer_flag_help("landmark_threshold"))
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=Path("bench-results"), show_default=True,
        note=": the results' folder")
@option("--name", default="mechanism", show_default=True)
def bench_mechanism(writers, schemes, routes, legs, seed, landmark_threshold, output, name):
    """Attention mismatch ||alpha_hat P - alpha||_1 and scene-A recall mass of every writer x scheme
    on synthetic scene keys (paper App. B), computed with the real RoPE code."""
    from ..jobs.bench_mechanism import SceneSetup, mechanism_benchmark, write_mechanism_report

    def job():
        setup = SceneSetup(seed=seed)
        rows = mechanism_benchmark(writers, schemes, tuple(routes), tuple(legs), setup, landmark_threshold)
        paths = write_mechanism_report(rows, output, name, setup)
        for path in paths:
            click.echo(f"worldtrace: wrote {path}", err=True)
        click.echo(str(paths[-1]))  # stdout: one line for scripts (the tables' file)

    run_job(job)


@bench.command("tau")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--min-change", type=click.FloatRange(0, min_open=True), default=10.0, show_default=True,
              help="View change (degrees per latent frame) that counts as a scene entry (ground-truth runs).")
@click.option("--rate", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.1, show_default=True,
              help="Landmark share of frames for the suggestion without ground truth.")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=Path("bench-results"), show_default=True,
        note=": the folder of tau.json and tau.md")
@option("--print", "show", is_flag=True, note="the Markdown (tau.md)")
def bench_tau(run_dirs, min_change, rate, output, show):
    """Suggest the landmark threshold tau from the detector distances that landmark runs logged
    (RUN_DIRS: run folders of --cache landmark; for loopworld runs, against the true view changes)."""
    from ..metrics.calibrate import calibrate, calibration_markdown
    from ..outputs import atomic_path, write_json_atomic

    def job():
        try:
            result = calibrate(list(run_dirs), min_change, rate)
        except ValueError as exc:
            from ..errors import InputError

            raise InputError(str(exc)) from None
        text = calibration_markdown(result)
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from ..errors import OutputError

            raise OutputError(f"-o {output}: cannot create the folder ({exc.strerror or exc})") from None
        write_json_atomic(output / "tau.json", result, indent=1)
        with atomic_path(output / "tau.md") as tmp:  # never a torn tau.md on a full disk
            Path(tmp).write_text(text)
        tau = result.get("tau", result["by_rate"]["tau"])  # against the true view changes where known
        click.echo(f"worldtrace: suggested tau {tau:.4f}; wrote {output / 'tau.json'} and tau.md", err=True)
        click.echo(text if show else str(output / "tau.md"))  # stdout: one line for scripts unless --print

    run_job(job)


@bench.command("memory")
@preset_option("tiny", note="planned at its full size")
@option("--cache", default=None, metavar="WRITER", callback=_writers, default_text=MODEL_CACHE + ", with its settings")
@option("--budget", type=click.IntRange(0), default=None)
@option("--chunks", type=click.IntRange(1), default=64, show_default=True,
        note="; a growing cache such as full is planned at this many chunks")
@option("--offload", type=click.Choice(["none", "text", "blocks", "auto"]), default="text", show_default=True,
        note="; none = the text encoder stays on the GPU; auto = the first of text, text+fp8, blocks, blocks+fp8 "
             "that fits --device-gb")
@option("--weights-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True)
@option("--dtype", type=click.Choice(["bf16", "fp32"]), default=None,
        default_text="bf16, a GPU run's; fp32 for the tiny presets, which run on CPU")
@option("--device-gb", type=click.FloatRange(0, 1e6, min_open=True), default=None, callback=_finite,
        default_text="this machine's GPU, if any")
@option("--random-weights", is_flag=True,
        note="; planned as such a run (LingBot / Self-Forcing: the tiny random umT5, not umT5-XXL)")
@option("--json", "as_json", is_flag=True, note="the plans (instead of a table)")
def bench_memory(preset, cache, budget, chunks, offload, weights_dtype, dtype, device_gb, random_weights, as_json):
    """Peak GPU memory of a run, per phase (load, text encoding, denoise, context pass, decode), in GB:
    the real modules run at the real shapes without memory (PyTorch's FakeTensorMode and MemTracker),
    on any machine, in seconds (10-20 s for the 14B LingBot-World DiT on a 2-core CPU, at any --chunks).

    Leaves out the CUDA context, cuBLAS/cuDNN workspaces and allocator rounding; "fits" keeps 5 %
    and 1 GB of room for them (docs/gpu-memory.md). generate refuses a CUDA run that does not fit.

    \b
    LingBot-World on an 80 GB card:
      worldtrace bench memory --preset lingbot-fast --device-gb 80 --offload auto
    """
    import json

    from ..config import default_cache, load_preset, memory_config
    from ..engine.base import DTYPES
    from ..errors import InputError
    from ..jobs.bench_memory import device_memory_gb, fits, memory_markdown, memory_plans, model_summary
    from ..jobs.inputs import check_writers
    from ..writer_options import MemoryConfig, settings_for

    def job():
        if len(cache or []) > 1:
            raise InputError(f"--cache {','.join(cache)}: bench memory plans one writer")
        resolved = load_preset(preset)
        options = default_cache(resolved) if cache is None else {"cache": cache[0]}
        if budget is not None:
            options = {**options, "budget": budget}
        # a plan of the whole run: a growing cache (full, yarn) is planned past generate's default cap, said below
        options = settings_for(options["cache"], {**options, "max_cache_gb": 1e12})
        memory = memory_config(preset=resolved, **options)
        check_writers([memory], resolved)
        if device_gb is None:
            gb, name = device_memory_gb("auto") or (None, None)  # this machine's GPU, if any
        else:
            gb, name = device_gb, f"--device-gb {device_gb:g}"
        if offload == "auto" and gb is None:
            raise InputError("--offload auto: needs --device-gb (this machine has no GPU to plan for)")
        dt = DTYPES[dtype or ("fp32" if resolved.weights == "random" else "bf16")]
        plans = memory_plans(resolved, memory, offload, weights_dtype, dt, chunks,
                             False if random_weights else None, gb)
        cap = MemoryConfig.of(cache="full").settings().max_cache_gb  # generate's default --max-cache-gb
        # the plan holds the cache after chunks - 1 commits; generate's check counts the last chunk's too
        stored = max(p.parts.get("cache", 0) for p in plans) / 1e9 * chunks / max(1, chunks - 1)
        if "max_cache_gb" in options and 2 * stored > cap:  # the cap counts 2 copies (memory/full.py)
            logging.getLogger("worldtrace").warning(
                f"--cache {memory.cache}: {chunks} chunks keep {stored:.1f} GB of KV cache; generate stops such a "
                f"run at its --max-cache-gb {cap:g} unless given --max-cache-gb {math.ceil(2 * stored)} or more")
        model = model_summary(resolved)  # the sizes planned (a preset may assume one: its description says)
        if as_json:
            click.echo(json.dumps({"device": name, "device_gb": gb, "model": model, "plans": [
                {**p.to_dict(), "fits": None if gb is None else fits(p, gb)} for p in plans]}, indent=1))
        else:
            dit = model["dit"]
            click.echo(f"model: {model['preset']} at {model['resolution']}, DiT dim {dit['dim']}, ffn {dit['ffn_dim']}, "
                       f"{dit['num_heads']} heads, {dit['num_layers']} layers, {model['dit_parameters'] / 1e9:.2f} B "
                       f"parameters ({model['description']})")
            click.echo(memory_markdown(plans, gb, name))

    run_job(job)


@bench.command("speed")
@preset_option("tiny", note="random weights at its full size")
@option("--random-weights", is_flag=True, note="; the speed bench always uses them (the flag is accepted for clarity)")
@option("--caches", "--cache", "caches", default="sliding,field,landmark", show_default=True, callback=_writers)
@option("--chunks", default="8,16", show_default=True, callback=int_list(1),
        note=", comma-separated: one rollout per writer to the largest, snapshots at each")
@device_options
@option("--image", type=click.Path(path_type=Path), default=None,
        default_text="a gradient; text-to-video presets take a fixed prompt instead")
@option("--warmup", type=click.IntRange(0), default=1, show_default=True,
        note="chunks left out of the timings (3 or more with --compile: compilation and CUDA-graph recording)")
@click.option("--no-decode", is_flag=True, help="Skip the VAE decode (DiT and cache only).")
@speed_options
@attention_options
@option("--budget", type=click.IntRange(0), default=None,
        note="; one value for every writer: 6 compares them at one cache size")
@click.option("--repeats", type=click.IntRange(1), default=1, show_default=True,
              help="Run the writers in turn this many times; the summary takes medians.")
@option("--weights-dtype", type=click.Choice(["auto", "fp8"]), default="auto", show_default=True)
@option("--offload", type=click.Choice(["text", "blocks"]), default="text", show_default=True)
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=Path("bench-results"), show_default=True,
        note=": the results' folder (JSON and Markdown; files of the same --name are replaced)")
@option("--name", default=None, default_text="speed-<preset>-<device>")
def bench_speed(preset, random_weights, caches, chunks, device, dtype, image, warmup, no_decode, rope_precision,
                compile_mode, overlap_decode, attention_stats, attention_queries, budget, repeats, weights_dtype, offload,
                output, name):
    """Seconds per chunk by phase, wall-clock seconds per chunk, DiT forward time, fps and peak memory
    of each writer (JSON + Markdown with the device, versions and command).

    Phase timers synchronise the generating CUDA stream; fps is pixel frames over wall-clock time.
    Runs on CPU with the tiny preset for smoke tests.

    \b
    Full-size MG2 on a GPU (the targets in benchmarks/README.md):
      worldtrace bench speed --preset mg2-universal --random-weights \\
          --caches sliding,field,landmark --chunks 64,256,512
    The cost of --attention-stats: the same command with and without it (docs/performance.md).
    """
    import json

    from ..jobs.bench_speed import speed_benchmark, speed_markdown

    attention = attention_config(attention_stats, attention_queries)

    def job():
        result = speed_benchmark(preset, tuple(caches), tuple(chunks), device, dtype, image,
                                 warmup, not no_decode, rope_precision=rope_precision, compile_mode=compile_mode,
                                 overlap_decode=overlap_decode, budget=budget, repeats=repeats,
                                 weights_dtype=weights_dtype, offload=offload, **attention)
        result["meta"]["command"] = sys.argv
        output.mkdir(parents=True, exist_ok=True)
        stem = name or f"speed-{preset}-{result['meta']['device'].split(':')[0]}"
        (output / f"{stem}.json").write_text(json.dumps(result, indent=1))
        (output / f"{stem}.md").write_text(f"# Speed: {stem}\n\n`{' '.join(sys.argv)}`\n\n" + speed_markdown(result) + "\n")
        click.echo(f"worldtrace: wrote {output / stem}.json and .md", err=True)
        click.echo(f"{output / stem}.md")  # stdout: one line for scripts (the table's file)

    run_job(job)
