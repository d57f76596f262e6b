"""The session API (worldtrace_cli.session): step = generate, fork, save/load, the recorded
trajectory replays exactly, bad actions refused without changing the session. On loopworld (the
shipped model, CPU), one pipeline shared by the module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import worldtrace_cli as wt
from worldtrace_cli.errors import InputError

# chunk 0 as one word, a combination, per-pixel-frame rows (macro words and explicit keys/mouse), a turn back
ACTIONS = ["forward", "forward+camera_l",
           ["camera_r"] * 6 + [{"keys": "W", "mouse": [0.0, 0.05]}] * 6,
           "camera_r+back"]


@pytest.fixture(scope="module")
def pipeline():
    from worldtrace_cli.config import load_preset
    from worldtrace_cli.engine.pipeline import Pipeline

    return Pipeline.from_preset(load_preset("loopworld"), device="cpu", dtype="fp32")


def _open(pipeline, cache="landmark", **kwargs):
    return wt.open("loopworld", cache=cache, device="cpu", dtype="fp32", pipeline=pipeline, **kwargs)


def test_session_frames_equal_generate_and_its_trajectory_replays(pipeline, tmp_path):
    from worldtrace_cli.config import RunConfig, load_preset, memory_config
    from worldtrace_cli.jobs.generate import run_generation

    with _open(pipeline, record=tmp_path / "live") as s:
        shas = []
        for actions in ACTIONS:
            frames, record = s.step(actions)
            assert frames.dtype == np.uint8 and frames.shape[1:] == (96, 176, 3)
            assert frames.shape[0] == (9 if record["chunk"] == 0 else 12)
            shas.append(record["frames_sha256"])
        assert s.cache["writer"] == "landmark" and s.cache["slots"]
    run = tmp_path / "live"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["chunks"] == len(ACTIONS)
    assert [json.loads(line)["frames_sha256"] for line in (run / "chunks.jsonl").read_text().splitlines()] == shas
    preset = load_preset("loopworld")
    cfg = RunConfig(preset=preset, trajectory=run / "trajectory.yaml", output=tmp_path / "replay", device="cpu",
                    dtype="fp32", memory=memory_config("landmark", preset=preset), progress=False)
    run_generation(cfg, pipeline=pipeline)
    replayed = [json.loads(line)["frames_sha256"] for line in (tmp_path / "replay" / "chunks.jsonl").read_text().splitlines()]
    assert replayed == shas  # generate on the session's trajectory.yaml: the same frames, chunk for chunk


def test_fork_leaves_the_original_untouched_and_save_load_round_trips(pipeline, tmp_path):
    s = _open(pipeline, cache="field")
    for actions in ACTIONS[:2]:
        s.step(actions)
    twin = s.fork()
    s.save(tmp_path / "state")
    for _ in range(2):  # the fork walks elsewhere, its cache fills with other frames
        twin.step("camera_r")
    after_fork = s.step("back").frames
    fresh = _open(pipeline, cache="field")
    for actions in ACTIONS[:2] + ["back"]:
        expected = fresh.step(actions).frames
    assert np.array_equal(after_fork, expected)
    loaded = wt.load(tmp_path / "state", pipeline=pipeline)
    assert loaded.chunk == 2 and loaded.cache["writer"] == "field"
    assert np.array_equal(loaded.step("back").frames, expected)
    assert not np.array_equal(twin.step("back").frames, expected)  # the fork's own past: another future


def test_truth_and_actions_taken(pipeline):
    from worldtrace_cli.world.render import render_frames
    from worldtrace_cli.world.scene import make_world

    s = _open(pipeline, cache="sliding", world_seed=3)
    with pytest.raises(InputError, match="has not been generated"):
        s.truth()
    s.step("forward")
    s.step(ACTIONS[2])
    truth = s.truth()
    assert truth.shape == (12, 96, 176, 3) and truth.dtype == np.uint8
    poses = s.truth_source.pixel_poses(9, 21)
    assert np.array_equal(truth, render_frames(make_world(3), poses, 96, 176))
    assert s.actions_taken()[0] == "forward" and len(s.actions_taken()[1]) == 12


@pytest.mark.parametrize("actions, message", [
    ("jump", "'jump' is not valid in universal mode"),
    ("forward+back", "contradict"),
    (["forward"] * 5, "one per pixel frame: this chunk has 9"),
    ({"keys": "Q"}, "unknown key 'Q'"),
    (42, "actions must be action words"),
])
def test_bad_actions_are_refused_and_change_nothing(pipeline, actions, message):
    s = _open(pipeline, cache="sliding", metrics="none")
    with pytest.raises(InputError, match=message) as err:
        s.step(actions)
    assert "\n" not in str(err.value) and s.chunk == 0
    assert s.step("forward").record["chunk"] == 0


def test_open_refuses_what_a_session_cannot_run(pipeline, tmp_path):
    with pytest.raises(InputError, match="lingbot-tiny: needs a conditioning image"):
        wt.open("lingbot-tiny")  # LingBot-World runs live (tests/test_backbones.py), from an image
    with pytest.raises(InputError, match="unknown writer option"):
        _open(pipeline, tau=0.1)
    # a writer's checks in the API's words: keywords, not the CLI's flags
    with pytest.raises(InputError, match=r"^open: top_k: cache='landmark' does not use it \(only worldkv reads it"):
        _open(pipeline, cache="landmark", top_k=4)
    with pytest.raises(InputError, match=r"^open: cache='mixed:9': k must be in \[0, 4\]"):
        _open(pipeline, cache="mixed:9")
    with pytest.raises(InputError, match="needs a conditioning image"):
        wt.open("tiny")
    with pytest.raises(InputError, match=r"seed must be an integer with 0 <= seed < 2\*\*63, got -1"):
        _open(pipeline, seed=-1)
    s = _open(pipeline, cache="sliding")
    with pytest.raises(InputError, match="no chunk yet"):
        s.fork()
    s.close()
    with pytest.raises(InputError, match="closed"):
        s.step("forward")


def test_save_never_destroys_what_it_did_not_write(pipeline, tmp_path):
    """Issue 44 (1, 2): save into a user's folder, over a file, beside a user's .old/.tmp folder is
    refused with the path named and everything left as it was; only a saved session is replaced,
    and only with overwrite=True."""
    from worldtrace_cli.errors import OutputError

    s = _open(pipeline, cache="sliding", metrics="none")
    s.step("forward")
    results = tmp_path / "proj" / "results"
    results.mkdir(parents=True)
    (results / "thesis.txt").write_text("x")
    with pytest.raises(OutputError, match=r"^save: .*results: exists and is a folder with other files") as err:
        s.save(results)
    assert "\n" not in str(err.value) and (results / "thesis.txt").read_text() == "x"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(OutputError, match=r"notes\.txt: exists and is not a folder"):
        s.save(a_file)
    assert a_file.read_text() == "mine" and not (tmp_path / "notes.txt.old").exists()
    (tmp_path / "link").symlink_to(results, target_is_directory=True)  # a link to the user's folder
    with pytest.raises(OutputError, match=r"link: exists and is a link, not a saved state"):
        s.save(tmp_path / "link")
    assert (tmp_path / "link").is_symlink() and (results / "thesis.txt").read_text() == "x"
    (tmp_path / "link").unlink()
    for sibling in ("here.old", "here.tmp"):  # the save's scratch names, taken by the user's folders
        (tmp_path / sibling).mkdir()
        (tmp_path / sibling / "keep.txt").write_text(sibling)
        with pytest.raises(OutputError, match=rf"{sibling}: exists and is a folder with other files"):
            s.save(tmp_path / "here")
        assert (tmp_path / sibling / "keep.txt").read_text() == sibling and not (tmp_path / "here").exists()
        (tmp_path / sibling / "keep.txt").unlink()
        (tmp_path / sibling).rmdir()
    with pytest.raises(InputError, match="empty path"):
        s.save("")
    with pytest.raises(OutputError, match="filesystem's root"):
        s.save("/")
    lone = tmp_path / "ckpt"  # a user's own weights, named like a state's tensors
    lone.mkdir()
    (lone / "state.safetensors").write_bytes(b"mine")
    with pytest.raises(OutputError, match=r"ckpt: exists and is a folder with other files"):
        s.save(lone)
    assert (lone / "state.safetensors").read_bytes() == b"mine"
    (lone / "state.safetensors").unlink()
    lone.rmdir()
    (tmp_path / "empty").mkdir()
    assert s.save(tmp_path / "empty") == tmp_path / "empty"  # an empty folder holds nothing to lose
    with pytest.raises(OutputError, match=r"already holds a saved session \(save\(\.\.\., overwrite=True\)"):
        s.save(tmp_path / "empty")
    s.step("forward")
    s.save(tmp_path / "empty", overwrite=True)
    assert wt.load(tmp_path / "empty", pipeline=pipeline).chunk == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "notes.txt", "proj"]  # no .old / .tmp left
    # a save killed between its two renames: the only copy sits in empty.old, and still counts
    (tmp_path / "empty").rename(tmp_path / "empty.old")
    with pytest.raises(OutputError, match=r"already holds a saved session"):
        s.save(tmp_path / "empty")
    assert wt.load(tmp_path / "empty", pipeline=pipeline).chunk == 2


def test_open_in_the_cli_ranges_and_words(pipeline, tmp_path, monkeypatch):
    """Issue 44 (4, 5, smaller): seeds in the CLI's range, record='' refused like -o '', presets in
    the API's words, a dict action's unknown key named."""
    with pytest.raises(InputError, match=r"^open: world_seed must be an integer with 0 <= world_seed < 2\*\*63"):
        _open(pipeline, world_seed=2**70)
    with pytest.raises(InputError, match=r"seed < 2\*\*63, got 9223372036854775808"):
        _open(pipeline, seed=2**63)
    assert _open(pipeline, world_seed=2**63 - 1).cfg.world_seed == 2**63 - 1  # the CLI's largest replays
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.txt").write_text("x")
    with pytest.raises(InputError, match=r"^open: record='' is the current folder"):
        _open(pipeline, record="")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]
    with pytest.raises(InputError, match=r"^open: preset: unknown preset 'nope'"):
        wt.open("nope")
    s = _open(pipeline, cache="sliding", metrics="none")
    with pytest.raises(InputError, match=r"unknown: 'jump'"):
        s.step({"keys": "W", "jump": 1})


def test_a_session_closed_before_its_first_step_leaves_no_folder(pipeline, tmp_path):
    """Issue 44 (9): nothing generated, nothing left: no run folder holding only its lock; an old
    run opened with overwrite=True and closed before a step is left as it was."""
    s = _open(pipeline, cache="sliding", record=tmp_path / "never")
    assert (tmp_path / "never").is_dir()  # locked while open
    s.close()
    assert not (tmp_path / "never").exists()
    with _open(pipeline, cache="sliding", metrics="none", record=tmp_path / "run") as s:
        s.step("forward")
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    _open(pipeline, cache="sliding", record=tmp_path / "run", overwrite=True).close()
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["totals"]["chunks"] == 1


def test_summary_without_a_record_folder_counts_what_was_stepped(pipeline, valid):
    """``s.summary()`` without ``record=``: refused before the first chunk (one line), then a schema-valid
    summary whose totals count the chunks stepped, their seconds and the cache's largest offset."""
    with _open(pipeline, cache="landmark") as s:
        with pytest.raises(InputError, match="summary: the session has no chunk yet; step first"):
            s.summary()
        for actions in ACTIONS[:3]:
            s.step(actions)
        summary = s.summary()
        valid(summary, "summary")
        assert summary["run_dir"] is None and summary["totals"]["chunks"] == 3
        assert summary["totals"]["seconds"]["denoise"] > 0 and summary["totals"]["pixel_frames"] == 9 + 2 * 12
        offsets = [r["cache"]["max_offset"] for r in s.records if r["cache"]["max_offset"] is not None]
        assert offsets and summary["cache"]["max_offset"] == max(offsets)
        s.step("forward")
        assert s.summary()["totals"]["chunks"] == 4
        assert summary["status"] == "open" and summary["metrics"]["gt"] is not None  # it can still step
    assert s.summary()["status"] == "complete"  # closed


def test_open_refuses_a_pipeline_of_another_preset(pipeline):
    with pytest.raises(InputError, match=r"^open: pipeline= is a loaded loopworld, not preset tiny"):
        wt.open("tiny", image=Path(__file__).resolve().parents[1] / "assets" / "images" / "mg2_universal_0000.png",
                pipeline=pipeline, device="cpu", dtype="fp32")


_SAVER = """
import sys
import worldtrace_cli as wt
s = wt.open("tiny", cache="landmark", image=sys.argv[2], device="cpu", dtype="fp32")
s.step("forward")
s.step("camera_l")
print("ready", flush=True)
while True:
    s.save(sys.argv[1], overwrite=True)
    print("saved", flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.15])
def test_a_session_killed_while_saving_leaves_a_state_that_loads(tmp_path, delay):
    """kill -9 at a random moment of ``save(overwrite=True)`` (the tensors half written, between the two
    renames): the folder still loads (the previous or the new state) and the next save succeeds."""
    import signal
    import subprocess
    import sys
    import time

    image = Path(__file__).resolve().parents[1] / "assets" / "images" / "mg2_universal_0000.png"
    proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(tmp_path / "saved"), str(image)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert proc.stdout.readline().strip() == "saved"  # one complete state exists
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    loaded = wt.load(tmp_path / "saved")
    assert loaded.chunk == 2
    frames, record = loaded.step("forward")
    assert record["chunk"] == 2
    loaded.save(tmp_path / "saved", overwrite=True)
    loaded.close()
