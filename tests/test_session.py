"""The session API (worldtrace_cli.session): step = generate, fork, save/load, the recorded
trajectory replays exactly, bad actions refused without changing the session. On loopworld (the
shipped model, CPU), one pipeline shared by the module."""

from __future__ import annotations

import json

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
    poses = s.truth_source.poses[9:21]
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
    with pytest.raises(InputError, match="LingBot-World runs with worldtrace generate"):
        wt.open("lingbot-tiny")
    with pytest.raises(InputError, match="unknown writer option"):
        _open(pipeline, tau=0.1)
    # a writer's checks in the API's words: keywords, not the CLI's flags
    with pytest.raises(InputError, match=r"^open: top_k: cache='landmark' does not use it \(only worldkv reads it"):
        _open(pipeline, cache="landmark", top_k=4)
    with pytest.raises(InputError, match=r"^open: cache='mixed:9': k must be in \[0, 4\]"):
        _open(pipeline, cache="mixed:9")
    with pytest.raises(InputError, match="needs a conditioning image"):
        wt.open("tiny")
    with pytest.raises(InputError, match="seed must be an integer >= 0"):
        _open(pipeline, seed=-1)
    s = _open(pipeline, cache="sliding")
    with pytest.raises(InputError, match="no chunk yet"):
        s.fork()
    s.close()
    with pytest.raises(InputError, match="closed"):
        s.step("forward")
