"""The hostile user's cases of the text-to-video presets, the Python API, ``bench memory``, sharded runs and
``play`` (each failed once): every one ends in one line naming the input, with its documented exit code,
before torch loads where the README promises it; the memory plan takes constant time in ``--chunks``;
the offset warning's advice, when followed, runs and removes the warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import invoke, one_line_error
from test_refusals import refuse

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "trajectories" / "prompts_aba.yaml"
ABA = ROOT / "trajectories" / "aba.yaml"
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"


def test_text_run_refusals_come_before_torch(tmp_path):
    """A prompt segment without a prompt, a pose-retrieval writer and a world seed with a text-to-video
    (or any worldless) preset: one line, exit 2, torch never imported (what keeps a refusal fast)."""
    (tmp_path / "t.yaml").write_text("mode: text\nsegments:\n  - prompt: a red lighthouse\n    chunks: 2\n"
                                     "  - chunks: 2\n")
    line = refuse(["generate", tmp_path / "t.yaml", "--preset", "self-forcing-tiny", "-o", tmp_path / "a"], 2, tmp_path)
    assert "t.yaml:5: prompt: this segment has none" in line
    for cache in ("retrieval", "worldkv"):
        line = refuse(["generate", PROMPTS, "--preset", "self-forcing-tiny", "--cache", cache, "-o", tmp_path / cache],
                      2, tmp_path)
        assert f"--cache {cache}: retrieves memory by camera pose" in line
    line = refuse(["generate", PROMPTS, "--preset", "self-forcing-tiny", "--world-seed", "3", "-o", tmp_path / "w"], 2,
                  tmp_path)
    assert "--world-seed 3" in line and "has none" in line
    # an action-conditioned preset without a world refuses it too, as wt.open does (generate and compare)
    for command in (["generate", ABA, "--image", IMAGE], ["compare", ABA, "--cache", "sliding,field", "--image", IMAGE]):
        line = refuse([*command, "--preset", "tiny", "--world-seed", "2", "-o", tmp_path / command[0]], 2, tmp_path)
        assert "--world-seed 2: picks a procedural world; preset tiny has none" in line


def test_bench_memory_refuses_a_device_size_that_is_not_a_number():
    for value in ("nan", "inf", "0", "-3"):
        line = one_line_error(invoke("bench", "memory", "--preset", "tiny", "--device-gb", value, "--json"))
        assert "--device-gb" in line, value


@pytest.mark.parametrize("cache, chunks", [("field", 100_000), ("full", 100_000)])
def test_the_memory_plan_takes_the_same_time_at_any_length(cache, chunks, monkeypatch):
    """bench memory --chunks 100000 commits no more fake chunks than a short plan (field's host store and
    full's growing cache carried on from the writer's own growth: the work is constant in --chunks, counted,
    not timed) and agrees with a plan of every chunk where both exist."""
    import torch

    import worldtrace_cli.engine.plan_chunk as plan_chunk
    from worldtrace_cli.config import load_preset, memory_config
    from worldtrace_cli.engine.memory_plan import plan_memory
    from worldtrace_cli.engine.plan_chunk import fill_limit

    preset = load_preset("tiny")
    memory = memory_config(preset=preset, cache=cache, **({"max_cache_gb": 1e12} if cache == "full" else {}))
    fills, fill = [], plan_chunk._fill
    monkeypatch.setattr(plan_chunk, "_fill", lambda rollout, writer, limit, tracker: fills.append(limit) or
                        fill(rollout, writer, limit, tracker))
    long = plan_memory(preset, memory, dtype=torch.float32, chunks=chunks, checkpoint_text=False)
    assert fills and len(fills) <= 2 and max(fills) <= fill_limit(preset), fills  # not 100,000 commits
    monkeypatch.setattr(plan_chunk, "_fill", fill)
    # the line through two fills against a plan that fills every chunk (short enough to fill)
    n = fill_limit(preset) + 9
    carried = plan_memory(preset, memory, dtype=torch.float32, chunks=n, checkpoint_text=False)
    saved = plan_chunk.fill_limit
    plan_chunk.fill_limit = lambda p: 10_000
    try:
        filled = plan_memory(preset, memory, dtype=torch.float32, chunks=n, checkpoint_text=False)
        further = plan_memory(preset, memory, dtype=torch.float32, chunks=n + 1, checkpoint_text=False)
    finally:
        plan_chunk.fill_limit = saved
    for key in ("denoise", "context", "decode"):
        assert abs(carried.phases[key] - filled.phases[key]) <= 0.005 * filled.phases[key], (key, carried, filled)
    assert carried.parts["host_store"] == filled.parts["host_store"] and carried.slots == filled.slots
    if cache == "field":  # one chunk's frames more in the host store per chunk, the device's slots fixed
        per_chunk = further.parts["host_store"] - filled.parts["host_store"]
        assert per_chunk > 0 and long.parts["host_store"] == filled.parts["host_store"] + (chunks - n) * per_chunk
        assert long.peak == filled.peak  # the device holds N_s + N_r slots at any length
    else:
        assert long.slots == 3 * (chunks - 1) and long.peak > 100 * filled.peak


@pytest.mark.parametrize("preset, cache", [("longlive-tiny", None), ("tiny", "landmark"), ("tiny", "full")])
def test_the_offset_advice_when_followed_runs_and_removes_the_warning(preset, cache, tmp_path):
    """The advice is computed for the writer and position scheme (it once told a budget-9 run to use
    --budget 9, and a full cache to take a --budget it refuses): following it runs, without the warning."""
    traj = PROMPTS if "tiny" != preset else ABA
    base = ["generate", traj, "--preset", preset, "--chunks", "8", "--metrics", "none", "--no-progress", "--threads", "1"]
    if preset == "tiny":
        base += ["--image", IMAGE]
    if cache:
        base += ["--cache", cache]
    if cache == "landmark":  # every slot filled (the paper's padding), so the slots reach past the trained offsets
        base += ["--landmark-padding", "repeat"]
    first = invoke(*base, "-o", tmp_path / "a")
    assert first.exit_code == 0, first.output
    told = [w for w in json.loads((tmp_path / "a" / "summary.json").read_text())["warnings"] if "trained to" in w]
    assert len(told) == 1, told
    advice = told[0].split("; ")[-1]
    flag = advice.split(" keeps")[0].split(" reads")[0].split()
    assert flag[0] in ("--budget", "--positions"), advice
    again = invoke(*base, *flag, "-o", tmp_path / "b")
    assert again.exit_code == 0, again.output
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert not [w for w in summary["warnings"] if "trained to" in w], summary["warnings"]


def test_session_refusals_are_one_line():
    import worldtrace_cli as wt
    from worldtrace_cli.errors import InputError

    with pytest.raises(InputError, match="prompt_switch='plain' is for Self-Forcing / LongLive presets; preset loopworld \\(Matrix-Game-2.0\\)"):
        wt.open("loopworld", prompt_switch="plain")
    with pytest.raises(InputError, match="prompt_switch must be one of"):
        wt.open("self-forcing-tiny", prompt_switch="sideways")
    with pytest.raises(InputError, match="world_seed=3 picks a procedural world; preset self-forcing-tiny has none"):
        wt.open("self-forcing-tiny", world_seed=3)
    with pytest.raises(InputError, match="record must be a folder path"):
        wt.open("tiny", image=IMAGE, record=123)
    s = wt.open("tiny", image=IMAGE, device="cpu")
    try:
        s.step("forward")
        for bad in (123, None, ["a"]):
            with pytest.raises(InputError, match="save: path must be a folder path"):
                s.save(bad)
    finally:
        s.close()
    with pytest.raises(InputError, match="load: path must be a folder path"):
        wt.load(None)
    t = wt.open("self-forcing-tiny", device="cpu")
    try:
        with pytest.raises(InputError, match="one prompt: step\\(prompt='x'\\) or step\\('forward'\\), not both"):
            t.step("forward", prompt="x")
    finally:
        t.close()


def test_a_prompt_past_512_tokens_is_recorded_in_the_summary(tmp_path):
    long = "a lighthouse " * 60
    (tmp_path / "t.yaml").write_text(f"mode: text\nsegments:\n  - prompt: {long}\n    chunks: 1\n")
    result = invoke("generate", tmp_path / "t.yaml", "--preset", "self-forcing-tiny", "--metrics", "none",
                    "--no-progress", "-o", tmp_path / "o")
    assert result.exit_code == 0, result.output
    warnings = json.loads((tmp_path / "o" / "summary.json").read_text())["warnings"]
    assert any("longer than the text encoder's 512 tokens" in w for w in warnings), warnings


# -- sharded runs: the documented way, and torchrun's --------------------------------------------------

def _run(args, timeout=300, **env):
    return subprocess.run([sys.executable, "-m", "worldtrace_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, cwd=ROOT)


SHARDED = ["generate", ABA, "--preset", "tiny", "--image", IMAGE, "--chunks", "2", "--metrics", "none",
           "--no-progress"]


@pytest.mark.parametrize("extra, code, words", [
    (["--fsdp", "--weights-dtype", "fp8"], 2, "--fsdp with --weights-dtype fp8"),
    (["--split-heads", "--fsdp"], 2, "choose one"),
    (["--split-heads", "--nproc-per-node", "3"], 2, "heads (2) do not divide by 3"),
    (["--nproc-per-node", "2"], 2, "add --fsdp or --split-heads"),
    (["--fsdp", "--image", "missing.png"], 2, "missing.png"),
    (["--split-heads", "--world-seed", "4"], 2, "--world-seed 4"),
    (["--fsdp", "-o", "README.md"], 4, "README.md"),
])
def test_a_launched_refusal_is_one_line_with_its_code(extra, code, words, tmp_path):
    """Each refusal of a sharded run is one line with its code, before torch is imported (so before any
    process starts), and nothing is written."""
    args = [*SHARDED, *extra]
    if "-o" not in extra:
        args += ["-o", tmp_path / "o"]
    if "--nproc-per-node" not in extra:
        args += ["--nproc-per-node", "2"]
    line = refuse(args, code, ROOT)
    assert words in line, line
    assert not (tmp_path / "o").exists()


def test_more_processes_than_gpus_is_refused_in_one_line():
    from worldtrace_cli.engine.shard_check import check_gpus
    from worldtrace_cli.errors import InputError

    check_gpus(8, "cpu", 0)  # gloo: any count
    check_gpus(2, "cuda", 2)
    with pytest.raises(InputError, match="--nproc-per-node 3: a sharded CUDA run takes one GPU per process and this "
                                         "machine has 2; use --nproc-per-node 2 or fewer"):
        check_gpus(3, "cuda", 2)
    with pytest.raises(InputError, match="has none"):
        check_gpus(2, "cuda", 0)


@pytest.mark.slow
def test_a_launched_run_completes_with_exit_0_and_an_occupied_folder_is_exit_4(tmp_path):
    run = _run([*SHARDED, "--split-heads", "--nproc-per-node", "2", "-o", tmp_path / "o"])
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines() == [str(tmp_path / "o")]
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["status"] == "complete"
    again = _run([*SHARDED, "--fsdp", "--nproc-per-node", "2", "-o", tmp_path / "o"])
    errors = [ln for ln in again.stderr.splitlines() if ln.startswith("worldtrace: error:")]
    assert again.returncode == 4 and len(errors) == 1 and "already holds a finished run" in errors[0], again.stderr


@pytest.mark.slow
def test_torchrun_without_a_sharding_flag_refuses_once(tmp_path):
    """Two processes without --fsdp / --split-heads used to run two identical generations racing for one
    folder (one exiting 6); now process 0 refuses in one line and nothing is written."""
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "worldtrace_cli",
                          *map(str, SHARDED), "-o", str(tmp_path / "o")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("worldtrace: error:")]
    assert len(errors) == 1 and "without --fsdp or --split-heads" in errors[0], run.stderr[-3000:]
    assert run.returncode != 0 and not (tmp_path / "o").exists()


def test_the_launcher_maps_each_outcome_to_the_documented_code(tmp_path, capsys):
    """The exit codes the launcher derives from its processes' statuses (engine/launch.py): process 0's
    own code; another process's noted line and code when process 0 was ended for it; a signal or a
    silent failure as exit 1 with one line."""
    from worldtrace_cli.engine.launch import _outcome

    assert _outcome({0: 4, 1: -15}, tmp_path, 2) == 4
    (tmp_path / "rank-1.txt").write_text("3\nerror: checkpoint x: missing\n")
    assert _outcome({0: -15, 1: 3}, tmp_path, 2) == 3
    assert "process 1 of 2: error: checkpoint x: missing" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _outcome({1: -9}, empty, 2) == 1 and "killed by signal 9" in capsys.readouterr().err
    assert _outcome({1: 1}, empty, 2) == 1 and "this is a bug" in capsys.readouterr().err
    (empty / "rank-0.txt").write_text("130\n\n")
    assert _outcome({0: -2, 1: -2}, empty, 2) == 130  # Ctrl-C: process 0 stopped and saved, then was ended
