"""The torch-free writer table (worldtrace_cli.writer_options) agrees with the writers themselves.

Issue 15 ("validate first, load later"): writer flags were refused by the writers' constructors, in
the torch-importing memory package, seconds after a typo. The table lets the CLI refuse them before
torch; these tests keep it equal to the registered writers and check that both give one answer.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from worldtrace_cli.config import MemoryConfig, load_preset
from worldtrace_cli.errors import InputError
from worldtrace_cli.memory import WRITERS, CacheGeometry, build_writer, example_specs
from worldtrace_cli.writer_options import (OPTIONAL_FLAGS, SIZES, WRITER_OPTIONS, check_flags, check_memory,
                                           writer_sizes)

# a valid value for each optional flag (spill_dir is filled in per test)
VALID = {"budget": 8, "summary_slots": 5, "recent_slots": 2, "top_k": 2, "retrieval_budget": 6, "keep_ratio": 0.5,
         "bank_device": "cpu"}


def spec(name: str) -> str:
    return next(s for s in example_specs() if s.split(":")[0] == name)


def test_every_registered_writer_has_one_row():
    assert sorted(WRITER_OPTIONS) == sorted(WRITERS)
    assert all(row.sizes in SIZES and row.reads <= set(OPTIONAL_FLAGS) for row in WRITER_OPTIONS.values())


@pytest.mark.parametrize("name", sorted(WRITER_OPTIONS))
@pytest.mark.parametrize("field", sorted(OPTIONAL_FLAGS))
def test_the_table_and_the_writer_refuse_the_same_flags(tmp_path, name, field):
    """For every writer and optional flag: the table refuses it exactly when the writer (built and
    reset on a real geometry) does, with the same one-line message naming the flag."""
    value = str(tmp_path / "spill") if field == "spill_dir" else VALID[field]
    config = MemoryConfig(cache=spec(name), **{field: value})
    reads = field in WRITER_OPTIONS[name].reads
    try:
        check_flags(config)
        table = None
    except InputError as exc:
        table = str(exc)
    try:
        build_writer(config, 3).reset(CacheGeometry(2, 2, 8, 4))
        writer = None
    except InputError as exc:
        writer = str(exc)
    assert table == writer
    assert (table is None) == reads, table
    if not reads:
        assert table.startswith(f"{OPTIONAL_FLAGS[field]}: --cache {spec(name)} does not use it (")


@pytest.mark.parametrize("cache, options", [
    ("field", {}), ("field", {"budget": 9}), ("landmark", {"summary_slots": 7}), ("mixed:3", {}),
    ("sink", {"sink_frames": 2}), ("memrope", {}), ("memrope", {"budget": 10, "sink_frames": 3}),
    ("sliding", {"budget": 0}), ("retrieval", {"recent_slots": 3}),
])
@pytest.mark.parametrize("window, frames", [(6, 3), (4, 3), (18, 4)])
def test_table_sizes_are_the_writers_sizes(cache, options, window, frames):
    """writer_sizes (what the CLI checks from the preset) equals the sizes a writer resolves at reset
    for that model window, or both refuse."""
    config = MemoryConfig(cache=cache, **options)
    try:
        sizes = writer_sizes(config, window, window - frames)
    except InputError as exc:
        sizes = str(exc)
    try:
        writer = build_writer(config, window - frames, window)
        writer.reset(CacheGeometry(2, 2, 8, 4, frames_per_chunk=frames, trained_offset=window - 1))
        got = (getattr(writer, "n_summary", 0), getattr(writer, "n_recent", writer.budget))
    except InputError as exc:
        got = str(exc)
    assert sizes == got


def test_sizes_follow_the_window_of_the_preset():
    """mixed:8 needs N_s >= 8: refused for MG2's window 6 (N_s 4), accepted for LingBot's 18 (N_s 16);
    before, the writer checked k against MG2's window whatever the model."""
    config = MemoryConfig(cache="mixed:8")
    mg2, lingbot = load_preset("loopworld"), load_preset("lingbot-tiny")
    with pytest.raises(InputError, match=r"k must be in \[0, 4\]"):
        check_memory(config, mg2.window, mg2.default_budget)
    assert check_memory(config, lingbot.window, lingbot.default_budget) == (16, 2)
    writer = build_writer(config, lingbot.default_budget, lingbot.window)
    assert (writer.n_field, writer.n_landmark) == (8, 8)


@pytest.mark.parametrize("cache, flags, message", [
    ("sliding:3", [], "--cache sliding:3: sliding takes no ':' argument"),
    ("field", ["--budget", "0"], "--budget 0: too small for 0 summary + 1 recent slots"),
    ("mixed:9", [], "--cache mixed:9: k must be in [0, 4] (the summary slots), got 9"),
    ("memrope", ["--sink-frames", "4"], "--sink-frames: --cache memrope needs --sink-frames (4) + 2 EMA"),
    ("worldkv", ["--top-k", "2", "--retrieval-budget", "6"], "--top-k, --retrieval-budget: give one"),
    ("retrieval", ["--bank-device", "gpu"], "--bank-device: must be cpu or cuda[:i], got 'gpu'"),
    ("landmark", ["--top-k", "2"], "--top-k: --cache landmark does not use it (only the pose-retrieval writers"),
    ("nope", [], "--cache: unknown writer 'nope' (choose from field, "),
])
def test_writer_errors_come_from_a_process_that_never_imports_torch(tmp_path, cache, flags, message):
    """The CLI's message for each bad writer setting, from a process that never imported torch, with
    no run folder made."""
    script = ("import sys\nfrom worldtrace_cli.cli import main\ntry:\n    main(sys.argv[1:], prog_name='worldtrace')\n"
              "except SystemExit as exc:\n    print('exit', exc.code, 'torch' in sys.modules, file=sys.stderr)\n")
    from pathlib import Path

    traj = Path(__file__).resolve().parents[1] / "trajectories" / "aba.yaml"
    proc = subprocess.run([sys.executable, "-c", script, "generate", str(traj), "--cache", cache, *flags,
                           "-o", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "exit 2 False" and lines[-2].startswith("worldtrace: error: " + message), proc.stderr
    assert not (tmp_path / "run").exists()


def test_landmark_tau_defaults_to_the_presets_calibrated_one():
    """A preset may carry the tau calibrated for its model (loopworld: 0.0047, `worldtrace bench
    tau`); an explicit --landmark-threshold wins, presets without one keep the paper's 0.1. The key
    is only a default: a run recorded before it existed is still the same run."""
    from dataclasses import replace

    from worldtrace_cli.config import LANDMARK_TAU, RunConfig, memory_config
    from worldtrace_cli.runs.resume import differences

    loopworld, tiny = load_preset("loopworld"), load_preset("tiny")
    assert loopworld.landmark_threshold == 0.0047 and tiny.landmark_threshold is None and LANDMARK_TAU == 0.1
    assert memory_config("landmark", preset=loopworld).landmark_threshold == 0.0047
    assert memory_config("mixed:2", preset=loopworld, landmark_threshold=None).landmark_threshold == 0.0047
    assert memory_config("landmark", preset=loopworld, landmark_threshold=0.2).landmark_threshold == 0.2
    assert memory_config("landmark", preset=tiny).landmark_threshold == 0.1
    assert memory_config("landmark").landmark_threshold == MemoryConfig().landmark_threshold == 0.1

    from worldtrace_cli.runs.resume import absolute

    cfg = absolute(RunConfig(preset=loopworld, trajectory="t.yaml", output="o",
                             memory=memory_config("landmark", preset=loopworld)))
    old = cfg.to_dict()
    del old["preset"]["landmark_threshold"]  # a summary written before presets had the keys
    del old["preset"]["sampler"]
    assert differences(old, cfg) == []
    assert differences(old, replace(cfg, preset=replace(loopworld, sampler="euler"))) == [
        "preset.sampler 'renoise' (now 'euler')"]
    old["memory"]["landmark_threshold"] = 0.1  # ... but a run at another tau is another run
    assert differences(old, cfg) == ["memory.landmark_threshold 0.1 (now 0.0047)"]
    sliding = absolute(replace(cfg, memory=memory_config("sliding", preset=loopworld)))
    old = sliding.to_dict()
    old["memory"]["landmark_threshold"] = 0.1  # a writer without the detector: tau changes nothing
    assert differences(old, sliding) == []
    assert differences(cfg.to_dict(), replace(cfg, preset=replace(loopworld, timestep_shift=3.0))) == [
        "preset.timestep_shift 5.0 (now 3.0)"]
