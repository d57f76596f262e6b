"""``worldtrace loopbench run|report``: thin click commands over :mod:`.runner` and :mod:`.report`.

Heavy imports (torch, scipy, matplotlib) happen inside the commands so ``--help`` is instant.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from ..loopbench.configs import CONFIGS
from .common import run_job
from .options import (CHUNKS, NonEmptyPath, attention_config, attention_options, checkpoint_option,
                      device_options, memory_options, name_list, overall_progress, preset_option, speed_config,
                      speed_options, backend_option)
from .shared_options import option

_DEFAULT_CONFIGS = ",".join(n for n, c in CONFIGS.items() if c.tier in (1, 2, 3, 4))
# the default sweep is quick (18 jobs on loopworld, minutes on a CPU); --full is the paper's (1,440 jobs, hours)
QUICK = {"configs": ["aba", "abca", "pan_90"], "worlds": "0-1", "seeds": "0"}
# text-to-video presets (LoopBench for prompts): prompt loops x the built-in prompt scenes
QUICK_TEXT = {"configs": ["prompt_aba", "prompt_abca"], "seeds": "0"}
FULL_TEXT = {"configs": ["prompt_aba", "prompt_abca", "prompt_aba_long"], "seeds": "0,42,123,456,789"}
FULL = {"configs": _DEFAULT_CONFIGS.split(","), "worlds": "0-7", "seeds": "0,42,123,456,789"}


@click.group("loopbench")
def loopbench():
    """LoopBench: loops that leave a place and return, scored by PAC (recall) and TempSSIM, and on
    loopworld against the true render (GT-PSNR, GT-SSIM, GT detail on the return legs).

    `run` generates every configuration x writer x image x seed into its own folder (idempotent,
    resumable, shardable); `report` aggregates a sweep folder into the paper's tables and plots.
    Configurations: worldtrace_cli/loopbench/configs.py (trajectories/loopbench/*.yaml).
    """


@loopbench.command("run")
@preset_option("loopworld", note="loopworld is scored against ground truth")
@click.option("--full", is_flag=True,
              help="The paper's sweep: the 12 configurations of tiers 1-4, worlds 0-7, seeds 0,42,123,456,789 "
                   "(1,440 jobs with the default writers: hours on a CPU). Default: a quick sweep of aba, abca, "
                   "pan_90 x worlds 0-1 x seed 0 (18 jobs). --configs, --worlds and --seeds override either.")
@click.option("--configs", default=None, show_default="aba,abca,pan_90 (--full: the 12 of tiers 1-4)",
              callback=name_list,
              help="Comma-separated LoopBench configurations (e.g. aba,abca,aba_n64) or trajectory .yaml files. "
                   f"Known: {', '.join(CONFIGS)}.")
@option("--caches", "--cache", "caches", default="sliding,field,landmark", show_default=True, callback=name_list)
@click.option("--images", default=None, metavar="DIR|A.png,B.png",
              help="Conditioning images (one scene each): every image in a folder, or a comma list.")
@click.option("--prompts", type=click.Path(path_type=Path), default=None, metavar="FILE",
              help="Text-to-video presets (self-forcing-tiny, longlive-tiny, ...): prompt scenes as YAML, "
                   "{name: {A: prompt, B: prompt, C: prompt}}; default: the built-in lighthouse and kitchen. "
                   "Their configurations are prompt loops: prompt_aba, prompt_abca (quick), prompt_aba_long.")
@click.option("--worlds", default=None, metavar="0-7|0,3,5",
              help="Procedural worlds as scenes (loopworld; default 0-1, --full 0-7, when no --images is given).")
@click.option("--seeds", default=None, show_default="0 (--full: 0,42,123,456,789)", help="Comma-separated noise seeds.")
@option("--chunks", type=CHUNKS, default=None, default_text="each configuration's own N",
        note=" of every rollout (smoke tests; truncation can remove the revisit, and then PAC)")
@option("--metrics", type=click.Choice(["fast", "all"]), default="all", show_default=True,
        note="; the report's PAC needs all")
@click.option("--shard", default=None, metavar="I/N",
              help="Run only shard I of N of the sorted job list (0-based; combines with torchrun's RANK/WORLD_SIZE).")
@device_options
@checkpoint_option
@option("--progress/--no-progress", default=None, note=", and one log line per job")
@memory_options
@speed_options
@backend_option
@attention_options
@option("--prefix", "prefixes", default=None, metavar="MODES",
        note=". Comma-separated modes: free (a rollout from the start image, the default), truth:K or a video every "
             "job continues; each job runs in every mode, prefixed jobs in DIR/<config>@<mode>/, reported as "
             "<writer>@<mode> beside the free ones")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), required=True, metavar="DIR",
        note=": the sweep folder, DIR/<config>/<cache>/<image>/seed<N>/ per job, DIR/failures.jsonl")
def run_cmd(preset, full, configs, caches, images, prompts, worlds, seeds, chunks, metrics, shard, device, dtype, checkpoint,
            random_weights, progress, rope_precision, compile_mode, overlap_decode, backend, attention_stats,
            attention_queries, prefixes, output, **memory):
    """Generate a LoopBench sweep: every configuration x writer x image x seed. By default a quick
    one (aba, abca, pan_90 x sliding, field, landmark x worlds 0-1 x seed 0: 18 jobs); --full runs
    the paper's (1,440 jobs).

    Jobs whose folder holds a complete run are skipped, so rerunning the same command resumes a
    killed sweep: an unfinished job continues from its resume state when it saved one (on SIGTERM
    / Ctrl-C, and every 16 chunks), else it is redone. Complete runs made with other settings (another
    --chunks, tau, ...) refuse the sweep before anything runs (exit 4: use another -o folder). A
    failing job is recorded in DIR/failures.jsonl and <job>/failed.json and the sweep goes on; the
    exit code is 5 if any job failed, 130 if interrupted. The model is loaded once per process.

    \b
    Examples:
      worldtrace loopbench run --worlds 0-7 --configs aba,pan_90 --seeds 0,1 -o lb/   # loopworld
      worldtrace loopbench run --preset tiny --images assets/images --configs aba,pan_90 --seeds 0 -o lb/
      worldtrace loopbench run --images assets/images --shard 1/4 -o lb/       # machine 2 of 4
      torchrun --nproc-per-node 8 -m worldtrace_cli loopbench run --preset mg2-universal \\
          --checkpoint MG2/ --images scenes/ -o lb/                        # one GPU per rank
      worldtrace loopbench run --preset self-forcing-tiny -o lb-text/       # A -> B -> A prompt loops
      worldtrace loopbench run --configs aba,ababa,aba_long,pan_360 --worlds 0-7 --caches sliding,landmark \\
          --attention-stats -o lb-recall/                                   # + recall attention
      worldtrace loopbench run --configs trajectories/look_back.yaml --worlds 8-15 --caches sliding,field,landmark \\
          --prefix free,truth:4 -o lb-prefix/                                # a real first visit
      worldtrace loopbench report lb/
    """

    attention = attention_config(attention_stats, attention_queries)

    def job():
        from ..config import check_backend, load_preset
        from ..errors import InputError, OutputError, RunError
        from ..jobs.loopbench import run_jobs
        from ..loopbench import plan

        resolved = load_preset(preset)
        check_backend(resolved, backend, compile_mode, rope_precision)  # before any job: every job would fail
        world_preset, by_prompts = resolved.has_world, resolved.backbone.takes_prompts
        if by_prompts:  # LoopBench for prompts: prompt loops x prompt scenes
            if images is not None or worlds is not None:
                raise InputError(f"--{'images' if images is not None else 'worlds'}: preset {preset} is text-to-video: "
                                 f"its scenes are prompts (--prompts FILE; default: the built-in scenes)")
        elif prompts is not None:
            raise InputError(f"--prompts: only text-to-video presets take prompt scenes (preset {preset})")
        elif images is None and worlds is None and not world_preset:
            raise InputError(f"--images: required with preset {preset} (only procedural-world presets take --worlds)")
        if worlds is not None and not world_preset:
            raise InputError(f"--worlds: preset {preset} has no procedural world (use --images)")
        if output.exists() and not output.is_dir():
            raise OutputError(f"output folder {output} exists and is not a folder")
        sweep = (FULL_TEXT if full else QUICK_TEXT) if by_prompts else FULL if full else QUICK
        world_list = ([] if by_prompts else plan.parse_worlds(worlds or sweep["worlds"])
                      if worlds is not None or images is None else [])
        scenes = None
        if by_prompts:
            from ..loopbench.prompts import PROMPT_SCENES, load_prompt_scenes

            scenes = load_prompt_scenes(prompts) if prompts is not None else PROMPT_SCENES
        jobs = plan.plan_jobs(configs or sweep["configs"], caches, plan.resolve_images(images) if images else [],
                              plan.parse_seeds(seeds or sweep["seeds"]), scratch=output / ".trajectories",
                              worlds=world_list, prompt_scenes=scenes, prefixes=plan.parse_prefixes(prefixes))
        rank, world, env_device = plan.shard_from_env()
        index, count = plan.combine_shards(plan.parse_shard(shard), (rank, world))
        mine = plan.shard(jobs, index, count)
        log = logging.getLogger("worldtrace")
        log.info(f"loopbench: {len(mine)} of {len(jobs)} jobs (shard {index}/{count}) into {output}")
        overall, per_chunk = overall_progress(progress)
        counts = run_jobs(mine, output, preset=preset, device=env_device if device == "auto" and env_device
                          else device, dtype=dtype, metrics=metrics, chunks=chunks, checkpoint=checkpoint,
                          random_weights=random_weights, progress=per_chunk, overall=overall,
                          speed=speed_config(rope_precision, compile_mode, overlap_decode, backend), memory=memory,
                          attention=attention)
        click.echo(f"worldtrace: loopbench shard {index}/{count}: {counts.done} done, {counts.skipped} skipped, "
                   f"{counts.failed} failed", err=True)
        if counts.failed:
            raise RunError(f"{counts.failed} of {len(mine)} jobs failed (see {output / plan.FAILURES_NAME})")
        click.echo(str(output))  # stdout: the sweep folder, for scripts (worldtrace loopbench report "$dir")

    run_job(job)


@loopbench.command("report")
@click.argument("sweep_dir", type=click.Path(path_type=Path), metavar="DIR")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=None, metavar="DEST",
        note=": the report's folder", default_text="DIR")
@option("--print", "print_markdown", is_flag=True, note="report.md")
def report_cmd(sweep_dir, output, print_markdown):
    """Aggregate the complete runs of a sweep folder DIR into report.md / .csv / .json and plots.

    Tables as the paper's Tab. "loopbench_full": rows = writer, columns = tier or configuration,
    entries PAC / TempSSIM (and on loopworld the return legs' GT-PSNR and GT detail; for runs made
    with --attention-stats the recall attention on return chunks) as mean ± 95% CI
    over scenes (seeds averaged per scene first), with a paired t-test against sliding over matched
    (configuration, scene, seed) runs. Plots:
    pac_vs_chunks.png (ABA loops, PAC vs N per writer) and tiers.png (per-tier bars). Prints the
    path of report.md on stdout (--print: its Markdown).
    """

    def job():
        from ..loopbench.report import report

        paths = report(sweep_dir, output)
        click.echo(f"worldtrace: wrote {', '.join(str(p) for p in paths.values())}", err=True)
        # stdout: one line for scripts (the report's path), or the Markdown itself with --print
        click.echo(paths["report.md"].read_text(encoding="utf-8") if print_markdown else str(paths["report.md"]))

    run_job(job)
