"""``worldtrace compare``: one trajectory through several cache writers, side by side."""

from __future__ import annotations

from pathlib import Path

import click

from .common import run_job
from .options import (CHUNKS, SEED, NonEmptyPath, attention_config, attention_options, checkpoint_option,
                      device_options, memory_options, name_list, overall_progress, prefix_config, prefix_options,
                      preset_option, speed_config, speed_options, backend_option)
from .shared_options import option


@click.command("compare")
@click.argument("trajectory", type=click.Path(path_type=Path))
@option("--cache", "--caches", "caches", default="sliding,field,landmark", show_default=True, metavar="W1,W2,...",
        callback=name_list, note=" to compare")
@preset_option(note="default: as generate's")
@checkpoint_option
@option("--image", type=click.Path(path_type=Path), default=None, note=", shared by every mode",
        default_text="the trajectory's")
@option("--seed", type=SEED, default=None, note="the noise, shared by every mode", default_text="the trajectory's, else 0")
@option("--world-seed", type=SEED, default=0, show_default=True,
        note="; every mode walks it (the truth is the video's first panel)")
@option("--chunks", type=CHUNKS, default=None, default_text="the trajectory's length")
@click.option("--hud/--no-hud", default=True, show_default=True,
              help="Overlay the pressed keys and the mouse direction of every pixel frame.")
@option("--metrics", type=click.Choice(["fast", "all"]), default="all", show_default=True)
@device_options
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=None, metavar="DIR",
        note=": compare.md, compare.mp4 and one run folder per writer", default_text="runs/compare-<trajectory>")
@option("--overwrite", is_flag=True, note=" (a comparison or its runs)")
@option("--progress/--no-progress", default=None)
@option("--print", "print_markdown", is_flag=True, note="compare.md")
@click.option("--scale", type=click.IntRange(1, 8), default=1, show_default=True,
              help="Upscale the panels of compare.mp4 / compare.png by this integer factor (nearest "
                   "neighbour), e.g. 3 for the 176x96 loopworld and tiny models.")
@memory_options
@speed_options
@backend_option
@attention_options
@prefix_options
def compare(trajectory, caches, preset, checkpoint, random_weights, image, seed, world_seed, chunks, hud, metrics,
            device, dtype, output, overwrite, progress, print_markdown, scale, rope_precision, compile_mode, overlap_decode,
            backend, attention_stats, attention_queries, prefix, prefix_chunks, reference, **memory):
    """Run TRAJECTORY through several cache writers and show them side by side.

    Each writer runs with the same image, seed and actions into DIR/<cache>/ (a normal run folder);
    then DIR/compare.mp4 puts the videos next to each other (a 2-row grid beyond 3 writers), each
    panel labelled, with an optional HUD of the keys and mouse of the current pixel frame, and
    DIR/compare.png shows a few frames of each (loopworld: the true frames first).
    DIR/compare.md and compare.json list per writer s/chunk, peak RSS / GPU memory, KV-cache bytes
    and the metrics. With --attention-stats, DIR/compare_attention.png shows each writer's attention
    per cache slot over the chunks (the return chunks and the slots holding their first visit marked)
    and compare.md adds each writer's recall attention. Prints the path of compare.md on stdout
    (--print: its Markdown).

    \b
    Example (CPU, the embedded loopworld model, scored against the true render):
      worldtrace compare trajectories/aba.yaml --cache sliding,field,landmark --chunks 16 -o cmp/
      worldtrace compare trajectories/look_back.yaml --cache sliding,landmark --attention-stats
      worldtrace compare trajectories/look_back.yaml --cache sliding,field,landmark --prefix truth:4
    """
    from ..jobs.compare import compare_markdown, run_compare

    attention = attention_config(attention_stats, attention_queries)

    def job():
        out = output or Path("runs") / f"compare-{trajectory.stem}"
        overall, per_chunk = overall_progress(progress)
        result = run_compare(trajectory, caches, out, preset, image,
                             seed, chunks, hud, metrics, device, dtype, checkpoint, random_weights, overwrite,
                             per_chunk, speed_config(rope_precision, compile_mode, overlap_decode, backend), world_seed,
                             memory, scale, overall=overall, attention=attention,
                             prefix=prefix_config(prefix, prefix_chunks, reference))
        click.echo(f"worldtrace: wrote {out / 'compare.mp4'}, compare.md, compare.json", err=True)
        # stdout: one line for scripts (the table's file), or the Markdown itself with --print
        click.echo(compare_markdown(result) if print_markdown else str((out / "compare.md").resolve()))  # absolute, as generate's

    run_job(job)
