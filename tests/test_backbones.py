"""The backbone registry (worldtrace_cli/config/backbones.py): every face of the product asks a preset's
row what it takes, a backbone registered from outside (tests/echo_backbone: no start image, no camera)
runs through generate, a session and compare without an edit elsewhere, an installed package's entry point
registers one for the CLI, and LingBot-World runs live (sessions and ``play``) with the frames generate
makes from the session's trajectory."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import invoke, one_line_error, skip_without_ffmpeg

import worldtrace_cli as wt
from worldtrace_cli.config import BACKBONES, load_preset, memory_config, preset_names, register_backbone
from worldtrace_cli.config.backbones import titles_where
from worldtrace_cli.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"
ABA = ROOT / "trajectories" / "aba.yaml"
PROMPTS = ROOT / "trajectories" / "prompts_aba.yaml"


@pytest.fixture()
def echo():
    """The Echo test backbones (live, and declared not live) registered for one test (and removed after:
    other tests see the built-in rows)."""
    import echo_backbone

    register_backbone(echo_backbone.ROW)
    register_backbone(echo_backbone.STILL)
    try:
        yield echo_backbone
    finally:
        BACKBONES.pop("echo", None)
        BACKBONES.pop("echo-still", None)


BUILT_IN = sorted(BACKBONES)  # every row registered at import (the built-ins and installed plugins)


def _tiny_preset(architecture: str) -> str:
    """The first built-in preset of ``architecture`` whose name says tiny (what the face tests run)."""
    return next(n for n in preset_names() if "tiny" in n and load_preset(n).architecture == architecture)


def _presets(echo_module):
    """One tiny preset per registered row (every built-in row's, read from the registry, and Echo's), with a
    trajectory of its row's kind (prompt segments for a backbone that takes prompts, else actions)."""
    rows = {a: (_tiny_preset(a), PROMPTS if BACKBONES[a].takes_prompts else ABA) for a in BUILT_IN}
    return {**rows, "echo": (str(echo_module.PRESET), ABA), "echo-still": (str(echo_module.STILL_PRESET), ABA)}


def test_every_registered_row_has_a_tiny_preset_the_face_tests_run():
    """The face tests below are parametrized over the registry: a new row needs only a tiny preset."""
    assert {"mg2", "lingbot", "selfforcing"} <= set(BUILT_IN)
    for architecture in BUILT_IN:
        assert load_preset(_tiny_preset(architecture)).architecture == architecture


def test_every_row_loads_its_classes_and_every_preset_names_a_row():
    from worldtrace_cli.config.backbones import load_object
    from worldtrace_cli.engine.base import PipelineBase

    for row in BACKBONES.values():
        assert issubclass(row.load("pipeline"), PipelineBase), row.architecture
        assert row.load("dit_config").from_dict and callable(load_object(row.dit))
        assert row.official_cache(load_preset(next(n for n in preset_names()
                                                    if load_preset(n).architecture == row.architecture)))["cache"]
    assert {load_preset(n).architecture for n in preset_names()} == set(BACKBONES)


# flag, its value, what the row must say for the flag to be taken
FLAGS = [
    ("--image", str(IMAGE), lambda r: r.start_image),
    ("--prompt", "a lighthouse", lambda r: r.run_prompt or r.takes_prompts),
    ("--poses", "POSES", lambda r: r.camera_files),
    ("--prompt-switch", "plain", lambda r: r.takes_prompts),
]


@pytest.mark.parametrize("architecture", [*BUILT_IN, "echo"])
def test_generate_takes_or_refuses_each_flag_as_the_row_says(architecture, echo, tmp_path):
    """For every row and conditioning flag: a row without the capability refuses the flag in one line
    (exit 2) naming it and the backbones that take it, before any model loads; a row with it gets past
    that check to the next one (a ``--spill-dir`` that is a file, checked after it: exit 4)."""
    preset, trajectory = _presets(echo)[architecture]
    row = BACKBONES[architecture]
    poses = tmp_path / "poses.npy"
    np.save(poses, np.tile(np.eye(4), (200, 1, 1)))
    spill = tmp_path / "a-file"
    spill.write_text("")
    for flag, value, takes in FLAGS:
        value = str(poses) if value == "POSES" else value
        result = invoke("generate", "--preset", preset, trajectory, flag, value, "--chunks", 1, "--cache", "field",
                        "--spill-dir", spill, "-o", tmp_path / "o")
        if takes(row):
            line = one_line_error(result, code=4)
            assert "--spill-dir" in line and "is not a folder" in line, (flag, line)
        else:
            line = one_line_error(result)
            assert line.startswith(f"worldtrace: error: {flag}: preset ") and f"({row.title}) takes no" in line
            assert line.endswith(f"only {titles_where(takes)} presets do"), line
        assert not (tmp_path / "o").exists()
    from worldtrace_cli.jobs.inputs import check_writer_specs

    loaded = load_preset(preset)
    if row.camera:  # a pose writer passes the pre-load checks
        check_writer_specs([memory_config("worldkv", preset=loaded)], loaded)
    else:
        line = one_line_error(invoke("generate", "--preset", preset, trajectory, "--cache", "worldkv", "-o",
                                     tmp_path / "o"))
        assert "--cache worldkv: retrieves memory by camera pose; preset" in line and "has no camera" in line


@pytest.mark.parametrize("architecture", [*BUILT_IN, "echo", "echo-still"])
def test_sessions_and_play_take_or_refuse_as_the_row_says(architecture, echo, tmp_path):
    """``worldtrace.open`` and ``worldtrace play`` on every row: a backbone that is not live is refused by
    both (one line, exit 2 from play); image= and prompt= are refused where the row takes none."""
    preset, _ = _presets(echo)[architecture]
    row = BACKBONES[architecture]
    args = ["play", "--preset", preset, "--port", 0, "--runs-dir", tmp_path / "runs"]
    if not row.live:
        with pytest.raises(InputError, match=f"{re.escape(row.title)} does not run live"):
            wt.open(preset)
        line = one_line_error(invoke(*args))
        assert "does not run live" in line
        return
    if not row.start_image:
        with pytest.raises(InputError, match="image=: preset .* takes no start image; only "):
            wt.open(preset, image=IMAGE)
    if not row.run_prompt:
        with pytest.raises(InputError, match=r"open: prompt= is the whole run's text prompt of LingBot-World"):
            wt.open(preset, image=IMAGE if row.start_image else None, prompt="a lighthouse")
    if not row.takes_prompts:
        with pytest.raises(InputError, match="prompt_switch='plain' is for Self-Forcing / LongLive presets"):
            wt.open(preset, image=IMAGE if row.start_image else None, prompt_switch="plain")


def test_a_registered_backbone_runs_generate_a_session_and_compare(echo, tmp_path):
    """Echo (MG2's tiny networks conditioned on a grey frame, registered from tests/) runs ``generate``, a
    live session and ``compare`` with no edit in worldtrace; its frames are those of the tiny preset given
    that grey frame as --image, chunk for chunk (the row picked Echo's pipeline, and nothing else changed),
    and a session stepped with the same actions makes them too."""
    skip_without_ffmpeg()
    from PIL import Image

    from echo_backbone.pipeline import GREY

    res = invoke("generate", "--preset", echo.PRESET, ABA, "--chunks", 3, "--cache", "landmark", "-o",
                 tmp_path / "echo", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "takes no start image; the trajectory's image" in res.output  # aba.yaml's image: told, unused
    summary = json.loads((tmp_path / "echo" / "summary.json").read_text())
    assert summary["config"]["preset"]["architecture"] == "echo" and summary["resolved"]["image"] == "none"
    grey = tmp_path / "grey.png"
    load = load_preset(str(echo.PRESET))
    Image.new("RGB", (load.width, load.height), GREY).save(grey)
    res = invoke("generate", "--preset", "tiny", ABA, "--image", grey, "--chunks", 3, "--cache", "landmark", "-o",
                 tmp_path / "tiny", "--no-progress")
    assert res.exit_code == 0, res.output

    def shas(run):
        return [json.loads(line)["frames_sha256"] for line in (run / "chunks.jsonl").read_text().splitlines()]

    assert shas(tmp_path / "echo") == shas(tmp_path / "tiny") and len(shas(tmp_path / "echo")) == 3
    with wt.open(str(echo.PRESET), cache="landmark", device="cpu", record=tmp_path / "live") as s:
        live = [s.step(w).record["frames_sha256"] for w in ("forward", "forward+camera_l", "camera_r")]
        command = s.replay_command(str(tmp_path / "live" / "trajectory.yaml"))
    res = invoke(*shlex.split(command)[1:], "-o", tmp_path / "replay", "--no-progress", "--device", "cpu")
    assert res.exit_code == 0, res.output
    assert shas(tmp_path / "replay") == live  # the session's frames, replayed by generate
    res = invoke("compare", "--preset", echo.PRESET, ABA, "--caches", "sliding,field", "--chunks", 2, "-o",
                 tmp_path / "cmp", "--no-progress")
    assert res.exit_code == 0, res.output
    assert len(json.loads((tmp_path / "cmp" / "compare.json").read_text())["modes"]) == 2
    line = one_line_error(invoke("compare", "--preset", echo.PRESET, ABA, "--caches", "sliding,retrieval", "-o",
                                 tmp_path / "cmp2"))
    assert "has no camera" in line and not (tmp_path / "cmp2").exists()


def _plugin_path(tmp_path: Path, name: str, entry: str) -> Path:
    """A folder holding an installed distribution's metadata (what ``pip install`` writes) whose entry
    point ``echo`` in the group ``worldtrace.backbones`` is ``entry``."""
    site = tmp_path / name
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[worldtrace.backbones]\necho = {entry}\n")
    return site


def _cli(*args, path: list[Path]):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    return subprocess.run([sys.executable, "-m", "worldtrace_cli", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def test_an_installed_package_registers_a_backbone_for_the_cli(tmp_path):
    """``worldtrace generate`` in a fresh process finds Echo through an installed package's entry point (no
    import of it by worldtrace's code); a plugin that does not import is one line naming it, exit 2; an
    architecture no row or plugin names is one line listing the known ones."""
    skip_without_ffmpeg()
    import echo_backbone

    good = _plugin_path(tmp_path, "echo_plugin", "echo_backbone:ROW")
    res = _cli("generate", "--preset", echo_backbone.PRESET, ABA, "--chunks", 1, "-o", tmp_path / "run",
               "--no-progress", path=[good, TESTS])
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["config"]["preset"]["architecture"] == "echo"
    broken = _plugin_path(tmp_path, "broken_plugin", "no_such_module:ROW")
    res = _cli("generate", "--preset", echo_backbone.PRESET, ABA, "-o", tmp_path / "run2", path=[broken, TESTS])
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        "worldtrace: error: backbone plugin echo (no_such_module:ROW): ModuleNotFoundError: No module named "
        "'no_such_module'"), res.stderr[-2000:]
    res = _cli("generate", "--preset", echo_backbone.PRESET, ABA, "-o", tmp_path / "run3", path=[TESTS])
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1].endswith(
        "architecture: must be one of mg2, lingbot, selfforcing, got 'echo'"), res.stderr[-2000:]
    assert not any((tmp_path / r).exists() for r in ("run2", "run3"))


@pytest.mark.parametrize("body, kind", [("import sys\nsys.exit(0)\n", "SystemExit"),
                                        ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
                                        ("ROW = ['x']\n", "gives str, not a Backbone row")])
def test_a_plugin_that_raises_anything_is_a_refusal_and_the_others_still_list(tmp_path, body, kind):
    """A plugin whose import calls sys.exit(0) made generate exit 0 with no run; `presets --backbones`
    with a broken plugin printed a traceback (exit 1). Now: one line naming the plugin, exit 2; the
    backbone table lists the rest, naming the broken one in one line."""
    import echo_backbone

    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "bad_plugin_mod.py").write_text(body)
    bad = _plugin_path(tmp_path, "bad_plugin", "bad_plugin_mod:ROW")
    res = _cli("generate", "--preset", echo_backbone.PRESET, ABA, "--chunks", 1, "-o", tmp_path / "run",
               "--no-progress", path=[bad, mods, TESTS])
    last = res.stderr.strip().splitlines()[-1]
    assert res.returncode == 2 and last.startswith("worldtrace: error: backbone plugin echo (bad_plugin_mod:ROW): "), res.stderr
    assert kind in last and not (tmp_path / "run").exists()
    res = _cli("presets", "--backbones", path=[bad, mods, TESTS])
    assert res.returncode == 0 and "| `mg2` |" in res.stdout, res.stderr
    assert [line for line in res.stderr.splitlines() if "bad_plugin_mod" in line] == [
        line for line in res.stderr.splitlines() if line.strip()] and len(res.stderr.strip().splitlines()) == 1


def test_lingbot_world_runs_live_and_generate_replays_the_session(tmp_path):
    """A LingBot-World session stepped with actions (its camera made chunk by chunk from them) writes a
    trajectory whose replay command, run as written, makes the same frames chunk for chunk."""
    skip_without_ffmpeg()
    with wt.open("lingbot-tiny", image=IMAGE, prompt="a quiet loop", cache="sink", device="cpu",
                 record=tmp_path / "live") as s:
        shas = [s.step(a).record["frames_sha256"] for a in ("forward", "forward+camera_l", "camera_r")]
        assert s.takes_prompts is False and s.cache["writer"] == "sink"
        command = s.replay_command(str(tmp_path / "live" / "trajectory.yaml"))
    argv = shlex.split(command)
    assert argv[:2] == ["worldtrace", "generate"] and "--prompt" in argv
    res = invoke(*argv[1:], "-o", tmp_path / "replay", "--no-progress", "--device", "cpu")
    assert res.exit_code == 0, res.output
    replayed = [json.loads(line)["frames_sha256"] for line in (tmp_path / "replay" / "chunks.jsonl").read_text()
                .splitlines()]
    assert replayed == shas


def test_a_lingbot_world_session_saves_loads_and_forks_to_the_same_frames(tmp_path):
    """save / load / fork of a LingBot-World session (its camera poses integrated so far travel with the
    run's parts): the original, a fork and a loaded copy make the same next chunk, the cache panel's
    slots included."""
    with wt.open("lingbot-tiny", image=IMAGE, prompt="a quiet loop", cache="landmark", device="cpu") as s:
        for action in ("forward", "forward+camera_l"):
            s.step(action)
        fork = s.fork()
        s.save(tmp_path / "saved")
        loaded = wt.load(tmp_path / "saved", pipeline=s.pipeline)
        outs = [x.step("camera_r").record for x in (s, fork, loaded)]
        for x in (fork, loaded):
            x.close()
    assert len({r["frames_sha256"] for r in outs}) == 1
    assert outs[0]["cache"]["slots"] == outs[1]["cache"]["slots"] == outs[2]["cache"]["slots"]
    assert outs[0]["chunk"] == 2 and outs[0]["cache"]["writer"] == "landmark"


def test_the_source_names_no_backbone_outside_the_registry_and_the_backbones_own_modules():
    """Only the registry and each backbone's own modules (its model folder, pipeline, rollout, the replay of
    its official code's fixtures) name an architecture: no ``is_lingbot`` / ``is_text``, no ``architecture ==`` test, no
    architecture name as a string anywhere else in the package."""
    own = re.compile(r"config/backbones\.py|model/lingbot/|model/selfforcing/|engine/(mg2|lingbot|lingbot_rollout|text|"
                     r"text_rollout)\.py|(jobs|cli)/parity(_lingbot|_selfforcing)?\.py")
    named = re.compile(r"\bis_(lingbot|text)\b|architecture\s*[!=]=|[\"'](mg2|lingbot|selfforcing)[\"']")
    found = []
    for path in sorted((ROOT / "worldtrace_cli").rglob("*.py")):
        rel = path.relative_to(ROOT / "worldtrace_cli").as_posix()
        if own.match(rel):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if named.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_docs_table_of_backbones_is_the_registry():
    """docs/presets.md's backbone table is what ``worldtrace presets --backbones`` prints."""
    from worldtrace_cli.config.backbones import backbone_table

    text = (ROOT / "docs" / "presets.md").read_text()
    doc = text.split("<!-- backbones:start -->\n", 1)[1].split("\n<!-- backbones:end -->", 1)[0]
    assert doc == backbone_table()
    res = invoke("presets", "--backbones")
    assert res.exit_code == 0 and res.output.strip() == backbone_table()
    assert all(f"| `{a}` |" in doc for a in ("mg2", "lingbot", "selfforcing"))


def test_the_docs_tables_of_writers_name_every_registered_writer_and_no_other():
    """docs/architecture.md's writer table has one row per registered writer (``--cache``), no more."""
    from worldtrace_cli.writer_options import WRITER_OPTIONS

    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("### The writers", 1)[1].split("\n\n", 3)[2]
    rows = re.findall(r"^\| `([a-z][a-z-]*)", table, flags=re.M)  # `mixed:k`, `worldkv[:r]`: the name
    assert sorted(rows) == sorted(WRITER_OPTIONS) and len(rows) == len(set(rows)), rows


def test_the_readme_and_memory_tables_say_each_writers_own_default_positions():
    """README.md's and docs/memory.md's ``--cache`` tables: one row per registered writer, no more, and
    each row's "default positions" column is the scheme the writer class reads slots at by default."""
    from worldtrace_cli.memory import WRITERS
    from worldtrace_cli.writer_options import WRITER_OPTIONS

    for page in (ROOT / "README.md", ROOT / "docs" / "memory.md"):
        text = page.read_text()
        start = text.index("| `--cache` |")
        table = text[start:text.index("\n\n", start)].splitlines()
        header = [c.strip() for c in table[0].strip("|").split("|")]
        col = header.index("default positions")
        rows = {re.match(r"`([a-z][a-z-]*)", cells[0]).group(1): cells[col]
                for cells in ([c.strip() for c in line.strip("|").split("|")] for line in table[2:])}
        assert sorted(rows) == sorted(WRITER_OPTIONS), (page.name, sorted(rows))
        for name, said in rows.items():
            assert said.startswith(f"`{WRITERS[name].default_positions}`"), (page.name, name, said)
