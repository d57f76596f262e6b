"""Fuzzing the inputs a hostile user controls (issue 15): trajectory files, preset files and
command-line options of generate and compare. Every generated input either passes (and would run) or ends in one line on
stderr with a documented exit code (worldtrace_cli.errors, the README's table): never a traceback.

The bulk goes through the torch-free validation that ``generate``, ``compare`` and ``loopbench run``
share (:func:`worldtrace_cli.jobs.inputs.check_inputs`, :func:`~worldtrace_cli.config.load_preset`,
:func:`~worldtrace_cli.trajectory.plan_actions`); options go through the real CLI up to the point
where the model would load, and a few inputs through a real ``worldtrace`` process. Sized for a
loaded 2-core machine (the whole file in well under a minute).
"""

from __future__ import annotations

import string
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worldtrace_cli.config import RunConfig, load_preset
from worldtrace_cli.errors import WorldtraceError

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"
DOCUMENTED = {2, 3, 4, 5, 6, 7}  # exit codes of user errors (README, "When things go wrong")
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def one_line_user_error(exc: BaseException) -> None:
    """``exc`` must be a user-facing error: a WorldtraceError with a documented code and one line."""
    assert isinstance(exc, WorldtraceError), f"{type(exc).__name__} would be a traceback: {exc}"
    assert exc.exit_code in DOCUMENTED, exc.exit_code
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, repr(text)
    assert "Traceback" not in text


# --------------------------------------------------------------------------- trajectories

MACROS = ["forward", "back", "left", "right", "camera_l", "camera_r", "camera_up", "camera_down", "idle", "jump",
          "slide", "turn_left", "turn_right", "forward+camera_l", "forward+back", "left+right", "", "forwardd"]
NUMBERS = st.one_of(st.integers(-3, 40), st.sampled_from([0, 10**6, 10**12, -(10**12)]),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=4), st.none())
SCALARS = st.one_of(NUMBERS, st.text(max_size=8), st.lists(st.integers(-2, 2), max_size=3))
SEGMENT = st.dictionaries(
    st.sampled_from(["label", "action", "keys", "mouse", "chunks", "frames", "bogus"]),
    st.one_of(st.sampled_from(MACROS), NUMBERS, st.text(max_size=6),
              st.lists(st.sampled_from(list("WSADQZC") + ["w", "x", "", "WW"]), max_size=3),
              st.lists(st.one_of(st.floats(-2, 2), st.floats(allow_nan=True), st.text(max_size=2)), max_size=3)),
    max_size=4)
DOCUMENT = st.dictionaries(
    st.sampled_from(["mode", "image", "seed", "segments", "extra"]),
    st.one_of(st.sampled_from(["universal", "gta_drive", "templerun", "Universal", ""]),
              st.lists(SEGMENT, max_size=4), SCALARS, st.sampled_from([str(IMAGE), "/no/such.png", "."])),
    max_size=5)


NEAR_VALID = st.fixed_dictionaries(  # mostly valid files, so the checks past parsing are reached too
    {"mode": st.sampled_from(["universal"] * 6 + ["gta_drive", "templerun"]),
     "segments": st.lists(st.one_of(
         st.fixed_dictionaries({"action": st.sampled_from(MACROS[:8] * 3 + MACROS), "chunks": st.integers(-1, 6)},
                               optional={"label": st.sampled_from(["A", "B", "", "A" * 300])}),
         st.fixed_dictionaries({"frames": st.integers(-1, 40)},
                               optional={"keys": st.lists(st.sampled_from(list("WSADQ")), max_size=2),
                                         "mouse": st.lists(st.floats(-1.5, 1.5), min_size=2, max_size=2)}),
         st.fixed_dictionaries({"label": st.sampled_from(["A", "B"])})), min_size=1, max_size=5)},
    optional={"seed": st.one_of(st.integers(-2, 2**64), st.floats()), "image": st.sampled_from([str(IMAGE), "x.png"])})


def _yaml_text(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True) if not isinstance(doc, str) else doc


RAW = st.one_of(
    st.text(alphabet=string.printable + "äß\u2028\x00", max_size=120),
    st.sampled_from(["mode: universal\nsegments: &a [*a]\n",  # a recursive alias
                     "a: &a [*a, *a, *a]\nb: &b [*a, *a, *a]\nc: &c [*b, *b, *b]\nd: [*c, *c, *c, *c]\n",
                     "mode: universal\nmode: universal\nsegments: []\n",  # duplicate key
                     "!!python/object/apply:os.system ['echo pwned']\n",
                     "mode: universal\nsegments:\n  - <<: {action: forward}\n    chunks: 1\n",
                     "\ufeffmode: universal\nsegments:\n  - action: forward\n    chunks: 1\n",
                     "mode: universal\nsegments:\n  - action: forward\n    chunks: 100001\n"]))


def _check_trajectory(tmp: Path, text: str | bytes, chunks, preset) -> None:
    from worldtrace_cli.jobs.inputs import check_inputs
    from worldtrace_cli.trajectory import plan_actions

    path = tmp / "t.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    cfg = RunConfig(preset=preset, trajectory=path, output=tmp / "run", chunks=chunks, image=None)
    try:
        traj = check_inputs(cfg)
        plan = plan_actions(traj, chunks)  # what runs next: the action rows of every chunk
        assert plan.num_chunks >= 1 and plan.keyboard.shape[0] >= 9
    except Exception as exc:  # noqa: BLE001  (every failure must be a user error)
        one_line_user_error(exc)


@settings(FUZZ, max_examples=150)
@given(doc=st.one_of(NEAR_VALID, DOCUMENT, RAW, st.binary(max_size=64)),
       chunks=st.one_of(st.none(), st.integers(1, 40)),
       preset=st.sampled_from(["tiny", "loopworld"]))
def test_any_trajectory_file_passes_or_is_a_one_line_error(doc, chunks, preset):
    with tempfile.TemporaryDirectory() as tmp:
        _check_trajectory(Path(tmp), doc if isinstance(doc, bytes) else _yaml_text(doc), chunks, load_preset(preset))


# --------------------------------------------------------------------------- presets

PRESET = st.dictionaries(
    st.sampled_from(["description", "mode", "height", "width", "fps", "denoising_steps", "timestep_shift", "weights",
                     "vae", "clip", "files", "dit", "frames_per_chunk", "bundle", "world", "unknown"]),
    st.one_of(NUMBERS, st.sampled_from(["universal", "random", "checkpoint", "bundled", "procedural", "x"]),
              st.lists(st.integers(-5, 1000), max_size=4), st.dictionaries(st.sampled_from(
                  ["dim", "num_layers", "num_heads", "patch_size", "in_dim", "dit", "vae", "clip", "nope"]),
                  NUMBERS, max_size=3)),
    max_size=8)


@FUZZ
@given(doc=st.one_of(PRESET, RAW), base=st.sampled_from([None, "tiny"]))
def test_any_preset_file_loads_or_is_a_one_line_error(doc, base):
    """A preset YAML (merged over a valid one, or alone) either loads and validates a trajectory, or
    is a one-line error naming the file."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if base is not None and isinstance(doc, dict):
            doc = {**yaml.safe_load((ROOT / "worldtrace_cli" / "presets" / f"{base}.yaml").read_text()), **doc}
        path = tmp / "p.yaml"
        path.write_text(_yaml_text(doc), encoding="utf-8")
        try:
            preset = load_preset(str(path))
        except Exception as exc:  # noqa: BLE001
            one_line_user_error(exc)
            return
        _check_trajectory(tmp, (ROOT / "trajectories" / "aba.yaml").read_text().replace(
            "../assets", str(ROOT / "assets")), 2, preset)


@pytest.mark.parametrize("change, message", [
    ("\x0c", "invalid YAML: unacceptable character"),  # found by the fuzzer: a two-line message
    ({"denoising_steps": 5}, "denoising_steps: must be a non-empty list"),  # was a TypeError traceback
    ({"weights": "bundled", "bundle": 5}, "bundle: must be a string"),  # was a TypeError traceback
    ({"fps": "abc"}, "fps: must be a finite number > 0"),  # was accepted, then failed in the run
    ({"landmark_threshold": 3}, "landmark_threshold: must be a cosine distance in (0, 2], got 3"),
    ({"sampler": "ddim"}, "sampler: must be one of renoise, euler, got 'ddim'"),
    ({"context_noise": 1000}, "context_noise: must be an integer timestep in [0, 1000), got 1000"),
    ({"context_noise": 0.2}, "context_noise: must be an integer timestep in [0, 1000), got 0.2"),
    ({"dit": {**yaml.safe_load((ROOT / "worldtrace_cli" / "presets" / "tiny.yaml").read_text())["dit"],
              "num_layers": "4"}}, "dit: num_layers: must be an integer >= 1, got '4'"),
])
def test_preset_values_are_checked_when_loaded(tmp_path, change, message):
    base = yaml.safe_load((ROOT / "worldtrace_cli" / "presets" / "tiny.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(change if isinstance(change, str) else yaml.safe_dump({**base, **change}))
    with pytest.raises(WorldtraceError) as err:
        load_preset(str(path))
    one_line_user_error(err.value)
    assert str(err.value).startswith(str(path)) and message in str(err.value), str(err.value)


def test_a_lingbot_preset_refuses_the_euler_sampler(tmp_path):
    base = yaml.safe_load((ROOT / "worldtrace_cli" / "presets" / "lingbot-tiny.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**base, "sampler": "euler"}))
    with pytest.raises(WorldtraceError) as err:
        load_preset(str(path))
    one_line_user_error(err.value)
    assert str(err.value).startswith(f"{path}: sampler: LingBot-World presets use the model's own sampler; only Matrix-Game-2.0 presets "), str(err.value)
    path.write_text(yaml.safe_dump({**base, "context_noise": 100}))
    with pytest.raises(WorldtraceError) as err:
        load_preset(str(path))
    assert str(err.value) == f"{path}: context_noise: LingBot-World presets take no context noise (its context pass is clean)"


def test_a_preset_extends_a_built_in_one(tmp_path):
    """``extends: NAME`` takes the built-in preset's keys, replaces the ones given, keeps the base's
    bundle (the packaged file, not one beside the extending YAML); bad bases are one-line errors."""
    from worldtrace_cli.model.checkpoint import bundle_path

    path = tmp_path / "mine.yaml"
    path.write_text("extends: loopworld\nlandmark_threshold: 0.01\ndenoising_steps: [1000, 500]\n")
    mine, base = load_preset(str(path)), load_preset("loopworld")
    assert mine.name == "mine" and mine.dit == base.dit and mine.world == "procedural"
    assert (mine.landmark_threshold, mine.denoising_steps, mine.sampler) == (0.01, (1000, 500), "renoise")
    assert bundle_path(mine) == bundle_path(base) and bundle_path(mine).is_file()
    shipped = load_preset("loopworld-euler")
    assert shipped.sampler == "euler" and len(shipped.denoising_steps) == 10 and shipped.dit == base.dit
    for text, message in (("extends: nothing\n", "extends: must name a built-in preset"),
                          ("extends: [loopworld]\n", "extends: must name a built-in preset"),
                          ("extends: loopworld-euler\n", "extends another preset itself"),
                          ("extends: loopworld\nsampler: ode\n", "sampler: must be one of renoise, euler")):
        path.write_text(text)
        with pytest.raises(WorldtraceError) as err:
            load_preset(str(path))
        one_line_user_error(err.value)
        assert str(err.value).startswith(f"{path}: ") and message in str(err.value), str(err.value)


# --------------------------------------------------------------------------- CLI options

class ModelWouldLoad(Exception):
    """Raised in place of loading the model: the options passed every check."""


OPTION = st.one_of(
    st.tuples(st.just("--chunks"), st.sampled_from(["1", "2", "0", "-1", "100000", "100001", "99999999999999", "x"])),
    st.tuples(st.just("--seed"), st.sampled_from(["0", "7", "-1", str(2**63), "1e3"])),
    st.tuples(st.just("--world-seed"), st.sampled_from(["0", "3", "-2"])),
    st.tuples(st.just("--cache"), st.sampled_from(["sliding", "field", "landmark", "mixed:2", "mixed:9", "mixed:x",
                                                   "sink", "full", "memrope", "naive", "yarn", "nope", ""])),
    st.tuples(st.just("--positions"), st.sampled_from(["actual", "slot_rank", "rank", "bogus"])),
    st.tuples(st.sampled_from(["--budget", "--summary-slots", "--recent-slots", "--sink-frames"]),
              st.sampled_from(["0", "1", "2", "6", "-1", "x"])),
    st.tuples(st.just("--landmark-threshold"), st.sampled_from(["0.1", "2", "0", "-5", "nan", "inf", "3"])),
    st.tuples(st.just("--max-cache-gb"), st.sampled_from(["16", "1e-9", "0", "-1", "nan", "inf"])),
    st.tuples(st.just("--metrics"), st.sampled_from(["none", "fast", "all", "some"])),
    st.tuples(st.just("--save-every"), st.sampled_from(["0", "4", "-3"])),
    st.tuples(st.just("--preset"), st.sampled_from(["tiny", "loopworld", "mg2-universal", "nope", str(IMAGE)])),
    st.tuples(st.just("--image"), st.sampled_from([str(IMAGE), "/no/such.png", str(ROOT), str(ROOT / "README.md")])),
    st.tuples(st.sampled_from(["--device", "--dtype"]), st.sampled_from(["cpu", "fp32", "auto", "tpu"])),
    st.tuples(st.just("--rope-precision"), st.sampled_from(["float32", "float16"])),
)


@pytest.mark.parametrize("command", ["generate", "compare"])
@settings(FUZZ, max_examples=40)
@given(options=st.lists(OPTION, max_size=5), traj=st.sampled_from(["aba.yaml", "templerun_run.yaml", "missing.yaml"]))
def test_any_options_pass_or_are_a_one_line_error(monkeypatch, command, options, traj):
    """The real ``generate`` and ``compare`` commands (click parsing, the job's checks) up to the
    model load (an option one command lacks is a usage error, exit 2, like any other)."""
    from worldtrace_cli.cli import main
    from worldtrace_cli.engine.pipeline import Pipeline

    def would_load(*args, **kwargs):
        raise ModelWouldLoad

    monkeypatch.setattr(Pipeline, "from_config", would_load)
    with tempfile.TemporaryDirectory() as tmp:
        args = [command, str(ROOT / "trajectories" / traj), "-o", str(Path(tmp) / "run")]
        result = CliRunner().invoke(main, args + [x for pair in options for x in pair])
    if isinstance(result.exception, ModelWouldLoad):
        return  # every input was accepted
    assert isinstance(result.exception, SystemExit), result.exc_info  # anything else is a traceback
    assert result.exit_code in DOCUMENTED, (result.exit_code, result.output)
    errors = [ln for ln in result.output.splitlines() if ln.startswith(("worldtrace: error:", "Error:"))]
    assert len(errors) == 1, result.output


# --------------------------------------------------------------------------- real processes

HOSTILE = {
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00garbage",
    "alias_bomb": b"a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                  b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                  b"e: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
    "python_tag": b"mode: !!python/object/apply:os.system ['echo pwned']\nsegments: []\n",
    "nul": b"mode: universal\x00\nsegments: []\n",
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_trajectory_files_through_the_real_cli(tmp_path, case):
    """A worldtrace process on a hostile file: one stderr line, exit 2, nothing executed or written."""
    traj = tmp_path / "t.yaml"
    traj.write_bytes(HOSTILE[case])
    proc = subprocess.run([sys.executable, "-m", "worldtrace_cli", "generate", str(traj), "--preset", "tiny",
                           "--image", str(IMAGE), "-o", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("worldtrace: error: ") and str(traj) in lines[0], proc.stderr
    assert "pwned" not in proc.stdout + proc.stderr and not (tmp_path / "run").exists()
