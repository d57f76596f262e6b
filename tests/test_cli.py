"""`worldtrace generate` as a user runs it (click CliRunner, tiny preset, CPU): outputs, every
writer end to end, and one-line errors with documented exit codes for bad input."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from worldtrace_cli.cli import main
from worldtrace_cli.memory.base import example_specs
from worldtrace_cli.outputs import probe_video, read_jsonl

ROOT = Path(__file__).parent.parent
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"  # a JPEG behind a .png name
ABA = ROOT / "trajectories" / "aba.yaml"


def generate(*args):
    result = CliRunner().invoke(main, ["generate", "--no-progress", *map(str, args)])
    return result


def one_line_error(result, code):
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.startswith("worldtrace: error:")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.slow
def test_acceptance_run_writes_video_records_summary(tmp_path):
    out = tmp_path / "out"
    result = generate("--preset", "tiny", "--image", IMAGE, ABA, "--chunks", 16, "-o", out)
    assert result.exit_code == 0, result.output
    assert probe_video(out / "video.mp4") == {"frames": 9 + 15 * 12, "fps": 25.0, "width": 176, "height": 96}
    records = read_jsonl(out / "chunks.jsonl")
    assert [r["chunk"] for r in records] == list(range(16))
    assert records[0]["pixel_frames"] == [0, 9] and records[15]["pixel_frames"] == [177, 189]
    assert records[0]["waypoints"] == ["A"] and records[8]["waypoints"] == ["B"]
    assert records[0]["actions"] == "forward" and records[8]["actions"] == "back"
    assert all(set(r["timings_s"]) == {"cache", "denoise", "context", "decode"} for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["pixel_frames"] == 189
    assert summary["resolved"]["device"] == "cpu" and summary["versions"]["torch"] == torch.__version__
    seconds = summary["totals"]["seconds"]  # the wall clock is accounted for, the rest named `other`
    parts = seconds["load"] + seconds["conditioning"] + seconds["generate"] + seconds["other"]
    assert seconds["other"] >= 0 and parts == pytest.approx(seconds["wall"], abs=0.01)
    assert (out / "cache_timeline.png").stat().st_size > 0


@pytest.mark.slow
def test_every_writer_runs_end_to_end(tmp_path, valid):
    """The writer matrix through the CLI in one process (one model load): `compare` with every
    registered writer (each a normal run folder); writers' behaviour is tested at the rollout level
    in their own test files."""
    from worldtrace_cli.outputs import cache_folder

    caches = example_specs()
    out = tmp_path / "cmp"
    result = CliRunner().invoke(main, ["compare", str(ABA), "--preset", "tiny", "--image", str(IMAGE), "--chunks", "2",
                                       "--metrics", "fast", "--no-hud", "--cache", ",".join(caches), "-o", str(out)])
    assert result.exit_code == 0, result.output
    for cache in caches:
        run = out / cache_folder(cache)
        records = read_jsonl(run / "chunks.jsonl")
        assert len(records) == 2 and probe_video(run / "video.mp4")["frames"] == 9 + 12, cache
        last = records[-1]["cache"]
        assert last["writer"] == cache.split(":")[0] and last["slots"], cache
        assert all(s["offset"][1] < 0 for s in last["slots"]), cache
        summary = json.loads((run / "summary.json").read_text())
        assert summary["cache"]["cache"] == cache.split(":")[0]
        valid(run / "chunks.jsonl", "chunk-record")
        valid(summary, "summary")
    compare = json.loads((out / "compare.json").read_text())
    assert [m["cache"] for m in compare["modes"]] == caches
    valid(compare, "compare")


def test_chunks_override_is_logged_and_applied(tmp_path):
    result = generate("--image", IMAGE, ABA, "--chunks", 18, "--budget", 1, "-o", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert "repeats for 2 more chunks" in result.output
    assert len(read_jsonl(tmp_path / "r" / "chunks.jsonl")) == 18


def test_missing_image(tmp_path):
    line = one_line_error(generate("--image", tmp_path / "nope.png", ABA, "-o", tmp_path / "o"), 2)
    assert "nope.png" in line


def test_unreadable_image(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    line = one_line_error(generate("--image", bad, ABA, "-o", tmp_path / "o"), 2)
    assert "bad.png" in line


def test_unknown_action_names_file_and_line(tmp_path):
    traj = tmp_path / "t.yaml"
    traj.write_text("mode: universal\nsegments:\n  - action: moonwalk\n    chunks: 2\n")
    line = one_line_error(generate("--image", IMAGE, traj, "-o", tmp_path / "o"), 2)
    assert "t.yaml:3" in line and "moonwalk" in line


def test_wrong_mode_for_preset(tmp_path):
    line = one_line_error(generate("--image", IMAGE, ROOT / "trajectories" / "gta_drive_loop.yaml", "--preset", "tiny",
                                   "-o", tmp_path / "o"), 2)
    assert "gta_drive" in line and "tiny" in line


@pytest.mark.parametrize("traj,preset", [("gta_drive_loop", "tiny-gta-drive"), ("templerun_run", "tiny-templerun")])
def test_every_mode_runs_on_its_tiny_preset_by_default(tmp_path, traj, preset, monkeypatch):
    import os

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # --threads sets them: restored after the test
        monkeypatch.setenv(var, os.environ.get(var, ""))
    threads = torch.get_num_threads()
    out = tmp_path / "o"
    result = generate("--image", IMAGE, ROOT / "trajectories" / f"{traj}.yaml", "--chunks", 2, "--cache", "landmark",
                      "--metrics", "none", "--threads", 1, "-o", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["preset"]["name"] == preset and summary["totals"]["chunks"] == 2
    assert summary["resolved"]["threads"] == 1  # --threads reached torch
    torch.set_num_threads(threads)


def test_checkpoint_preset_without_checkpoint(tmp_path):
    line = one_line_error(generate("--preset", "mg2-universal", "--image", IMAGE, ABA, "-o", tmp_path / "o"), 2)
    assert "--checkpoint" in line and "--random-weights" in line


def test_a_checkpoint_that_is_not_a_folder_is_refused_before_anything_loads(tmp_path):
    """Checked with the other inputs, before the run folder is made: exit 3, no folder left behind."""
    line = one_line_error(generate("--checkpoint", tmp_path / "nosuch", "--image", IMAGE, ABA, "-o", tmp_path / "o"), 3)
    assert f"--checkpoint {tmp_path / 'nosuch'}: not a folder" in line
    assert not (tmp_path / "o").exists()
    # only runs that read the checkpoint check it: random weights (or a random preset) never do
    from worldtrace_cli.config import RunConfig, load_preset
    from worldtrace_cli.errors import CheckpointError
    from worldtrace_cli.jobs.inputs import check_inputs

    def check(preset, random_weights):
        check_inputs(RunConfig(preset=load_preset(preset), trajectory=ABA, output=tmp_path / "o", image=IMAGE,
                               checkpoint=tmp_path / "nosuch", random_weights=random_weights))

    check("mg2-universal", True), check("tiny", False)
    with pytest.raises(CheckpointError, match="not a folder"):
        check("mg2-universal", False)


def test_checkpoint_folder_missing_files(tmp_path):
    line = one_line_error(generate("--checkpoint", tmp_path, "--image", IMAGE, ABA, "-o", tmp_path / "o"), 3)
    assert "base_distill.safetensors" in line and "Wan2.1_VAE.pth" in line


def test_checkpoint_with_wrong_keys(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "base_distilled_model").mkdir(parents=True)
    save_file({"model.not_a_weight": torch.zeros(2)}, str(ckpt / "base_distilled_model" / "base_distill.safetensors"))
    (ckpt / "Wan2.1_VAE.pth").write_bytes(b"")
    (ckpt / "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth").write_bytes(b"")
    line = one_line_error(generate("--checkpoint", ckpt, "--image", IMAGE, ABA, "-o", tmp_path / "o"), 3)
    assert "1114 missing" in line and "1 unexpected: not_a_weight" in line


def test_finished_run_is_not_overwritten(tmp_path):
    out = tmp_path / "o"
    assert generate("--image", IMAGE, ABA, "--chunks", 1, "-o", out).exit_code == 0
    line = one_line_error(generate("--image", IMAGE, ABA, "--chunks", 1, "-o", out), 4)
    assert "--overwrite" in line
    assert generate("--image", IMAGE, ABA, "--chunks", 1, "-o", out, "--overwrite").exit_code == 0


def test_bad_writer_flags(tmp_path):
    line = one_line_error(generate("--image", IMAGE, ABA, "--cache", "mixed:9", "-o", tmp_path / "o"), 2)
    assert "mixed:9" in line
    one_line_error(generate("--image", IMAGE, ABA, "--cache", "nope", "-o", tmp_path / "o"), 2)
    result = generate("--image", IMAGE, ABA, "--chunks", 0, "-o", tmp_path / "o")  # a usage error, at parse time
    assert one_line_error(result, 2).startswith("worldtrace: error: --chunks: 0 is not in the range 1<=x<=100000")


def test_help_is_instant_and_lists_commands():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and "generate" in result.output and "bench" in result.output


def test_full_cache_refuses_at_its_memory_cap_keeping_finished_chunks(tmp_path):
    # tiny preset: one latent frame of K+V over 2 layers is 0.27 MB, counted twice: refused at chunk 3
    out = tmp_path / "o"
    line = one_line_error(generate("--image", IMAGE, ABA, "--chunks", 6, "--cache", "full", "--max-cache-gb", "0.006",
                                   "-o", out), 5)
    assert "--max-cache-gb" in line
    assert len(read_jsonl(out / "chunks.jsonl")) >= 1 and probe_video(out / "video.mp4")["frames"] >= 9


def test_metrics_all_uses_the_runs_own_preset_even_a_yaml_one(tmp_path, valid):
    """`worldtrace metrics --level all` rebuilds the CLIP tower of the preset saved with the run (a
    user YAML preset included); without summary.json or a resume state it refuses instead of guessing."""
    import shutil

    preset = tmp_path / "mytiny.yaml"
    shutil.copy(ROOT / "worldtrace_cli" / "presets" / "tiny.yaml", preset)
    run = tmp_path / "run"
    result = generate(ABA, "--preset", preset, "--image", IMAGE, "--chunks", 2, "--metrics", "none", "-o", run)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["metrics", str(run), "--level", "all", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "scene_drift" in json.loads((run / "metrics.json").read_text())
    valid(run / "metrics.json", "metrics")
    (run / "summary.json").unlink()
    line = one_line_error(CliRunner().invoke(main, ["metrics", str(run), "--level", "all"]), 2)
    assert "no saved state" in line


def test_metrics_of_a_folder_that_is_not_a_run_is_an_input_error(tmp_path):
    """A folder without video.mp4 or without chunks.jsonl is bad input for `worldtrace metrics`: the same
    exit code (2) for both, one line naming the folder and the missing file, nothing written."""
    folder = tmp_path / "notarun"
    folder.mkdir()
    line = one_line_error(CliRunner().invoke(main, ["metrics", str(folder), "--level", "fast"]), 2)
    assert "no video.mp4" in line and str(folder) in line
    (folder / "video.mp4").write_bytes(b"")
    line = one_line_error(CliRunner().invoke(main, ["metrics", str(folder), "--metrics", "fast"]), 2)
    assert "no chunks.jsonl" in line and str(folder) in line  # --metrics: --level as the other commands name it
    assert sorted(p.name for p in folder.iterdir()) == ["video.mp4"]


def test_the_documented_preset_example_runs(tmp_path):
    """docs/presets.md's minimal preset is a valid preset YAML that generates."""
    import re

    text = (ROOT / "docs" / "presets.md").read_text()
    preset = tmp_path / "mine.yaml"
    preset.write_text(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    out = tmp_path / "o"
    result = generate("--image", IMAGE, ROOT / "trajectories" / "gta_drive_loop.yaml", "--preset", preset,
                      "--chunks", 1, "--metrics", "none", "-o", out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["config"]["preset"]["mode"] == "gta_drive"


def test_the_train_walkthrough_in_its_help_parses(tmp_path, monkeypatch):
    """Every `worldtrace train ...` line of `worldtrace train --help` names real options and gives
    every required one (click parses it without running it; the files it names exist in a scratch
    folder, as the steps before would have made them)."""
    import shlex

    from worldtrace_cli.cli.train import train

    result = CliRunner().invoke(main, ["train", "--help"])
    assert result.exit_code == 0
    import re

    text = re.sub(r"\\\n\s+", "", result.output)  # a continued line joined (its space stays)
    lines = [ln.split("worldtrace train ", 1)[1] for ln in text.splitlines() if "worldtrace train " in ln]
    assert [ln.split()[0] for ln in lines] == ["vae", "encode", "dit", "eval", "export"]
    monkeypatch.chdir(tmp_path)
    for line in lines:
        args = shlex.split(line.split("  ")[0])  # the command, without the description column
        for arg in args:
            if arg.endswith(".safetensors") and "/" in arg:
                Path(arg).parent.mkdir(parents=True, exist_ok=True)
                Path(arg).touch()
            elif "/" in arg:
                Path(arg).mkdir(parents=True, exist_ok=True)
        command = train.commands[args[0]]
        command.make_context(f"train {args[0]}", args[1:], resilient_parsing=False)


def test_generate_help_names_every_built_in_preset():
    from worldtrace_cli.config import preset_names

    text = next(p.help for p in main.commands["generate"].params if p.name == "preset")  # help wraps at hyphens
    assert preset_names() and all(name in text for name in preset_names()), preset_names()


def test_every_command_with_a_progress_bar_takes_both_progress_flags():
    """`--progress` and `--no-progress` work wherever either does (defaults differ: on for one run,
    off for compare's and LoopBench's many)."""
    import click

    def commands(group, prefix=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from commands(cmd, prefix + (name,))
            else:
                yield prefix + (name,), cmd

    seen = set()
    for path, cmd in commands(main):
        flags = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        if flags & {"--progress", "--no-progress"}:
            seen.add(" ".join(path))
            assert {"--progress", "--no-progress"} <= flags, path
    assert {"generate", "compare", "loopbench run", "world render", "train vae", "train encode", "train dit"} <= seen


def test_verbose_after_the_command_as_before_it():
    import logging

    logger = logging.getLogger("worldtrace")
    for args in (["-v", "presets"], ["presets", "-v"], ["presets"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
        assert logger.level == (logging.INFO if args == ["presets"] else logging.DEBUG), args


def test_no_ffmpeg_is_a_one_line_output_error_before_anything_is_touched(tmp_path, monkeypatch):
    """An imageio-ffmpeg without its binary (the lent GPU machines' case: its 80 MB binary cannot
    travel there) made `generate` die with a RuntimeError traceback at the first chunk. Now: exit
    code 4, one line saying what to install, before a model is loaded or the output folder (here an
    earlier run under --overwrite) is touched."""
    import imageio_ffmpeg

    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("an earlier run's file")

    def missing():
        raise RuntimeError("No ffmpeg exe could be found. Install ffmpeg on your system, or set the "
                           "IMAGEIO_FFMPEG_EXE environment variable.")

    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", missing)
    line = one_line_error(generate("--preset", "tiny", ABA, "--chunks", 1, "--overwrite", "-o", out), 4)
    assert "no ffmpeg executable" in line and "IMAGEIO_FFMPEG_EXE" in line
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_every_command_says_the_same_of_preset():
    """One help text for ``--preset`` (cli/options.py:preset_option) in every command that takes one;
    a command adds only a note of what it does with it."""
    import click

    from worldtrace_cli.cli import main

    def commands(group, path=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from commands(cmd, path + (name,))
            else:
                yield " ".join(path + (name,)), cmd

    helps = {name: p.help for name, cmd in commands(main) for p in cmd.params if "--preset" in p.opts}
    assert {"generate", "compare", "play", "loopbench run", "bench speed", "bench memory", "train dit",
            "train eval", "world render"} <= set(helps)
    stem = "Model preset: a built-in name ("
    assert [n for n, h in helps.items() if not h.startswith(stem) and n != "train grow"] == [], helps
