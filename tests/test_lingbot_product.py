"""LingBot-World in the product: preset dispatch, ``generate --preset lingbot-tiny`` end to end
(CliRunner, CPU), the camera the trajectory's actions drive (shapes and the OpenCV convention of the
spec's poses.npy), pose files from a trajectory, one-line errors for bad poses / intrinsics, and
``worldtrace parity`` replaying the fixtures through the product's rollout, a stopped run resumed to the
same frames, and a LoopBench sweep with report."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from worldtrace_cli.config import RunConfig, default_cache, load_preset
from worldtrace_cli.errors import InputError
from worldtrace_cli.model.lingbot.inputs import LingbotInputs
from worldtrace_cli.outputs import probe_video, read_jsonl
from worldtrace_cli.trajectory import load_trajectory, plan_actions

from conftest import invoke, one_line_error, skip_without_ffmpeg

ROOT = Path(__file__).parent.parent
ABA = ROOT / "trajectories" / "aba.yaml"
DATA = ROOT / "tests" / "data" / "lingbot"


@pytest.fixture(scope="module")
def pipe():
    from worldtrace_cli.engine.pipeline import Pipeline

    return Pipeline.from_preset(load_preset("lingbot-tiny"), device="cpu")


def test_presets_declare_their_architecture_and_official_cache():
    tiny, fast, mg2 = load_preset("lingbot-tiny"), load_preset("lingbot-fast"), load_preset("tiny")
    assert (tiny.architecture, fast.architecture, mg2.architecture) == ("lingbot", "lingbot", "mg2")
    assert (tiny.frames_per_chunk, fast.frames_per_chunk, fast.dit.num_layers) == (4, 4, 40)
    assert default_cache(tiny) == {"cache": "sink", "budget": 14, "sink_frames": 6, "positions": "actual"}
    assert default_cache(mg2) == {"cache": "sliding"}


def test_bad_architecture_and_window_are_one_line_errors(tmp_path):
    text = (ROOT / "worldtrace_cli" / "presets" / "lingbot-tiny.yaml").read_text()
    (tmp_path / "a.yaml").write_text(text.replace("architecture: lingbot", "architecture: sora"))
    (tmp_path / "w.yaml").write_text(text.replace("local_attn_size: 18", "local_attn_size: 10"))
    with pytest.raises(InputError, match="architecture: must be one of mg2, lingbot"):
        load_preset(str(tmp_path / "a.yaml"))
    with pytest.raises(InputError, match="local_attn_size 10 must exceed sink_size 6"):
        load_preset(str(tmp_path / "w.yaml"))


def test_from_preset_dispatches_on_architecture(pipe):
    from worldtrace_cli.engine.lingbot import LingbotPipeline
    from worldtrace_cli.model.lingbot.dit import LingbotDiT

    assert isinstance(pipe, LingbotPipeline) and isinstance(pipe.world.dit, LingbotDiT)
    assert (pipe.frames_per_chunk, pipe.latent_hw, pipe.default_budget, pipe.window) == (4, (12, 22), 14, 18)


def test_actions_drive_the_camera_in_the_spec_convention(pipe):
    """aba's forward walk, then a right pan: the motion model's poses, one per pixel frame, become
    camera-to-world matrices (OpenCV: z forward, x right); latent frame k takes pixel frame 4k; each
    chunk's request carries the poses so far and the streaming camera turns them into the chunk's
    camera, a forward latent frame one unit along the previous camera's +z."""
    from worldtrace_cli.engine.feed import ConditioningFeed
    from worldtrace_cli.model.lingbot.camera import StreamingCamera
    from worldtrace_cli.world.motion import camera_to_world, frame_poses, latent_frame_poses

    plan = plan_actions(load_trajectory(ABA), 2, frames_per_chunk=4)
    assert plan.num_frames == 29 and plan.keyboard.shape == (29, 4)
    feed = ConditioningFeed(plan, camera=True)
    first, second = feed.request(0), feed.request(1)
    assert first.poses.shape == (4, 4, 4) and second.poses.shape == (8, 4, 4)
    want = camera_to_world(latent_frame_poses(frame_poses("universal", plan.keyboard, plan.mouse), 8)).numpy()
    np.testing.assert_allclose(second.poses.numpy(), want, atol=1e-12)
    np.testing.assert_array_equal(first.poses.numpy(), second.poses[:4].numpy())  # causal: later rows change nothing
    camera = pipe.camera(29, LingbotInputs())
    assert isinstance(camera, StreamingCamera)
    t = camera.motion(second.poses.numpy(), 0, 8)[1:, :3, 3]  # walking forward: unit steps along +z
    np.testing.assert_allclose(t, np.tile([0.0, 0.0, 1.0], (7, 1)), atol=1e-9)
    assert tuple(camera.chunk(second.poses.numpy(), 4, 4).shape) == (1, 384, 4, 12, 22)
    mouse = torch.zeros(29, 2)
    mouse[:, 1] = 0.1  # camera_r: yaw right
    pan = ConditioningFeed(plan_actions(load_trajectory(ABA), 2, frames_per_chunk=4), camera=True)
    pan.plan.keyboard, pan.plan.mouse = torch.zeros(29, 4), mouse
    b = camera.motion(pan.request(1).poses.numpy(), 0, 8)
    forward = b[1, :3, :3] @ np.array([0.0, 0.0, 1.0])
    assert forward[0] > 0.1 and abs(forward[1]) < 1e-9  # the new view direction turns towards +x (right)


@pytest.mark.slow
def test_generate_lingbot_tiny_writes_the_usual_run_folder(tmp_path, one_thread, valid):
    out = tmp_path / "run"
    result = invoke("generate", "--no-progress", "--preset", "lingbot-tiny", ABA, "--cache", "landmark",
                    "--chunks", "2", "--prompt", "a quiet street", "-o", out)
    assert result.exit_code == 0, result.output
    assert {"video.mp4", "chunks.jsonl", "summary.json", "cache_timeline.png"} <= {p.name for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["config"]["prompt"] == "a quiet street"
    assert summary["totals"]["pixel_frames"] == 29 and summary["totals"]["latent_frames"] == 8
    assert summary["cache"]["cache"] == "landmark" and summary["cache"]["trained_offset"] == 17
    records = read_jsonl(out / "chunks.jsonl")
    assert [r["latent_frames"] for r in records] == [[0, 4], [4, 8]]
    assert [r["pixel_frames"] for r in records] == [[0, 13], [13, 29]]
    assert records[1]["cache"]["slots"][-1]["frames"][-1] == [2, 3]  # the newest verbatim frames 2, 3
    valid(out / "chunks.jsonl", "chunk-record")
    valid(summary, "summary")
    assert probe_video(out / "video.mp4")["frames"] == 29
    # `worldtrace metrics` groups TempSSIM by LingBot's chunks (13 + 16 pixel frames), as generate did
    result = invoke("metrics", out, "--level", "fast")
    assert result.exit_code == 0, result.output
    offline = json.loads((out / "metrics.json").read_text())["temp_ssim"]["per_chunk"]
    assert offline == pytest.approx([r["metrics"]["temp_ssim"] for r in records], abs=0.05)  # from the lossy MP4


@pytest.mark.gpu
def test_lingbot_tiny_on_cuda_draws_the_cpu_frames(tmp_path, one_thread):
    """LingBot-World's rollout on CUDA (never run there before): generate in float32 on CUDA gives the
    CPU's frames (same noise, drawn on the CPU; TF32 convolutions aside) and the same cache slots."""
    from worldtrace_cli.outputs import read_video_frames

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    skip_without_ffmpeg()
    frames, slots = {}, {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        result = invoke("generate", "--no-progress", "--preset", "lingbot-tiny", ABA, "--cache", "field", "--chunks", "3",
                        "--device", device, "--dtype", "fp32", "--seed", "0", "-o", out)
        assert result.exit_code == 0, result.output
        frames[device] = read_video_frames(out / "video.mp4").astype(np.float32)
        slots[device] = [r["cache"]["slots"] for r in read_jsonl(out / "chunks.jsonl")]
    assert frames["cuda"].shape == frames["cpu"].shape and slots["cuda"] == slots["cpu"]
    assert np.abs(frames["cuda"] - frames["cpu"]).mean() < 2.0  # of 255, through the same lossy H.264


@pytest.mark.slow
def test_a_stopped_lingbot_run_resumes_to_the_same_frames(tmp_path, one_thread, valid):
    """Issue 12: LingBot resume was checked by hand only. A lingbot-tiny run through a pose-retrieval
    writer, stopped with SIGINT after its second chunk (a real process), resumes (writer bank, camera
    and text conditioning rebuilt) to exactly the frames of an uninterrupted run."""
    import signal
    import subprocess
    import sys
    import time

    args = ["generate", str(ABA), "--preset", "lingbot-tiny", "--cache", "retrieval", "--chunks", "4",
            "--save-every", "1", "--prompt", "a quiet street", "--threads", "1", "--no-progress"]
    assert invoke(*args, "-o", tmp_path / "ref").exit_code == 0
    reference = [r["frames_sha256"] for r in read_jsonl(tmp_path / "ref" / "chunks.jsonl")]
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", *args, "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not ((out / "chunks.jsonl").exists() and len(read_jsonl(out / "chunks.jsonl")) >= 2):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    done = len(read_jsonl(out / "chunks.jsonl"))
    assert proc.returncode == 130 and "--resume" in err and done < 4, err
    result = invoke("generate", "--resume", out, "--no-progress")
    assert result.exit_code == 0, result.output
    assert [r["frames_sha256"] for r in read_jsonl(out / "chunks.jsonl")] == reference
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["resolved"]["resumed_at_chunk"] == done
    assert summary["config"]["prompt"] == "a quiet street"
    valid(summary, "summary")
    assert probe_video(out / "video.mp4")["frames"] == 61


@pytest.mark.slow
def test_loopbench_runs_and_reports_on_lingbot_tiny(tmp_path, one_thread, valid):
    """Issue 12: loopbench takes the LingBot presets unchanged (a job folder per cell, LingBot's
    4-frame chunks, the report validating against its schema)."""
    image = ROOT / "assets" / "images" / "mg2_universal_0000.png"
    out = tmp_path / "lb"
    result = invoke("loopbench", "run", "--preset", "lingbot-tiny", "--configs", "aba", "--caches", "sink,retrieval",
                    "--images", image, "--seeds", "0", "--chunks", "2", "--threads", "1", "-o", out)
    assert result.exit_code == 0, result.output
    for cache in ("sink", "retrieval"):
        summary = json.loads((out / "aba" / cache / image.stem / "seed0" / "summary.json").read_text())
        assert summary["status"] == "complete" and summary["config"]["preset"]["architecture"] == "lingbot"
        assert summary["totals"]["latent_frames"] == 8 and summary["cache"]["trained_offset"] == 17
    result = invoke("loopbench", "report", out)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.json").read_text())
    valid(data, "loopbench-report")
    assert sorted(r["cache"] for r in data["rows"]) == ["retrieval", "sink"]
    assert all(r["chunks"] == 2 and r["temp_ssim"] is not None for r in data["rows"])


def _poses(n=40):
    p = np.tile(np.eye(4, dtype=np.float32), (n, 1, 1))
    p[:, 2, 3] = np.arange(n) * 0.1
    return p


@pytest.mark.parametrize("bad, message", [
    (np.zeros((40, 3, 4), np.float32), r"expected camera-to-world poses of shape \[N, 4, 4\], got \[40, 3, 4\]"),
    ("nan", "row 5 contains NaN or inf"),
    ("scaled", "row 0 rotation is not rigid"),
])
def test_bad_poses_are_one_line_errors_before_the_model_loads(tmp_path, bad, message):
    poses = _poses()
    if isinstance(bad, str) and bad == "nan":
        poses[5, 0, 3] = np.nan
    elif isinstance(bad, str):
        poses[:, :3, :3] *= 1.5
    else:
        poses = bad
    np.save(tmp_path / "poses.npy", poses)
    line = one_line_error(invoke("generate", "--preset", "lingbot-tiny", ABA, "--poses", tmp_path / "poses.npy",
                                 "-o", tmp_path / "out"))
    assert "poses.npy" in line and re.search(message, line), line
    assert not (tmp_path / "out").exists()


def test_bad_intrinsics_too_few_poses_and_mg2_flags_are_one_line_errors(tmp_path):
    np.save(tmp_path / "k.npy", np.array([[-420.0, 418.0, 415.5, 240.2]]))
    np.save(tmp_path / "short.npy", _poses(20))
    line = one_line_error(invoke("generate", "--preset", "lingbot-tiny", ABA, "--intrinsics", tmp_path / "k.npy"))
    assert "k.npy: row 0 has a non-positive focal length" in line
    line = one_line_error(invoke("generate", "--preset", "lingbot-tiny", ABA, "--chunks", "2", "--poses",
                                 tmp_path / "short.npy", "-o", tmp_path / "o"))
    assert "20 poses, 2 chunks need one per pixel frame (29): use --chunks 1 or fewer" in line
    line = one_line_error(invoke("generate", "--preset", "tiny", ABA, "--poses", tmp_path / "short.npy"))
    assert "--poses: preset tiny (Matrix-Game-2.0) takes no camera files; only LingBot-World presets do" in line


def test_trajectory_points_to_lingbot_pose_files(tmp_path):
    from worldtrace_cli.jobs.inputs import prepare_inputs

    np.save(tmp_path / "poses.npy", _poses(40))
    np.save(tmp_path / "intrinsics.npy", np.array([[420.0, 418.0, 415.5, 240.2]] * 2))
    text = ABA.read_text().replace("image: ../assets", f"image: {ROOT}/assets")
    (tmp_path / "t.yaml").write_text(text + "prompt: a loop\nposes: poses.npy\nintrinsics: intrinsics.npy\n")
    cfg = RunConfig(preset=load_preset("lingbot-tiny"), trajectory=tmp_path / "t.yaml", output=tmp_path / "o",
                    chunks=2)
    inputs = prepare_inputs(cfg)
    assert inputs.camera.prompt == "a loop" and inputs.camera.poses.shape == (40, 4, 4)
    assert inputs.camera.intrinsics.shape == (2, 4) and "poses_sha256" in inputs.hashes
    assert inputs.plan.frames_per_chunk == 4 and inputs.plan.num_frames == 29


@pytest.mark.slow
def test_parity_command_replays_the_fixtures_through_the_product_rollout(one_thread):
    result = invoke("parity", DATA)
    assert result.exit_code == 0, result.output
    lines = dict(ln.split(": ") for ln in result.output.splitlines() if ": max_abs_diff=" in ln)
    assert set(lines) == {f"{v}/{k}" for v in ("main", "nosink_la10", "global") for k in ("x0", "latents")}
    assert float(result.output.strip().splitlines()[-1].split("=")[1]) <= 1e-4


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_lingbot_replays_the_fixtures(one_thread):
    """Issue 12: --compile was refused for LingBot. The compiled blocks (attention_inputs,
    block_outputs) replay the official fixtures within the parity tolerance (generate and parity
    apply it through the same configure_speed)."""
    import torch._dynamo

    torch._dynamo.reset()
    result = invoke("parity", DATA, "--compile", "default")
    assert result.exit_code == 0, result.output
    assert float(result.output.strip().splitlines()[-1].split("=")[1]) <= 1e-4


def test_missing_or_wrong_checkpoint_files_are_one_line_errors(tmp_path, monkeypatch):
    import shutil

    from worldtrace_cli.model import layout

    monkeypatch.setattr(layout, "physical_memory_bytes", lambda: 2**40)  # lingbot-fast fits: reach the file checks

    line = one_line_error(invoke("generate", "--preset", "lingbot-fast", ABA, "-o", tmp_path / "a"))
    assert "needs --checkpoint DIR" in line
    line = one_line_error(invoke("generate", "--preset", "lingbot-fast", ABA, "--checkpoint", tmp_path,
                                 "-o", tmp_path / "b"), 3)
    assert ("missing transformers, Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth (or text_encoder/), "
            "google/umt5-xxl" in line)
    (tmp_path / "transformers").mkdir()
    shutil.copy(DATA / "tiny_config.json", tmp_path / "transformers" / "config.json")
    shutil.copy(DATA / "tiny_weights.safetensors", tmp_path / "transformers")
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    (tmp_path / "text_encoder").mkdir()
    (tmp_path / "google" / "umt5-xxl").mkdir(parents=True)
    line = one_line_error(invoke("generate", "--preset", "lingbot-fast", ABA, "--checkpoint", tmp_path,
                                 "-o", tmp_path / "c"), 3)
    assert "transformers/config.json: does not describe preset lingbot-fast's model" in line


def test_checkpoint_folder_takes_the_release_pth_or_an_hf_text_encoder_folder(tmp_path):
    """The release's umT5 .pth is the preset's file; a diffusers-style text_encoder/ stands in for it."""
    from worldtrace_cli.model.lingbot.world import checkpoint_paths

    preset = load_preset("lingbot-fast")
    for rel in ("transformers", "google/umt5-xxl", "text_encoder"):
        (tmp_path / rel).mkdir(parents=True)
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    assert checkpoint_paths(preset, tmp_path)["text_encoder"] == tmp_path / "text_encoder"
    (tmp_path / "models_t5_umt5-xxl-enc-bf16.pth").write_bytes(b"")
    assert checkpoint_paths(preset, tmp_path)["text_encoder"] == tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"


# -- LingBot-World v2 1.3B (issue 66): the preset, its checkpoint folder, every writer and face on its tiny ---------
V2 = "lingbot-v2-1.3b"
V2_TINY = "lingbot-v2-1.3b-tiny"
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"


def test_the_1_3b_preset_has_the_release_sizes_and_its_users_cache():
    """The sizes of the preset's header (dim 1536, ffn 8960, 30 layers, in_dim 36; 12 heads of 128 assumed) build
    the module tree whose parameter count is the release's reported 1,709,502,016; the cache is window 18 / sink 6
    (sink, 14 past slots); the config.json shipped for assembling a folder describes the same model; the tiny
    variant keeps the head dim, the sampler and the cache."""
    from worldtrace_cli.model.lingbot.config import LingbotConfig
    from worldtrace_cli.model.lingbot.dit import LingbotDiT
    from worldtrace_cli.model.weights import read_json

    preset, tiny, fast = load_preset(V2), load_preset(V2_TINY), load_preset("lingbot-fast")
    d = preset.dit
    assert (d.dim, d.ffn_dim, d.num_heads, d.head_dim, d.num_layers, d.in_dim, d.model_type) == \
        (1536, 8960, 12, 128, 30, 36, "i2v")
    with torch.device("meta"):
        assert sum(p.numel() for p in LingbotDiT(d).parameters()) == 1_709_502_016
    assert default_cache(preset) == default_cache(tiny) == default_cache(fast)
    assert default_cache(preset) == {"cache": "sink", "budget": 14, "sink_frames": 6, "positions": "actual"}
    assert (preset.height, preset.width, preset.fps, preset.frames_per_chunk) == (464, 832, 16, 4)
    assert preset.denoising_steps == tiny.denoising_steps == fast.denoising_steps
    assert preset.files == fast.files and preset.weights == "checkpoint" and tiny.weights == "random"
    shipped = ROOT / "worldtrace_cli" / "model" / "configs" / "lingbot_v2_1.3b_dit" / "config.json"
    assert LingbotConfig.from_dict(read_json(shipped)) == preset.dit
    assert tiny.dit.head_dim == 128 and tiny.dit.ffn_dim / tiny.dit.dim == 6 and "12 heads assumed" in preset.description


def test_the_1_3b_checkpoint_layout_refusals_are_one_line(tmp_path, monkeypatch):
    """As for the 14B: no folder, an empty one, the release as downloaded (shards at its root, its index as
    model.safetensors.index.json, no config.json), a transformers/ without config.json, and one whose
    config.json describes another model: each one line naming what is missing or wrong (exit 3 for files)."""
    from worldtrace_cli.model import layout

    monkeypatch.setattr(layout, "physical_memory_bytes", lambda: 2**40)  # reach the file checks on any machine
    line = one_line_error(invoke("generate", "--preset", V2, ABA, "-o", tmp_path / "a"))
    assert f"preset {V2} needs --checkpoint DIR" in line
    missing = ("missing transformers, Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth (or text_encoder/), "
               "google/umt5-xxl")
    assert missing in one_line_error(invoke("generate", "--preset", V2, ABA, "--checkpoint", tmp_path, "-o",
                                            tmp_path / "b"), 3)
    release = tmp_path / "release"  # robbyant/lingbot-world-v2-1.3b-causal-fast as it is downloaded
    release.mkdir()
    shutil.copy(DATA / "tiny_weights.safetensors", release / "model-00001-of-00001.safetensors")
    (release / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"patch_embedding.weight": "model-00001-of-00001.safetensors"}}))
    assert missing in one_line_error(invoke("generate", "--preset", V2, ABA, "--checkpoint", release, "-o",
                                            tmp_path / "c"), 3)
    folder = tmp_path / "assembled"
    (folder / "transformers").mkdir(parents=True)
    shutil.copy(DATA / "tiny_weights.safetensors", folder / "transformers")
    (folder / "Wan2.1_VAE.pth").write_bytes(b"")
    (folder / "text_encoder").mkdir()
    (folder / "google" / "umt5-xxl").mkdir(parents=True)
    line = one_line_error(invoke("generate", "--preset", V2, ABA, "--checkpoint", folder, "-o", tmp_path / "d"), 3)
    assert "transformers/config.json: file not found" in line
    shutil.copy(DATA / "tiny_config.json", folder / "transformers" / "config.json")
    line = one_line_error(invoke("generate", "--preset", V2, ABA, "--checkpoint", folder, "-o", tmp_path / "e"), 3)
    assert f"transformers/config.json: does not describe preset {V2}'s model" in line


@pytest.mark.slow
def test_every_writer_and_face_runs_on_the_1_3b_tiny(tmp_path, one_thread, valid):
    """generate (its own cache), compare over a writer of each way to hold the past, a loopbench cell and a
    live session on lingbot-v2-1.3b-tiny: each completes with the 1.3B's chunk layout (13 + 16 pixel frames).
    Every registered writer runs through compare on MG2's tiny (test_cli.py); the writers read the layout
    (frames per chunk, tokens per frame) from the one cache geometry, so here one of each kind: a window
    (sliding), a growing cache (full), summary slots (field), landmarks, compressed slots (worldkv), a mix."""
    import worldtrace_cli as wt

    skip_without_ffmpeg()
    result = invoke("generate", "--no-progress", "--preset", V2_TINY, ABA, "--chunks", "2", "-o", tmp_path / "g")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["cache"]["cache"] == "sink" and summary["totals"]["pixel_frames"] == 29
    valid(summary, "summary")
    specs = ["sliding", "full", "field", "landmark", "worldkv", "mixed:2"]
    result = invoke("compare", ABA, "--preset", V2_TINY, "--caches", ",".join(specs), "--chunks", "2",
                    "--no-progress", "-o", tmp_path / "c")
    assert result.exit_code == 0, result.output
    runs = {s["config"]["memory"]["cache"]: s for s in
            (json.loads(p.read_text()) for p in (tmp_path / "c").rglob("summary.json"))}
    assert set(runs) == set(specs)
    assert all(s["status"] == "complete" and s["totals"]["latent_frames"] == 8 for s in runs.values())
    result = invoke("loopbench", "run", "--preset", V2_TINY, "--configs", "aba", "--caches", "landmark",
                    "--images", IMAGE, "--seeds", "0", "--chunks", "2", "--threads", "1", "-o", tmp_path / "lb")
    assert result.exit_code == 0, result.output
    with wt.open(V2_TINY, image=IMAGE, prompt="a plaza", cache="field", device="cpu") as s:
        records = [s.step(a).record for a in ("forward", "camera_l")]
    assert [r["pixel_frames"] for r in records] == [[0, 13], [13, 29]]


def _card_between(name: str, chunks: int) -> float:
    """GB of a card (the margin of generate's check included) that holds ``name``'s run with fp8 weights and not
    in bf16, by the plan a CPU run with --device-gb makes (bf16, a random-weights run's text encoder)."""
    from worldtrace_cli.config import memory_config
    from worldtrace_cli.engine.memory_plan import plan_memory
    from worldtrace_cli.jobs.bench_memory import HEADROOM, RESERVE_GB

    preset = load_preset(name)
    memory = memory_config(preset=preset, **default_cache(preset))
    need = [plan_memory(preset, memory, "text", w, torch.bfloat16, chunks, False).peak / 1e9 * HEADROOM + RESERVE_GB
            for w in ("auto", "fp8")]
    assert need[1] < need[0]
    return (need[0] + need[1]) / 2


@pytest.mark.slow
def test_weights_dtype_fit_chooses_fp8_only_when_bf16_does_not_fit_the_card(tmp_path, one_thread):
    """Issue 66 part 3 on a CPU, through the plan: ``--device-gb`` names a card this machine lacks; with
    ``--weights-dtype fit`` a card between the fp8 and the bf16 plan takes fp8 (one log line says so, the run
    goes on here with it and summary.json's config records it), a larger one keeps auto (the run's dtype), a
    card nothing fits is refused naming what would, and without a card fit is auto."""
    skip_without_ffmpeg()
    card = _card_between(V2_TINY, 2)
    base = ["generate", "--no-progress", "--preset", V2_TINY, ABA, "--chunks", "2", "--offload", "text",
            "--weights-dtype", "fit"]
    result = invoke(*base, "--device-gb", f"{card:.6f}", "-o", tmp_path / "fp8")
    assert result.exit_code == 0, result.output
    chose = [ln for ln in result.output.splitlines() if "GPU memory: chose" in ln]
    assert len(chose) == 1 and "--offload text --weights-dtype fp8" in chose[0] and "(--device-gb)" in chose[0], chose
    assert "--offload text" in chose[0].split("(")[-1] and "does not fit" in chose[0]  # why: the bf16 plan's miss
    config = json.loads((tmp_path / "fp8" / "summary.json").read_text())["config"]
    assert (config["weights_dtype"], config["offload"]) == ("fp8", "text")
    line = one_line_error(invoke(*base[:-4], "--weights-dtype", "fit", "--device-gb", "1.0", "-o", tmp_path / "none"))
    assert "GPU memory: the plan of" in line and "a 1 GB card (--device-gb) has 1.0 GB" in line, line
    assert not (tmp_path / "none").exists()
    from pathlib import Path as P

    from worldtrace_cli.jobs.bench_memory import fit_run, planned_card

    cfg = RunConfig(preset=load_preset(V2_TINY), trajectory=P("t"), output=P("o"), weights_dtype="fit", offload="text")
    with planned_card(80):  # generate --device-gb 80 makes this choice before the weights load (the run above)
        assert fit_run(cfg, 2).weights_dtype == "auto"
    cfg = RunConfig(preset=load_preset(V2_TINY), trajectory=P("t"), output=P("o"), weights_dtype="fit", offload="auto")
    assert (fit_run(cfg, 2).weights_dtype, fit_run(cfg, 2).offload) == ("auto", "text")  # no card: nothing to plan


def test_bench_memory_says_which_sizes_the_1_3b_plan_assumes():
    """The full-size plan names the sizes it planned and the preset's note on the one not in the release's shapes."""
    result = invoke("bench", "memory", "--preset", V2, "--random-weights", "--chunks", "2", "--json")
    assert result.exit_code == 0, result.output
    model = json.loads(result.output[result.output.index("{"):])["model"]
    assert model["dit"] == {"dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30, "in_dim": 36}
    assert model["dit_parameters"] == 1_709_502_016 and "12 heads assumed" in model["description"]
