"""Issue 37: a newcomer's first minute. The start-up stages say what they do and how long they took,
each command prints one scriptable line on stdout (what it wrote) with the long output in files, and
`loopbench run` starts with a quick sweep (--full: the paper's)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from click.testing import CliRunner

from worldtrace_cli.cli import main

ROOT = Path(__file__).parent.parent
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"
ABA = ROOT / "trajectories" / "aba.yaml"


def test_start_up_stages_are_logged_with_their_seconds(tmp_path):
    result = CliRunner().invoke(main, ["generate", "--preset", "tiny", "--image", str(IMAGE), str(ABA), "--chunks", "1",
                                       "-o", str(tmp_path / "run"), "--no-progress"])
    assert result.exit_code == 0, result.output
    for stage in (r"reading the inputs \(importing torch, reading the start image\)", r"loading tiny",
                  r"conditioning on .*mg2_universal_0000\.png"):
        assert re.search(rf"^worldtrace: {stage} \.\.\.$", result.output, re.M), result.output  # at once
        assert re.search(rf"^worldtrace: {stage} \.\.\. \d+\.\d s$", result.output, re.M), result.output  # when done


def test_world_render_prints_its_folder(tmp_path):
    out = tmp_path / "truth"
    result = CliRunner().invoke(main, ["world", "render", str(ABA), "--chunks", "1", "-o", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out) and (out / "video.mp4").is_file()


def _planned(monkeypatch, tmp_path, *args) -> int:
    import worldtrace_cli.jobs.loopbench as jobs

    seen = {}

    def run_jobs(mine, output, **kwargs):
        seen["jobs"] = mine
        return SimpleNamespace(done=len(mine), skipped=0, failed=0)

    monkeypatch.setattr(jobs, "run_jobs", run_jobs)
    result = CliRunner().invoke(main, ["loopbench", "run", *args, "-o", str(tmp_path / "lb")])
    assert result.exit_code == 0, result.output
    return len(seen["jobs"])


def test_loopbench_run_defaults_to_a_quick_sweep(monkeypatch, tmp_path):
    assert _planned(monkeypatch, tmp_path) == 3 * 3 * 2 * 1  # aba, abca, pan_90 x 3 writers x worlds 0-1 x seed 0
    assert _planned(monkeypatch, tmp_path, "--full") == 12 * 3 * 8 * 5  # the paper's sweep
    assert _planned(monkeypatch, tmp_path, "--full", "--seeds", "0") == 12 * 3 * 8  # options still override


def test_repeated_warnings_are_said_once_with_what_to_do_and_recorded(tmp_path):
    """Every field or landmark run on MG2's window read offsets past the trained 5 and every aba.yaml
    run on loopworld replaced the trajectory's image: a compare of two writers said both twice. Now
    once per command, with what to do, and recorded in each run's summary.json."""
    import json

    out = tmp_path / "cmp"
    result = CliRunner().invoke(main, ["compare", str(ABA), "--cache", "field,landmark", "--chunks", "3", "--metrics",
                                       "fast", "-o", str(out)])
    assert result.exit_code == 0, result.output
    for cache in ("field", "landmark"):
        warnings = json.loads((out / cache / "summary.json").read_text())["warnings"]
        assert len(warnings) == 2, warnings
        assert "start image is world 0's view" in warnings[0] and "pass --image" in warnings[0]
        assert "trained to 5" in warnings[1] and "--budget 3 keeps every offset" in warnings[1]
    assert result.output.count("trained to 5") == 1 and result.output.count("start image is world 0") == 1
    again = CliRunner().invoke(main, ["compare", str(ABA), "--cache", "field,landmark", "--chunks", "3", "--metrics",
                                      "fast", "-o", str(out), "--overwrite"])
    assert again.output.count("trained to 5") == 1  # a new command says it again


def test_compare_shows_one_overall_bar_on_a_terminal_and_prints_one_line(tmp_path):
    """compare ran for minutes without any progress unless --progress; on a terminal it now shows one
    overall bar (runs done) by default, and stdout is the path of compare.md, not the whole table."""
    import os
    import pty
    import subprocess
    import sys

    import fcntl
    import struct
    import termios

    out = tmp_path / "cmp"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "compare", str(ABA), "--preset", "tiny", "--image",
                             str(IMAGE), "--cache", "sliding,field", "--chunks", "1", "--metrics", "fast", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    stdout = proc.stdout.read()
    assert proc.wait(timeout=300) == 0, err.decode(errors="replace")
    os.close(master)
    text = err.decode(errors="replace")
    assert "compare: 100%" in text and "2/2" in text, text
    assert "chunk/s" not in text  # no per-chunk bars by default
    assert text.count("truncated to 1 chunks") == 1  # the trajectory's note, said once for both runs
    assert stdout.strip() == str(out / "compare.md")


def test_loopbench_run_prints_its_sweep_folder(monkeypatch, tmp_path):
    import worldtrace_cli.jobs.loopbench as jobs

    monkeypatch.setattr(jobs, "run_jobs", lambda mine, output, **kwargs: SimpleNamespace(done=len(mine), skipped=0,
                                                                                            failed=0))
    result = CliRunner().invoke(main, ["loopbench", "run", "-o", str(tmp_path / "lb")])
    assert result.exit_code == 0 and result.stdout.strip() == str(tmp_path / "lb"), result.output
