"""generate --fsdp and --split-heads (issue 45 part 4): the DiT across torchrun's processes, its weights sharded
with FSDP2 or its heads split (tensor parallel). Proven on this CPU with the gloo backend, for MG2 tiny and
lingbot-tiny: with --fsdp two processes make the single process's frames bit for bit (sliding, field and
landmark, each once); with --split-heads, for every one of them on both backbones, its latents within 1e-5
(sums in another order), the same slots and choices."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import invoke, one_line_error

IMAGE = "assets/images/mg2_universal_0000.png"


def shas(run) -> list[str]:
    return [json.loads(line)["frames_sha256"] for line in (run / "chunks.jsonl").read_text().splitlines()]


@pytest.mark.slow
# every writer and both backbones once (FSDP2 shards the DiT's weights; the writer sees whole heads either way)
@pytest.mark.parametrize("preset, cache", [("tiny", "landmark"), ("lingbot-tiny", "field")])
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


# --split-heads (tensor parallel): each process computes its heads and holds their slice of the cache

def check_torchrun(run, outputs) -> None:
    """A torchrun's exit: 0 with every one of ``outputs`` written. (gloo's threads once aborted a process at
    Python's teardown, "terminate called without an active exception", after its work: sharded processes
    now end with os._exit once flushed, and nothing accepts that abort.)"""
    assert run.returncode == 0 and "terminate called" not in run.stderr, run.stderr[-3000:]
    assert all(Path(o).exists() for o in outputs)


def split_run(tmp_path, preset, caches, processes):
    """tests/split_heads_run.py's results: with one process in this one (the same function, no process
    start), with more under torchrun."""
    import importlib.util

    import torch

    out = tmp_path / f"{preset}-{processes}.pt"
    script = [os.path.join(os.path.dirname(__file__), "split_heads_run.py"), preset, ",".join(caches), str(out)]
    if processes == 1:
        spec = importlib.util.spec_from_file_location("split_heads_run", script[0])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        threads = torch.get_num_threads()
        try:
            module.main(preset, ",".join(caches), str(out), False)
        finally:
            torch.set_num_threads(threads)
        return torch.load(out)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), *script,
                          "--split"], capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    check_torchrun(run, [out])
    return torch.load(out)


def without_bytes(slots):
    return [[{k: v for k, v in slot.items() if k != "bytes"} for slot in chunk] for chunk in slots]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "lingbot-tiny"])
def test_split_heads_makes_the_single_process_latents(preset, tmp_path):
    """Two processes, each with half the heads (and half of every cache slot), make one process's
    latents within float rounding (the sums run in another order), and each writer (sliding, field,
    landmark: one process start for the three) keeps the same slots and makes the same choices
    (landmark's scene-entry distances, summed over both halves); the attention per slot
    (--attention-stats) is averaged over both halves' heads."""
    caches = ("sliding", "field", "landmark")
    ones, twos = split_run(tmp_path, preset, caches, 1), split_run(tmp_path, preset, caches, 2)
    assert sorted(ones) == sorted(twos) == sorted(caches)
    for cache in caches:
        one, two = ones[cache], twos[cache]
        assert (one["latents"] - two["latents"]).abs().max() < 1e-5, cache
        assert one["latents"].abs().max() > 1  # not a pair of empty runs
        assert two["heads"] * 2 == one["heads"]
        assert without_bytes(two["slots"]) == without_bytes(one["slots"]), cache
        held = [(a["bytes"], b["bytes"]) for ca, cb in zip(one["slots"], two["slots"]) for a, b in zip(ca, cb)]
        assert held and all(a == 2 * b for a, b in held)  # each process holds its heads' half of each slot
        assert two["events"] == one["events"], cache
        # the attention per slot, measured on each process's heads and averaged over the processes
        assert len(two["attention"]) == len(one["attention"]) == 3
        for a, b in zip(one["attention"], two["attention"]):
            assert len(a) == len(b) and abs(sum(b) - 1) < 1e-5
            assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5, cache


@pytest.mark.slow
def test_generate_split_heads_writes_the_run_from_process_0(tmp_path):
    out = tmp_path / "two"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m",
                          "worldtrace_cli", "generate", "--preset", "tiny", "trajectories/aba.yaml", "--image", IMAGE, "--chunks", "3",
                          "--metrics", "none", "--no-progress", "--cache", "landmark", "--split-heads", "-o", str(out)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    complete = json.loads((out / "summary.json").read_text())["status"] == "complete"
    check_torchrun(run, [out / "summary.json"])
    assert complete and run.stdout.strip().splitlines() == [str(out)]
    assert "--split-heads: this process holds" in run.stderr and "its 1 of 2 heads" in run.stderr
    assert len(shas(out)) == 3 and (out / "video.mp4").stat().st_size > 0


def test_split_heads_is_refused_where_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = ["generate", "--preset", "tiny", "trajectories/aba.yaml", "--image", IMAGE, "--split-heads"]
    assert "torchrun" in one_line_error(invoke(*base, "-o", tmp_path / "a"))
    assert "choose one" in one_line_error(invoke(*base, "--fsdp", "-o", tmp_path / "b"))
    assert "--split-heads" in one_line_error(invoke(*base, "--offload", "blocks", "-o", tmp_path / "c"))
    resumed = invoke("generate", "--resume", tmp_path / "a", "--split-heads")
    assert "--split-heads with --resume" in one_line_error(resumed)
    monkeypatch.setenv("WORLD_SIZE", "3")  # tiny's 2 heads over 3 processes: refused before anything loads
    line = one_line_error(invoke(*base, "-o", tmp_path / "d"))
    assert "heads (2) do not divide by 3" in line and not (tmp_path / "d").exists()


def test_split_heads_refuses_a_process_count_that_does_not_divide_the_heads(dit, monkeypatch):
    import torch

    from worldtrace_cli.engine import shard
    from worldtrace_cli.errors import InputError

    monkeypatch.setattr(shard, "_STATE", {"world": 3, "rank": 0, "mode": "heads"})
    with pytest.raises(InputError, match=f"heads \\({dit.cfg.num_heads}\\) do not divide by 3"):
        shard.split_heads(dit, torch.device("cpu"))  # refused before the DiT is touched
    assert all(block.self_attn.heads == dit.cfg.num_heads for block in dit.blocks)


HEAD_SUMS = '''
import sys, torch, torch.distributed as dist
from worldtrace_cli.memory.bank import keep_indices
from worldtrace_cli.memory.landmark import descriptor_distance, frame_descriptor
from worldtrace_cli.memory.slots import CacheGeometry
dist.init_process_group("gloo")
rank = dist.get_rank()
gen = torch.Generator().manual_seed(0)
k = torch.randn(3 * 6, 4, 8, generator=gen)  # a chunk of 3 frames x 6 tokens, 4 heads of 8 channels
a, b = ([(torch.randn(1, 6, 4, 8, generator=gen), None)] * 2 for _ in range(2))  # two frames, 2 layers
mine = slice(2 * rank, 2 * rank + 2)  # this process's 2 of the 4 heads
geometry = CacheGeometry(2, 2, 8, 6, head_group=dist.group.WORLD)
half = lambda frame: [(x[:, :, mine], v) for x, v in frame]
result = {"keep": keep_indices(k, 3, 6, 0.5).tolist(),
          "keep_split": keep_indices(k[:, mine], 3, 6, 0.5, geometry).tolist(),
          "distance": descriptor_distance(frame_descriptor(a, 4), frame_descriptor(b, 4)),
          "distance_split": descriptor_distance(frame_descriptor(half(a), 4, geometry),
                                                frame_descriptor(half(b), 4, geometry), geometry)}
torch.save(result, sys.argv[1] + f".{rank}")
dist.destroy_process_group()
sys.stdout.flush(); sys.stderr.flush()
import os; os._exit(0)  # as worldtrace's sharded processes end: no Python teardown beside gloo's threads
'''


def test_writers_choose_over_every_head_when_the_heads_are_split(tmp_path):
    """WorldKV's kept tokens (cosine over all heads) and landmark's descriptor distance, computed by two
    processes holding 2 of 4 heads each, are the whole-head results on both processes."""
    import torch

    script = tmp_path / "head_sums.py"
    script.write_text(HEAD_SUMS)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script),
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    check_torchrun(run, [tmp_path / f"out.{rank}" for rank in (0, 1)])
    for rank in (0, 1):
        r = torch.load(tmp_path / f"out.{rank}")
        assert r["keep_split"] == r["keep"] and len(r["keep"]) == 6 + 2 * 3
        assert abs(r["distance_split"] - r["distance"]) < 1e-6 and r["distance"] > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["--split-heads", "--fsdp"])
def test_a_run_process_0_refuses_ends_every_process(mode, tmp_path):
    """Process 0 refuses an output folder holding a finished run (one line, exit 4) while the others
    load: they must not wait in a collective of their own (the head split once scattered the weights
    from process 0, and this hung until the timeout). Process 0 starts late here (a loaded machine's
    order): process 1, refusing first, once exited at once and torchrun ended process 0 before its line
    (CI, 2026-12-02)."""
    out = tmp_path / "done"
    first = invoke("generate", "--preset", "tiny", "trajectories/aba.yaml", "--image", IMAGE, "--chunks", "1",
                   "--metrics", "none", "--no-progress", "-o", out)
    assert first.exit_code == 0, first.output
    late = tmp_path / "late_process_0.py"
    late.write_text("import os, runpy, sys, time\n"
                    "if os.environ['RANK'] == '0':\n    time.sleep(3)\n"
                    "sys.argv = ['worldtrace'] + sys.argv[1:]\n"
                    "runpy.run_module('worldtrace_cli', run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(late),
                          "generate", "--preset", "tiny", "trajectories/aba.yaml", "--image", IMAGE,
                          "--chunks", "2", "--metrics", "none", "--no-progress", mode, "-o", str(out)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode != 0
    assert "worldtrace: error: output folder" in run.stderr and "already holds a finished run" in run.stderr
