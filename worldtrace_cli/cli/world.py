"""``worldtrace world render``: the true frames of a trajectory in the procedural world."""

from __future__ import annotations

from pathlib import Path

import click

from .common import run_job
from .options import SEED, NonEmptyPath, preset_option
from .shared_options import option


@click.group("world")
def world():
    """The procedural world: ground truth for the loopworld preset."""


@world.command("render")
@click.argument("trajectory", type=click.Path(path_type=Path))
@option("--world-seed", type=SEED, default=0, show_default=True)
@option("--chunks", type=click.IntRange(1, 100_000), default=None, default_text="the trajectory's length",
        note="; the render covers them, as `generate --chunks` does")
@preset_option("loopworld", note="the frame size and fps come from it")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), required=True, metavar="DIR",
        note=": the folder of video.mp4 and poses.json (created; existing files are replaced)")
@click.option("--no-progress/--progress", "no_progress", default=False, help="No progress bar (default: --progress, on stderr).")
def render_cmd(trajectory, world_seed, chunks, preset, output, no_progress):
    """Render the true frames of TRAJECTORY: DIR/video.mp4 (one frame per action row, as `generate`
    lays them out) and DIR/poses.json (x, y, yaw_deg, pitch_deg of every pixel frame, from the
    project's one motion model). Prints DIR on stdout."""

    def job():
        from ..config import load_preset
        from ..errors import InputError, OutputError
        from ..outputs import write_json_atomic
        from ..trajectory import load_trajectory, plan_actions
        from ..world.truth import GroundTruth

        p = load_preset(preset)
        plan = plan_actions(load_trajectory(trajectory), chunks)
        if plan.mode != "universal":
            raise InputError(f"{trajectory}: mode {plan.mode!r}: the procedural world is walked in universal mode")
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{output}: cannot create the folder ({exc.strerror or exc})") from None
        truth = GroundTruth(world_seed, plan, p.height, p.width, p.world)
        truth.write_video(output / "video.mp4", p.fps, plan.num_chunks, progress=not no_progress)
        write_json_atomic(output / "poses.json", {
            "world_seed": world_seed, "world": truth.world.style, "trajectory": str(trajectory), "chunks": plan.num_chunks,
            "height": p.height, "width": p.width, "fps": p.fps,
            "pose_fields": ["x", "y", "yaw_deg", "pitch_deg"], "units": "1 unit = 1 chunk of walking",
            "poses": [[round(v, 6) for v in row] for row in truth.poses.tolist()]}, indent=None)
        click.echo(f"worldtrace: wrote {output}/video.mp4 ({len(truth.poses)} frames of world {world_seed}) "
                   f"and poses.json", err=True)
        click.echo(str(output))  # stdout: the folder, for scripts

    run_job(job)
