"""The torch-free writer table (worldtrace_cli.writer_options) agrees with the writers themselves.

Issue 15 ("validate first, load later"): writer flags were refused by the writers' constructors, in
the torch-importing memory package, seconds after a typo. The table lets the CLI refuse them before
torch; these tests keep it equal to the registered writers and check that both give one answer.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worldtrace_cli.config import MemoryConfig, load_preset
from worldtrace_cli.errors import InputError
from worldtrace_cli.memory import WRITERS, CacheGeometry, build_writer, example_specs
from worldtrace_cli.writer_options import (SIZES, SLOT_FIELDS, WRITER_OPTIONS, check_flags, check_memory, writer_flags,
                                           writer_sizes)

# a valid value for each optional setting (spill_dir is filled in per test)
VALID = {"budget": 8, "summary_slots": 5, "recent_slots": 2, "top_k": 2, "retrieval_budget": 6, "keep_ratio": 0.5,
         "bank_device": "cpu", "sink_frames": 2, "max_cache_gb": 1.0, "landmark_threshold": 0.2}
OPTIONAL = sorted({*SLOT_FIELDS, *writer_flags()})


def valid_value(field: str, spill: str):
    """A valid value of an optional setting: :data:`VALID`'s, else a writer's own non-None default."""
    if field == "spill_dir":
        return spill
    if field in VALID:
        return VALID[field]
    flag, writers = writer_flags()[field]
    return next((v for w in writers if (v := getattr(WRITER_OPTIONS[w].options(), field)) is not None), None)


def spec(name: str) -> str:
    return next(s for s in example_specs() if s.split(":")[0] == name)


def test_every_registered_writer_has_one_row():
    assert sorted(WRITER_OPTIONS) == sorted(WRITERS)
    for name, row in WRITER_OPTIONS.items():
        assert row.sizes in SIZES and row.about, name
        settings = row.options()  # every setting has a default: a writer runs with none given
        assert dataclasses.is_dataclass(settings) and row.options.__dataclass_params__.frozen, name
        assert set(row.flags) == {f.name for f in dataclasses.fields(row.options)}, name
    assert all(valid_value(f, "/tmp/spill") is not None for f in OPTIONAL)  # so the next test covers every one


@pytest.mark.parametrize("name", sorted(WRITER_OPTIONS))
@pytest.mark.parametrize("field", OPTIONAL)
def test_the_table_and_the_writer_refuse_the_same_flags(tmp_path, name, field):
    """For every writer and optional setting: the table refuses it exactly when the writer (built and
    reset on a real geometry) does, with the same one-line message naming the flag."""
    config = MemoryConfig.of(cache=spec(name), **{field: valid_value(field, str(tmp_path / "spill"))})
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
        assert table.startswith(f"--{field.replace('_', '-')}: --cache {spec(name)} does not use it (")


def test_a_writer_reads_its_own_settings_with_its_own_defaults():
    """One flag, two writers, two defaults: --keep-ratio is worldkv's 0.5 (as released) and
    retrieval's 1 (no compression) when not given; the spec's :r and the flag both set it."""
    assert MemoryConfig.of("worldkv").settings().keep_ratio == 0.5
    assert MemoryConfig.of("retrieval").settings().keep_ratio == 1.0
    assert MemoryConfig.of("worldkv:0.25").settings().keep_ratio == 0.25
    assert MemoryConfig.of("retrieval", keep_ratio=0.3).settings().keep_ratio == 0.3
    assert build_writer(MemoryConfig.of("worldkv:0.25"), 3).keep_ratio == 0.25
    with pytest.raises(InputError, match="give the keep ratio once"):
        check_flags(MemoryConfig.of("worldkv:0.25", keep_ratio=0.5))


def test_the_recorded_form_reads_back_and_reads_older_runs():
    """summary.json records the writer's settings resolved; a record from before the writers owned
    their options (every writer's setting, for every writer) reads back as the same config."""
    for cache, given in [("worldkv:0.25", {"top_k": 3}), ("landmark", {}), ("sink", {"sink_frames": 2}),
                         ("field", {"spill_dir": "/tmp/x"})]:
        cfg = MemoryConfig.of(cache, **given)
        back = MemoryConfig.from_dict(cfg.to_dict())
        assert back == cfg and back.to_dict() == cfg.to_dict() and back.settings() == cfg.settings()
        check_flags(back)
    older = {"cache": "sliding", "positions": None, "budget": None, "summary_slots": None, "recent_slots": None,
             "landmark_threshold": 0.1, "sink_frames": 1, "max_cache_gb": 16.0, "spill_dir": None, "top_k": None,
             "retrieval_budget": None, "keep_ratio": None, "bank_device": None}
    assert MemoryConfig.from_dict(older) == MemoryConfig.of("sliding")
    assert MemoryConfig.from_dict({**older, "cache": "landmark", "landmark_threshold": 0.0047}).settings().landmark_threshold == 0.0047


# the writer's row (torch-free: what the CLI checks before torch loads) and its file (the mechanism)
ECHO_ROW = """
from dataclasses import dataclass

from worldtrace_cli.writer_options import WriterRow, add_writer, at_least, flag


@dataclass(frozen=True)
class EchoOptions:
    echo_scale: float = flag(1.0, "float", "scale the values read from the cache", at_least(0))


add_writer("echo", WriterRow("budget", "it is sliding with scaled values", EchoOptions,
                             about="sliding with its values scaled"))
"""
ECHO_WRITER = """
import echo_row  # noqa: F401  (its row)
from worldtrace_cli.memory.base import register
from worldtrace_cli.memory.sliding import SlidingWriter


@register
class EchoWriter(SlidingWriter):
    '''Sliding window whose values are read scaled by --echo-scale (a test writer).'''

    name = "echo"

    def _read_kv(self, layer):
        k, v = super()._read_kv(layer)
        return k, v * self.config.settings().echo_scale
"""


def test_a_writer_with_its_own_flag_is_its_file_and_one_row(tmp_path):
    """Issue 40: a writer with a flag of its own, added from a module of its own (no edit anywhere
    else), shows in --cache's help and as a flag in generate --help, is checked before torch loads
    (its own check, and refused for other writers), and runs the whole contract matrix."""
    (tmp_path / "echo_row.py").write_text(ECHO_ROW)
    (tmp_path / "echo_writer.py").write_text(ECHO_WRITER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    script = ("import sys, echo_row\nfrom worldtrace_cli.cli import main\ntry:\n"
              "    main(sys.argv[1:], prog_name='worldtrace')\nexcept SystemExit as exc:\n"
              "    print('exit', exc.code, 'torch' in sys.modules, file=sys.stderr)\n")

    def cli(*args):
        return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                              timeout=120)

    help_text = " ".join(cli("generate", "--help").stdout.split())
    assert "echo: sliding with its values scaled; field:" in help_text  # --cache lists it with its row's line
    assert "--echo-scale FLOAT echo: scale the values read from the cache (default 1)" in help_text
    compare_help = " ".join(cli("compare", "--help").stdout.split())
    assert "echo, field," in compare_help and "--echo-scale FLOAT" in compare_help
    traj = str(Path(__file__).resolve().parents[1] / "trajectories" / "aba.yaml")
    bad = cli("generate", traj, "--cache", "echo", "--echo-scale", "-1", "-o", str(tmp_path / "a"))
    assert "--echo-scale" in bad.stderr and "must be >= 0, got -1" in bad.stderr and "exit 2 False" in bad.stderr
    other = cli("generate", traj, "--cache", "sliding", "--echo-scale", "2", "-o", str(tmp_path / "b"))
    assert ("--echo-scale: --cache sliding does not use it (only echo reads it" in other.stderr
            and "exit 2 False" in other.stderr), other.stderr
    # the contract matrix, with the writer loaded as a pytest plugin before collection
    tests = Path(__file__).resolve().parent
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "echo_writer", "-p", "no:cacheprovider",
                           str(tests / "test_memory_contract.py"), "-k", "echo and not cuda"],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    passed = int(proc.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= 8, proc.stdout[-2000:]  # 5 position schemes, horizon, determinism, state round trip


@pytest.mark.parametrize("cache, options", [
    ("field", {}), ("field", {"budget": 9}), ("landmark", {"summary_slots": 7}), ("mixed:3", {}),
    ("sink", {"sink_frames": 2}), ("memrope", {}), ("memrope", {"budget": 10, "sink_frames": 3}),
    ("sliding", {"budget": 0}), ("retrieval", {"recent_slots": 3}),
])
@pytest.mark.parametrize("window, frames", [(6, 3), (4, 3), (18, 4)])
def test_table_sizes_are_the_writers_sizes(cache, options, window, frames):
    """writer_sizes (what the CLI checks from the preset) equals the sizes a writer resolves at reset
    for that model window, or both refuse."""
    config = MemoryConfig.of(cache=cache, **options)
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
    config = MemoryConfig.of(cache="mixed:8")
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
    ("landmark", ["--top-k", "2"], "--top-k: --cache landmark does not use it (only worldkv reads it"),
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
    def tau(*args, **kw):
        return memory_config(*args, **kw).settings().landmark_threshold

    assert tau("landmark", preset=loopworld) == 0.0047
    assert tau("mixed:2", preset=loopworld, landmark_threshold=None) == 0.0047
    assert tau("landmark", preset=loopworld, landmark_threshold=0.2) == 0.2
    assert tau("landmark", preset=tiny) == 0.1
    assert tau("landmark") == MemoryConfig.of("landmark").settings().landmark_threshold == 0.1
    assert "landmark_threshold" not in memory_config("sliding", preset=loopworld).to_dict()  # not its setting

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


def test_one_command_line_for_several_writers_gives_each_its_own_settings():
    """compare / loopbench run: a writer's own flag goes to the listed writers that read it; one that
    none of them reads is refused by name; the shared sizes go to every writer."""
    from worldtrace_cli.config import memory_configs

    loopworld = load_preset("loopworld")
    got = memory_configs(["sliding", "landmark", "worldkv"], loopworld, landmark_threshold=0.3, top_k=4, budget=None)
    assert got["sliding"].options == {} and got["landmark"].options == {"landmark_threshold": 0.3}
    assert got["worldkv"].options == {"top_k": 4} and got["landmark"].settings().landmark_threshold == 0.3
    for m in got.values():
        check_flags(m)
    assert memory_configs(["field", "landmark"], loopworld)["landmark"].settings().landmark_threshold == 0.0047
    lone = memory_configs(["sliding", "field"], loopworld, top_k=4)
    with pytest.raises(InputError, match=r"^--top-k: --cache sliding does not use it \(only worldkv reads it"):
        check_flags(lone["sliding"])
    sized = memory_configs(["field", "landmark"], loopworld, budget=5)
    assert {c: m.budget for c, m in sized.items()} == {"field": 5, "landmark": 5}
    # play's writer switch: each writer the page opens takes its own settings among the command line's
    from worldtrace_cli.writer_options import settings_for

    given = {"landmark_threshold": 0.3, "top_k": 4, "budget": 5}
    assert settings_for("sliding", given) == {"budget": 5}
    assert settings_for("mixed:2", given) == {"landmark_threshold": 0.3, "budget": 5}
    assert settings_for("nope", given) == given  # refused by name by its own check


def test_a_writer_setting_cannot_take_a_name_the_commands_use():
    """add_writer refuses a setting named like a shared memory setting or another option of the
    commands and of open() (--seed would clash with generate's), and a kind that differs from the
    same flag's in another writer; nothing is registered."""
    from worldtrace_cli.writer_options import WriterRow, add_writer, flag

    @dataclasses.dataclass(frozen=True)
    class Clash:
        seed: int = flag(1, "int", "a clash")

    @dataclasses.dataclass(frozen=True)
    class Retyped:
        top_k: float = flag(1.0, "float", "a float top-k")

    for options, message in [(Clash, "--seed is taken"), (Retyped, "--top-k is float here and int for worldkv")]:
        with pytest.raises(ValueError, match=message):
            add_writer("clash", WriterRow("budget", "x", options))
    assert "clash" not in WRITER_OPTIONS
