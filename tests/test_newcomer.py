"""What a newcomer met on a fresh clone: the names the README's examples write are ignored by git, a
missing trajectory points at trajectories/, generate's --help example does not write into the README's
out/, and compare shows its progress and prints its folder as generate does when stderr is a file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
@pytest.mark.parametrize("path", ["saved/here/state.json", "play-runs/x/video.mp4", "runs/a/video.mp4", "out/video.mp4",
                                  "mind-out/mind.md"])
def test_what_the_readme_examples_write_is_ignored_by_git(path):
    res = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path])
    assert res.returncode == 0, f"{path} is not ignored"


def test_a_missing_trajectory_points_at_the_shipped_ones(tmp_path):
    from worldtrace_cli.errors import TrajectoryError
    from worldtrace_cli.trajectory import load_trajectory

    with pytest.raises(TrajectoryError, match=r"aba.yaml: cannot read trajectory file: .*did you mean .*trajectories/aba.yaml\?"):
        load_trajectory(tmp_path / "aba.yaml")
    with pytest.raises(TrajectoryError, match=r"example trajectories are in .*trajectories/"):
        load_trajectory(tmp_path / "mine.yaml")


def test_the_help_example_does_not_write_into_the_readmes_out_folder():
    from worldtrace_cli.cli import main

    text = CliRunner().invoke(main, ["generate", "--help"]).output
    assert "-o out/" not in text and "-o out-tiny/" in text


def test_compare_shows_progress_and_an_absolute_folder_when_stderr_is_a_file(tmp_path):
    out = tmp_path / "cmp"
    proc = subprocess.run([sys.executable, "-m", "worldtrace_cli", "compare", str(ROOT / "trajectories" / "aba.yaml"),
                           "--preset", "tiny", "--image", str(ROOT / "assets" / "images" / "mg2_universal_0000.png"),
                           "--cache", "sliding", "--chunks", "1", "--metrics", "fast", "-o", "cmp"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compare: 100%" in proc.stderr  # the overall bar, as generate's bar shows in a log file
    assert proc.stdout.strip() == str((out / "compare.md").resolve())
