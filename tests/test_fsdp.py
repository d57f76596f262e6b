"""generate --fsdp (issue 45 part 4): the DiT's weights sharded with FSDP2 across torchrun's processes.
Proven on this CPU with the gloo backend: two processes make the single process's frames, bit for bit,
for MG2 tiny and lingbot-tiny with sliding, field and landmark."""

import json
import os
import subprocess
import sys

import pytest

from conftest import invoke, one_line_error

IMAGE = "assets/images/mg2_universal_0000.png"


def shas(run) -> list[str]:
    return [json.loads(line)["frames_sha256"] for line in (run / "chunks.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "lingbot-tiny"])
@pytest.mark.parametrize("cache", ["sliding", "field", "landmark"])
def test_two_processes_make_the_single_process_frames(preset, cache, tmp_path, one_thread):
    args = ["generate", "--preset", preset, "trajectories/aba.yaml", "--image", IMAGE, "--chunks", "3",
            "--metrics", "none", "--no-progress", "--cache", cache]
    single = invoke(*args, "-o", tmp_path / "one")
    assert single.exit_code == 0, single.output
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "worldtrace_cli",
                          *args, "--fsdp", "-o", str(tmp_path / "two")], capture_output=True, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines() == [str(tmp_path / "two")]  # process 0 reports; process 1 is silent
    assert "this process holds" in run.stderr
    assert shas(tmp_path / "two") == shas(tmp_path / "one")


def test_fsdp_is_refused_outside_torchrun_and_with_what_it_does_not_do(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = ["generate", "--preset", "tiny", "trajectories/aba.yaml", "--image", IMAGE, "--fsdp"]
    assert "torchrun" in one_line_error(invoke(*base, "-o", tmp_path / "a"))
    assert "--compile" in one_line_error(invoke(*base, "--compile", "default", "-o", tmp_path / "b"))
    assert "--resume" in one_line_error(invoke("generate", "--resume", tmp_path / "a", "--fsdp"))


@pytest.mark.slow
def test_ctrl_c_stops_both_processes_after_a_saved_chunk(tmp_path):
    """torchrun sends SIGINT to every process: process 0 stops after its chunk with its resume state and
    the one-line message; the other keeps following until told (it does not die mid-collective, which
    once turned process 0's clean stop into a gloo traceback)."""
    import signal
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                             "worldtrace_cli", "generate", "--preset", "lingbot-tiny", "trajectories/aba.yaml",
                             "--image", IMAGE, "--chunks", "40", "--metrics", "none", "--no-progress", "--fsdp",
                             "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    records = out / "chunks.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (records.exists() and records.read_text().count("\n") >= 2):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches every process of the group
    _, err = proc.communicate(timeout=240)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped", err[-3000:]
    assert "worldtrace: stopped: interrupted after chunk" in err
    assert "Connection closed by peer" not in err and "[rank0]: Traceback" not in err, err[-3000:]
    assert (out / "resume").exists() and summary["totals"]["chunks"] == records.read_text().count("\n")
