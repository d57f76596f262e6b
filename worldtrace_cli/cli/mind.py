"""``worldtrace mind``: MIND's memory benchmark both ways: continue MIND clips with a writer and write the
submission layout plus MIND's per-video result file; score any submission; read a result file; render
a clip in MIND's format from loopworld (:mod:`worldtrace_cli.continuation.mind`, docs/continue.md)."""

from __future__ import annotations

from pathlib import Path

import click

from .common import run_job
from .options import NonEmptyPath, device_options, memory_options, name_list, preset_option
from .shared_options import option

EVAL = click.Choice(["mind", "preset"])


def _eval_size(choice: str, preset) -> tuple[int, int]:
    from ..continuation.mind import EVAL_SIZE

    return EVAL_SIZE if choice == "mind" else (preset.height, preset.width)


@click.group("mind")
def mind() -> None:
    """MIND (CSU-JPG/MIND): continue its clips, write its submission and result files, read them.

    A MIND clip is a folder with video.mp4 and action.json (mark_time: the frame the prediction
    starts at; per-frame ws / ad / ud / lr flags). `mind run` commits the clip's real frames before
    mark_time to the cache (--prefix), generates the rest with each writer along the clip's actions,
    writes SUBMISSION/<model>/<1st_data|3rd_data>/<mem_test|action_space_test>/<clip>/video.mp4 (the
    predicted frames only) and scores them as MIND's evaluator does (its lcm group: MSE, PSNR, SSIM at
    1280x720; LPIPS and the model-based groups are named as not computed). docs/continue.md.
    """


@mind.command("run")
@click.argument("clips", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="CLIP...")
@preset_option(default="loopworld", note="a universal-mode preset: MG2 universal, loopworld, tiny, LingBot-World")
@option("--cache", "caches", default="sliding,field,landmark", show_default=True, metavar="W1,W2,...",
        callback=name_list, note="s, comma-separated, each continuing every clip (one submission model each)")
@click.option("--model", default="worldtrace", show_default=True,
              help="The submission's model name: <model>-<writer> per writer.")
@option("--image", type=click.Path(path_type=Path), default=None, default_text="the clip's first frame")
@option("--seed", type=int, default=0, show_default=True, note="the noise")
@click.option("--camera", type=click.Choice(["actions", "actor", "camera"]), default="actions", show_default=True,
              help="LingBot-World presets: drive the camera by the clip's action flags, or by its actor_* / "
                   "camera_* poses written as --poses (Unreal axes and centimetres assumed: MIND documents neither).")
@option("--eval-size", type=EVAL, default="mind", show_default=True, note="; preset = the preset's own size")
@option("--random-weights", is_flag=True)
@option("--checkpoint", type=click.Path(path_type=Path), default=None)
@device_options
@memory_options
@option("--overwrite", is_flag=True, note=" (runs and submission videos)")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), required=True, metavar="OUT",
        note=": OUT/runs/... (run folders), OUT/submission/<model>/..., OUT/result_<model>.json, OUT/mind.md")
def run_cmd(clips, preset, caches, model, image, seed, camera, eval_size, random_weights, checkpoint, device, dtype,
            overwrite, output, **memory):
    """Continue MIND clips (CLIP: a clip folder) with each writer; write the submission and results.

    \b
    Example (the embedded world, a clip made by `worldtrace mind clip`):
      worldtrace mind clip --world-seed 8 trajectories/look_back.yaml --mark-chunks 4 \\
          -o mind-data/1st_data/test/mem_test/loop-8
      worldtrace mind run mind-data/1st_data/test/mem_test/loop-8 --cache sliding,landmark -o mind-out/
    """
    def job():
        from ..jobs.mind import run_mind

        result = run_mind(list(clips), caches, output, preset=preset, model=model, image=image, seed=seed,
                          camera=camera, eval_size=eval_size, random_weights=random_weights,
                          checkpoint=checkpoint, device=device, dtype=dtype, overwrite=overwrite, memory=memory)
        click.echo(f"worldtrace: wrote {output / 'submission'}, {', '.join(p.name for p in result['results'])}, "
                   f"mind.md", err=True)
        click.echo(str(output / "mind.md"))

    run_job(job)


@mind.command("score")
@click.argument("submission", type=click.Path(path_type=Path), metavar="MODEL_DIR")
@option("--data", "data_root", type=click.Path(path_type=Path), required=True, metavar="MIND_DATA",
        note=": MIND's root, MIND_DATA/<1st_data|3rd_data>/test/<mem_test|action_space_test>/<clip>/")
@option("--eval-size", type=click.Choice(["mind", "native"]), default="mind", show_default=True,
        note="; native = the submitted videos' own size")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=None, metavar="FILE", note=": the result file",
        default_text="result_<model>.json beside MODEL_DIR")
def score_cmd(submission, data_root, eval_size, output):
    """Score a submission (MODEL_DIR/<perspective>/<test>/<clip>/video.mp4, any tool's) against MIND's
    data as MIND's evaluator does (the lcm group), into MIND's result file. Prints its path."""
    def job():
        from ..jobs.mind import score_submission

        path = score_submission(submission, data_root, output, None if eval_size == "mind" else "native")
        click.echo(str(path))

    run_job(job)


@mind.command("show")
@click.argument("result", type=click.Path(path_type=Path), metavar="RESULT_JSON")
def show_cmd(result):
    """Print a MIND result file (this tool's or MIND's own evaluator's) as a table: one row per video,
    the lcm averages (PSNR dB, SSIM, MSE, LPIPS where computed)."""
    def job():
        from ..continuation.mind import read_result, result_table

        rows = result_table(read_result(result))
        f = lambda v, s=".3f": "—" if v is None else format(v, s)  # noqa: E731
        click.echo("| video | perspective | test | frames | PSNR | SSIM | MSE | LPIPS | error |")
        click.echo("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            click.echo(f"| {r['path']} | {r['perspective']} | {r['test_type']} | {r['frames'] or '—'} | "
                       f"{f(r['psnr'], '.2f')} | {f(r['ssim'])} | {f(r['mse'], '.4f')} | {f(r['lpips'])} | "
                       f"{r['error'] or ''} |")

    run_job(job)


@mind.command("clip")
@click.argument("trajectory", type=click.Path(path_type=Path))
@option("--world-seed", type=int, default=0, show_default=True, note="; the clip is its render")
@click.option("--mark-chunks", type=click.IntRange(1), required=True, metavar="K",
              help="mark_time at the end of the first K chunks (4F-3 + 4F(K-1) frames: 9, 21, 33, 45 ...).")
@option("--chunks", type=click.IntRange(1), default=None, default_text="the trajectory's length")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), required=True, metavar="CLIP_DIR",
        note=": the clip folder (video.mp4 + action.json)")
def clip_cmd(trajectory, world_seed, mark_chunks, chunks, output):
    """Render a clip in MIND's format from loopworld's true render along TRAJECTORY (universal mode; its
    actions become MIND's flags and poses), for tests and demos with a known truth."""
    def job():
        from ..continuation.mind import write_loopworld_clip

        clip = write_loopworld_clip(output, world_seed, trajectory, mark_chunks, chunks)
        click.echo(f"worldtrace: wrote {output}: {clip.total_time} frames, mark_time {clip.mark_time}", err=True)
        click.echo(str(output))

    run_job(job)
