"""``worldtrace metrics``: score a finished or stopped run folder afterwards."""

from __future__ import annotations

from pathlib import Path

import click

from ..schemas import versioned
from .common import run_job
from .options import NonEmptyPath
from .shared_options import option


@click.command("metrics")
@click.argument("run_dir", type=click.Path(path_type=Path))
@option("--level", "--metrics", "level", type=click.Choice(["fast", "all"]), default="all", show_default=True,
        note="; --level is the same option")
@click.option("--trajectory", type=click.Path(path_type=Path), default=None,
              help="Trajectory for revisit pairing (default: the one in summary.json). Ground truth always "
                   "follows the run's own trajectory; this one stands in only when that file is gone.")
@option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
        note=" (the CLIP tower of --level all)")
@option("-o", "--output", type=NonEmptyPath(path_type=Path), default=None,
        note=": the JSON file, its path printed on stdout", default_text="RUN_DIR/metrics.json")
@option("--json", "print_json", is_flag=True, note="the metrics (instead of the file's path)")
def metrics_cmd(run_dir, level, trajectory, device, output, print_json):
    """Compute metrics afterwards from a finished or interrupted RUN_DIR (video.mp4 + chunks.jsonl).

    Writes RUN_DIR/metrics.json (or -o FILE) and prints its path on stdout (--json: the JSON itself).
    A folder a run is still writing is refused (exit 6): run it when the run has finished."""
    import json

    from ..errors import InputError

    def job():
        from ..errors import FolderBusy
        from ..runs import RunFolder

        folder = RunFolder(run_dir)
        if not folder.path.exists():
            raise InputError(f"{run_dir}: the folder does not exist")
        if not folder.path.is_dir():
            raise InputError(f"{run_dir}: not a folder (give a run folder, e.g. out/)")
        holder = folder.busy()  # a run still writing it: its records and video are not final yet
        if holder is not None:
            raise FolderBusy(f"{run_dir} is still being written by {holder}; run worldtrace metrics when it "
                             f"has finished")
        if not folder.video.is_file():
            raise InputError(f"{run_dir}: no video.mp4 (not a worldtrace run folder)")
        import torch

        from ..config import RunConfig
        from ..metrics import summarise_run
        from ..model.checkpoint import load_clip_tower
        from ..outputs import write_json_atomic
        from ..engine.pipeline import resolve_device
        from ..runs.resume import resume_config
        from ..trajectory import frames_for_chunks

        # the model's chunk layout (LingBot: 4 latent frames per chunk); a killed run without summary: MG2's
        fpc = ((folder.read_summary() or {}).get("config") or {}).get("preset", {}).get("frames_per_chunk", 3)
        checked = folder.check(lambda n: frames_for_chunks(n, fpc))  # FolderInconsistent (exit 7) for a contradiction
        tower = None
        if level == "all":  # the CLIP tower of the model that made the run (its own preset, even a YAML one)
            summary = folder.read_summary()
            if summary is not None and summary.get("config"):
                cfg = RunConfig.from_dict(summary["config"])
            else:
                cfg = resume_config(run_dir)  # an interrupted run: its saved settings (InputError if none)
            tower = load_clip_tower(cfg.preset, cfg.checkpoint, cfg.random_weights, cfg.weights_seed,
                                    resolve_device(device), torch.float32)
        with torch.no_grad():
            result = summarise_run(run_dir, tower, level, trajectory)
        result["status"] = checked["status"]
        result["notes"] = checked["notes"] + result["notes"]
        result = versioned(result)
        path = output or run_dir / "metrics.json"
        write_json_atomic(path, result, indent=1)
        click.echo(f"worldtrace: wrote {path} ({checked['status']} run, {checked['chunks']} chunks)", err=True)
        click.echo(json.dumps(result, indent=1) if print_json else str(path))  # stdout: one line for scripts

    run_job(job)
