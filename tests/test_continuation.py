"""Continue a real video with its memory (--prefix): the clip's chunks are committed to the cache, not
generated, on every backbone; the chunks after it are scored against the real frames; compare,
loopbench, sessions and MIND's format both ways. On tiny presets and loopworld clips made here."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from worldtrace_cli.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
ABA = ROOT / "trajectories" / "aba.yaml"


def _truth_frames(frames: int, world: int = 3) -> np.ndarray:
    from worldtrace_cli.config import load_preset
    from worldtrace_cli.trajectory import load_trajectory, plan_actions
    from worldtrace_cli.world.truth import GroundTruth

    preset = load_preset("loopworld")
    plan = plan_actions(load_trajectory(ABA), None, 3)
    return GroundTruth(world, plan, preset.height, preset.width, preset.world).frames(0, frames)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """A loopworld render of aba.yaml's first frames as clips: 45 frames (4 MG2 chunks) as an MP4 and as a
    folder of PNGs, 40 frames (not whole chunks), and 45 frames at twice the size."""
    from PIL import Image

    from worldtrace_cli.outputs import VideoStreamWriter

    root = tmp_path_factory.mktemp("clips")
    frames = _truth_frames(45)
    out = {"frames": frames}
    for name, part in (("c45", frames), ("c40", frames[:40])):
        path = root / f"{name}.mp4"
        with VideoStreamWriter(path, 176, 96, 25.0, crf=0) as video:
            video.write(part)
        out[name] = path
    big = root / "big.mp4"
    with VideoStreamWriter(big, 352, 192, 25.0) as video:
        video.write(np.stack([np.asarray(Image.fromarray(f).resize((352, 192))) for f in frames]))
    out["big"] = big
    folder = root / "pngs"
    folder.mkdir()
    for i, f in enumerate(frames):
        Image.fromarray(f).save(folder / f"frame{i}.png")  # natural order: frame2 before frame10
    out["pngs"] = folder
    return out


def _cfg(tmp_path, preset="tiny", trajectory=ABA, **kw):
    from worldtrace_cli.config import RunConfig, load_preset, memory_config

    p = load_preset(preset)
    defaults = dict(preset=p, trajectory=trajectory, output=tmp_path / "run", device="cpu", dtype="fp32",
                    memory=memory_config("sliding", preset=p), progress=False, save_every=0)
    defaults.update(kw)
    if "cache" in defaults:
        defaults["memory"] = memory_config(defaults.pop("cache"), preset=p)
    return RunConfig(**defaults)


# --------------------------------------------------------------------------- refusals, before any model


@pytest.mark.parametrize("case, message", [
    (dict(prefix="nope.mp4"), r"--prefix .*nope.mp4: no such file or folder"),
    (dict(prefix="c40"), r"40 pixel frames is not a whole number of chunks .*33 or 45.*--prefix-chunks K"),
    (dict(prefix="c45", prefix_chunks=5), r"--prefix-chunks 5: needs 57 pixel frames, --prefix .* has 45"),
    (dict(prefix="c45", chunks=4), r"covers 4 chunks, the run has 4: nothing is left to generate"),
    (dict(prefix="truth:2"), r"preset tiny has no procedural world"),
    (dict(prefix="truth:x"), r"expected truth:K"),
    (dict(prefix_chunks=2), r"--prefix-chunks: needs --prefix"),
    (dict(reference="c45"), r"--reference: needs --prefix"),
    (dict(prefix="c45", prefix_chunks=2, reference="c45"), r"--reference .*holds 24 pixel frames after its 2 chunks"),
])
def test_a_prefix_that_does_not_fit_is_one_line_before_the_model(tmp_path, clips, case, message):
    from worldtrace_cli.continuation import plan_prefix

    case = {k: (str(clips[v]) if isinstance(v, str) and v in clips else v) for k, v in case.items()}
    chunks = case.pop("chunks", 8)
    with pytest.raises(InputError, match=message):
        plan_prefix(_cfg(tmp_path, **case), chunks)


def test_generate_refuses_a_bad_prefix_with_exit_2_and_writes_nothing(tmp_path, clips):
    from worldtrace_cli.cli import main

    res = CliRunner().invoke(main, ["generate", "--preset", "tiny", str(ABA), "--prefix", str(clips["c40"]),
                                    "--chunks", "5", "-o", str(tmp_path / "out"), "--no-progress"])
    assert res.exit_code == 2 and "not a whole number of chunks" in res.output, res.output
    assert not (tmp_path / "out").exists()


def test_a_clip_is_read_from_an_mp4_or_frames_and_resized_with_a_note(tmp_path, clips):
    from worldtrace_cli.continuation import load_prefix, plan_prefix

    read = {}
    for key in ("c45", "pngs", "big"):
        cfg = _cfg(tmp_path, prefix=str(clips[key]), prefix_chunks=3)
        plan = plan_prefix(cfg, 6)
        assert (plan.chunks, plan.frames, plan.reference_frames) == (3, 33, 45)
        read[key] = load_prefix(cfg, plan)
        assert read[key].frames.shape == (33, 96, 176, 3)
    assert np.array_equal(read["pngs"].frames, clips["frames"][:33])  # PNGs are exact, in natural order
    assert np.abs(read["c45"].frames.astype(int) - clips["frames"][:33]).mean() < 6  # H.264 crf 0 in yuv420p
    assert read["big"].notes and "resized to 176x96" in read["big"].notes[0]
    assert read["big"].reference.frames(33, 45).shape[0] == 12


# --------------------------------------------------------------------------- the run


@pytest.mark.parametrize("preset, trajectory, k", [
    ("tiny", ABA, 2), ("lingbot-tiny", ABA, 1), ("self-forcing-tiny", ROOT / "trajectories" / "prompts_aba.yaml", 2)])
def test_the_prefix_is_committed_not_generated_and_the_rest_scored(tmp_path, clips, preset, trajectory, k):
    import torch

    from worldtrace_cli.engine.pipeline import Pipeline
    from worldtrace_cli.jobs.generate import run_generation
    from worldtrace_cli.outputs import read_jsonl

    cfg = _cfg(tmp_path, preset, trajectory, prefix=str(clips["pngs"]), prefix_chunks=k, chunks=k + 1)
    pipe = Pipeline.from_config(cfg)
    summary = run_generation(cfg, pipeline=pipe)
    records = read_jsonl(cfg.output / "chunks.jsonl")
    assert [r.get("prefix", False) for r in records] == [True] * k + [False]
    fpc = pipe.preset.frames_per_chunk
    frames = clips["frames"][:4 * fpc * k - 3]
    latents = pipe.encode_prefix(frames)  # what the writer must have been given
    for c in range(k):
        x = latents[:, :, c * fpc:(c + 1) * fpc]
        assert records[c]["latents"]["mean"] == pytest.approx(x.mean().item(), abs=2e-6)
        assert records[c]["metrics"]["ref_psnr"] is None  # the prefix is not scored
    last = records[k]
    assert last["cache"]["slots"], "the generated chunk read a past"
    assert last["metrics"]["ref_psnr"] is not None and 0 < last["metrics"]["ref_mse"] < 1
    cont = summary["metrics"]["continuation"]
    assert (cont["prefix_chunks"], cont["scored_chunks"]) == (k, 1) and cont["lpips"] is None
    assert summary["prefix"]["chunks"] == k and summary["prefix"]["source"].endswith("pngs")
    assert (cfg.output / "continuation.mp4").is_file()
    from worldtrace_cli.outputs import count_video_frames

    total = count_video_frames(cfg.output / "video.mp4")
    assert count_video_frames(cfg.output / "continuation.mp4") == total - (4 * fpc * k - 3)
    # a free run of the same settings generates other frames at chunk k: the real past was read
    free = run_generation(replace(cfg, prefix=None, prefix_chunks=None, output=tmp_path / "free"), pipeline=pipe)
    assert free["prefix"] is None
    assert read_jsonl(tmp_path / "free" / "chunks.jsonl")[k]["frames_sha256"] != last["frames_sha256"]
    torch.manual_seed(0)


def test_the_video_marks_the_prefix_and_the_records_keep_its_frames(tmp_path, clips):
    from worldtrace_cli.jobs.generate import run_generation
    from worldtrace_cli.outputs import read_video_frames
    from worldtrace_cli.continuation import MARK_RGB

    cfg = _cfg(tmp_path, prefix=str(clips["c45"]), prefix_chunks=1, chunks=2)
    run_generation(cfg)
    video = read_video_frames(cfg.output / "video.mp4")
    border = video[:9, 0, :, :].reshape(-1, 3).mean(0)  # top row of the prefix's frames
    assert np.abs(border - MARK_RGB).max() < 30
    assert np.abs(video[9:, 0, :, :].reshape(-1, 3).mean(0) - MARK_RGB).max() > 30  # the continuation is not marked


def test_reference_scores_are_psnr_ssim_mse_of_the_frames_against_the_clip(clips):
    from worldtrace_cli.metrics.reference import reference_scores

    real = clips["frames"][:12]
    noisy = np.clip(real.astype(int) + np.random.default_rng(0).integers(-20, 21, real.shape), 0, 255).astype(np.uint8)
    s = reference_scores(noisy, real[:7])  # a reference shorter than the chunk: its frames only
    assert len(s["psnr"]) == 7
    mse = ((noisy[:7].astype(float) - real[:7]) / 255) ** 2
    assert s["mse"] == pytest.approx(mse.reshape(7, -1).mean(1).tolist())
    assert s["psnr"][0] == pytest.approx(10 * np.log10(1 / s["mse"][0]), abs=1e-6)
    assert reference_scores(noisy, real[:0]) is None
    assert all(v > 0.99 for v in reference_scores(real, real)["ssim"])


def test_a_session_continues_a_clip_and_replays_in_generate(tmp_path, clips):
    import worldtrace_cli as wt
    from worldtrace_cli.cli import main
    from worldtrace_cli.outputs import read_jsonl

    with wt.open("tiny", cache="landmark", device="cpu", dtype="fp32", prefix=clips["c45"], prefix_chunks=2,
                 record=tmp_path / "live") as s:
        made = [tuple(s.step(a)) for a in ("forward", "forward", "camera_l")]
    assert [r.get("prefix", False) for _, r in made] == [True, True, False]
    assert made[2][1]["metrics"]["ref_psnr"] is not None
    command = (tmp_path / "live" / "trajectory.yaml").read_text().splitlines()[1]  # "# Replay: worldtrace generate ..."
    assert "--prefix" in command and "--prefix-chunks 2" in command
    res = CliRunner().invoke(main, ["generate", str(tmp_path / "live" / "trajectory.yaml"), "--preset", "tiny",
                                    "--cache", "landmark", "--prefix", str(clips["c45"]), "--prefix-chunks", "2",
                                    "--device", "cpu", "--dtype", "fp32", "--no-progress",
                                    "-o", str(tmp_path / "replay")])
    assert res.exit_code == 0, res.output
    replay = read_jsonl(tmp_path / "replay" / "chunks.jsonl")
    assert [r["frames_sha256"] for r in replay] == [r["frames_sha256"] for _, r in made]
    with pytest.raises(InputError, match="a session takes a video"):
        wt.open("loopworld", device="cpu", prefix="truth:2")


def test_compare_puts_the_real_clip_first_and_scores_every_writer(tmp_path, clips):
    from worldtrace_cli.jobs.compare import compare_markdown, run_compare

    result = run_compare(ABA, ["sliding", "landmark"], tmp_path / "cmp", preset="tiny", chunks=3, metrics="fast",
                         device="cpu", dtype="fp32", prefix={"prefix": str(clips["c45"]), "prefix_chunks": 2,
                                                              "reference": None})
    assert (tmp_path / "cmp" / "reference" / "video.mp4").is_file()
    assert all(m["metrics"]["ref_psnr"] is not None and m["prefix_chunks"] == 2 for m in result["modes"])
    assert "Continuation of a real clip" in compare_markdown(result)
    assert result["video"]["columns"] * result["video"]["rows"] >= 3  # real, sliding, landmark


def test_loopbench_reports_the_prefixed_runs_beside_the_free_ones(tmp_path):
    from worldtrace_cli.jobs.loopbench import run_jobs
    from worldtrace_cli.loopbench import plan
    from worldtrace_cli.loopbench.report import collect, report

    jobs = plan.plan_jobs([str(ABA)], ["sliding"], [], [0], worlds=[2], prefixes=plan.parse_prefixes("free,truth:1"))
    assert [j.key for j in jobs] == ["aba/sliding/world2/seed0", "aba@truth1/sliding/world2/seed0"]
    counts = run_jobs(jobs, tmp_path / "lb", preset="loopworld", device="cpu", dtype="fp32", metrics="fast", chunks=2)
    assert counts.done == 2
    rows = {r["cache"]: r for r in collect(tmp_path / "lb")}
    assert set(rows) == {"sliding", "sliding@truth:1"}
    assert rows["sliding@truth:1"]["prefix"] == "truth:1" and rows["sliding@truth:1"]["ref_psnr"] is not None
    assert rows["sliding"]["ref_psnr"] is None
    text = report(tmp_path / "lb")["report.md"].read_text()
    assert "sliding@truth:1" in text and "Continuation PSNR" in text
    with pytest.raises(InputError, match="duplicate"):
        plan.parse_prefixes("free,free")


# --------------------------------------------------------------------------- MIND's format


def test_a_mind_clip_made_here_reads_back_as_its_own_trajectory(tmp_path):
    from worldtrace_cli.continuation.mind import mind_trajectory, read_mind_clip, write_loopworld_clip
    from worldtrace_cli.trajectory import load_trajectory, parse_trajectory, plan_actions

    look_back = ROOT / "trajectories" / "look_back.yaml"
    clip = write_loopworld_clip(tmp_path / "1st_data" / "test" / "mem_test" / "loop", 5, look_back, 2, chunks=5)
    again = read_mind_clip(clip.folder)
    assert (again.mark_time, again.total_time, again.perspective, again.test_type) == (21, 57, "1st_data", "mem_test")
    doc = json.loads((clip.folder / "action.json").read_text())
    assert set(doc["data"][0]) >= {"time", "ws", "ad", "ud", "lr", "actor_pos", "actor_rpy"}
    planned = plan_actions(load_trajectory(look_back), 5)
    back = plan_actions(parse_trajectory(mind_trajectory(again)), 5)
    assert np.array_equal(planned.keyboard.numpy(), back.keyboard.numpy())
    assert np.allclose(planned.mouse.numpy(), back.mouse.numpy())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("mark_time"), r"mark_time: missing"),
    (lambda d: d["data"][3].update(ws=5), r"data\[3\]\.ws: expected 0 \(none\), 1 or 2, got 5"),
    (lambda d: d["data"][1].pop("lr"), r"data\[1\]\.lr: missing"),
    (lambda d: d.update(mark_time=999), r"mark_time 999 is not before total_time"),
    (lambda d: d.update(mark_time=True), r"mark_time: expected an integer >= 1, got True"),
])
def test_a_malformed_action_json_is_named_by_field(tmp_path, edit, message):
    from worldtrace_cli.continuation.mind import read_mind_clip

    folder = tmp_path / "clip"
    folder.mkdir()
    (folder / "video.mp4").write_bytes(b"")
    doc = {"mark_time": 5, "total_time": 10, "data": [{"time": i, "ws": 0, "ad": 0, "ud": 0, "lr": 0} for i in range(10)]}
    edit(doc)
    (folder / "action.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match=message):
        read_mind_clip(folder)


def test_mind_poses_are_rotations_and_yaw_turns_to_the_right():
    from worldtrace_cli.continuation.mind import MindClip, mind_poses

    def entry(yaw, pitch=0.0):
        return {"ws": 0, "ad": 0, "ud": 0, "lr": 0, "actor_pos": {"x": 100.0, "y": 0.0, "z": 0.0},
                "actor_rpy": {"x": 0.0, "y": pitch, "z": yaw}}

    clip = MindClip(Path("."), Path("v.mp4"), "c", 1, 3, "", [entry(0), entry(90), entry(0, 30)], None, None)
    poses = mind_poses(clip)
    for p in poses:
        assert np.allclose(p[:3, :3] @ p[:3, :3].T, np.eye(3)) and np.isclose(np.linalg.det(p[:3, :3]), 1)
    assert np.allclose(poses[0][:3, :3], np.eye(3))  # facing Unreal's +x = OpenCV's identity
    assert np.allclose(poses[0][:3, 3], [0, 0, 1])  # 100 cm forward = 1 m along the camera's z
    assert np.allclose(poses[1][:3, :3] @ [0, 0, 1], [1, 0, 0])  # yaw 90: forward is the old right
    assert (poses[2][:3, :3] @ [0, 0, 1])[1] < 0  # pitch up: forward points up (OpenCV y is down)


def test_mind_run_writes_the_submission_and_its_scores_read_back(tmp_path):
    from worldtrace_cli.cli import main
    from worldtrace_cli.continuation.mind import lcm_scores, read_result, write_loopworld_clip
    from worldtrace_cli.jobs.mind import run_mind, score_submission
    from worldtrace_cli.outputs import read_video_frames

    data = tmp_path / "MIND-Data"
    clip = write_loopworld_clip(data / "1st_data" / "test" / "mem_test" / "loop", 4,
                                ROOT / "trajectories" / "look_back.yaml", 2, chunks=4)
    out = run_mind([clip.folder], ["landmark"], tmp_path / "out", preset="loopworld", device="cpu", dtype="fp32",
                   eval_size="preset")
    video = tmp_path / "out" / "submission" / "worldtrace-landmark" / "1st_data" / "mem_test" / "loop" / "video.mp4"
    pred = read_video_frames(video)
    assert len(pred) == clip.total_time - clip.mark_time  # the predicted frames only
    doc = read_result(out["results"][0])
    entry = doc["data"][0]
    assert doc["video_max_time"] is None and entry["error"] is None and entry["sample_frames"] == len(pred)
    assert entry["lcm"]["length"] == len(pred) and entry["lcm"]["avg_lpips"] is None and "lpips" in entry["not_computed"]
    truth = read_video_frames(clip.video, indices=range(clip.mark_time, clip.total_time))
    direct = lcm_scores(pred, truth, (96, 176))
    assert entry["lcm"]["avg_psnr"] == pytest.approx(direct["avg_psnr"])
    rescored = read_result(score_submission(video.parents[3], data, tmp_path / "again.json", "native"))
    assert rescored["data"][0]["lcm"]["avg_psnr"] == pytest.approx(direct["avg_psnr"])
    res = CliRunner().invoke(main, ["mind", "show", str(tmp_path / "again.json")])
    assert res.exit_code == 0 and "mem_test" in res.output and f"{direct['avg_psnr']:.2f}" in res.output
    assert lcm_scores(truth[:2], truth[:2], (72, 128))["avg_psnr"] == 100.0  # identical frames: MIND's cap
