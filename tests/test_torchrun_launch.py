"""Plain ``torchrun`` launches of commands that do not split across processes (issue 67, 7): every
command but ``generate`` (its own --fsdp / --split-heads check) and ``loopbench run`` (a shard of the
job list per process) refuses WORLD_SIZE > 1 with one line from process 0 and exit 2, before it writes
anything; ``--help`` still answers; WORLD_SIZE=1 runs as usual."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from worldtrace_cli.cli import TORCHRUN_COMMANDS, _leaf_names, main

ROOT = Path(__file__).resolve().parents[1]
ABA = str(ROOT / "trajectories" / "aba.yaml")


def invoke(*args, env):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def test_compare_under_torchrun_is_refused_by_process_0_and_quiet_elsewhere(tmp_path):
    out = tmp_path / "c"
    first = invoke("compare", "--preset", "tiny", ABA, "--chunks", "1", "-o", out, env={"WORLD_SIZE": "2", "RANK": "0"})
    assert first.exit_code == 2
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("worldtrace: error: worldtrace compare does not split across")
    assert "generate --fsdp / --split-heads, loopbench run" in lines[0]
    other = invoke("compare", "--preset", "tiny", ABA, "--chunks", "1", "-o", out, env={"WORLD_SIZE": "2", "RANK": "1"})
    assert other.exit_code == 2 and other.stderr.strip() == ""
    assert not out.exists()  # nothing written, no folder claimed


def test_every_other_command_refuses_and_help_still_answers(tmp_path):
    names = dict(_leaf_names(main))
    assert TORCHRUN_COMMANDS <= set(names)
    refused = invoke("presets", env={"WORLD_SIZE": "4", "RANK": "0"})
    assert refused.exit_code == 2 and "worldtrace presets does not split" in refused.stderr
    report = invoke("loopbench", "report", tmp_path, env={"WORLD_SIZE": "2", "RANK": "0"})
    assert report.exit_code == 2 and "worldtrace loopbench report does not split" in report.stderr
    helped = invoke("compare", "--help", env={"WORLD_SIZE": "2", "RANK": "0"})
    assert helped.exit_code == 0 and "Usage:" in helped.output
    alone = invoke("presets", env={"WORLD_SIZE": "1", "RANK": "0"})
    assert alone.exit_code == 0 and "tiny" in alone.output


@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
                    reason="torchrun not installed")
def test_a_real_torchrun_launch_of_compare_writes_nothing(tmp_path):
    """Process 0 starts late here (a loaded machine's order): process 1, refusing first, once exited at once
    and torchrun ended process 0 before its line."""
    torchrun = str(Path(sys.executable).parent / "torchrun") if (Path(sys.executable).parent / "torchrun").exists() \
        else shutil.which("torchrun")
    out = tmp_path / "c"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    late = tmp_path / "late_process_0.py"
    late.write_text("import os, runpy, sys, time\n"
                    "if os.environ['RANK'] == '0':\n    time.sleep(3)\n"
                    "sys.argv = ['worldtrace'] + sys.argv[1:]\n"
                    "runpy.run_module('worldtrace_cli', run_name='__main__')\n")
    done = subprocess.run([torchrun, "--nproc-per-node", "2", str(late), "compare", "--preset", "tiny", ABA,
                           "--chunks", "1", "-o", str(out)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode != 0  # torchrun reports any process's non-zero exit as its own exit 1
    said = [line for line in done.stderr.splitlines() if line.startswith("worldtrace: error:")]
    assert len(said) == 1 and "worldtrace compare does not split across processes" in said[0]
    assert not out.exists()
