"""The procedural world: deterministic scenes and renders, the one motion model, ground truth,
GT metrics and `worldtrace world render`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from worldtrace_cli.metrics import PSNR_CAP_DB, dead_reckon, gt_scores, gt_summary
from worldtrace_cli.trajectory import parse_trajectory, plan_actions
from worldtrace_cli.world.motion import frame_poses, integrate, plan_frame_poses, pose_steps
from worldtrace_cli.world.render import render_frames, render_view
from worldtrace_cli.world.scene import EYE_HEIGHT, PATTERNS, make_world
from worldtrace_cli.world.truth import GroundTruth


def plan_of(*segments: str):
    return plan_actions(parse_trajectory("mode: universal\nsegments:\n" + "".join(f"  - {s}\n" for s in segments)))


def test_a_seed_is_a_world():
    a, b, c = make_world.__wrapped__(7), make_world.__wrapped__(7), make_world.__wrapped__(8)
    for name in ("solid", "color_a", "color_b", "pattern", "frequency", "floor_a", "sky_top"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert not np.array_equal(a.color_a, c.color_a) and not np.array_equal(a.solid, c.solid)
    assert a.solid.dtype == bool and a.pattern.max() < len(PATTERNS)
    # the plaza around the start and the +y corridor are open ground; the border is walled
    centres = np.arange(a.cells) - a.half + 0.5
    near = np.hypot(*np.meshgrid(centres, centres, indexing="ij")) < 5.0
    assert not a.solid[near].any()
    i, j = a.cell_of(0.0, 0.0)
    assert not a.solid[i - 1:i + 1, j:j + 40].any()
    assert a.solid[0].all() and a.solid[:, -1].all()
    with pytest.raises(ValueError):
        make_world(-1)


def test_renders_are_deterministic_and_show_the_world():
    w = make_world(3)
    f1 = render_view(w, (0.0, 0.0, 0.0, 0.0), 96, 176)
    assert f1.dtype == np.uint8 and f1.shape == (96, 176, 3)
    assert np.array_equal(f1, render_view(make_world.__wrapped__(3), (0.0, 0.0, 0.0, 0.0), 96, 176))
    other_world = render_view(make_world(4), (0.0, 0.0, 0.0, 0.0), 96, 176)
    behind = render_view(w, (0.0, 0.0, 180.0, 0.0), 96, 176)
    assert np.abs(f1.astype(int) - other_world).mean() > 10   # another world looks different
    assert np.abs(f1.astype(int) - behind).mean() > 10        # so does the other side of this one
    # sky above the horizon, ground below; looking up moves the horizon down (more sky)
    assert f1[0].astype(float).std(axis=0).max() < 1.0 < f1[60:].reshape(-1, 3).astype(float).std(axis=0).max()
    up = render_view(w, (0.0, 0.0, 0.0, 30.0), 96, 176)
    sky = lambda img: (np.abs(img.astype(int) - img[0, 0]).sum(-1) < 20).mean()  # noqa: E731
    assert sky(up) > sky(f1)
    # a small step forward changes the view a little, a turn of 90 degrees a lot
    step = render_view(w, (0.0, 1 / 12, 0.0, 0.0), 96, 176)
    turn = render_view(w, (0.0, 0.0, 90.0, 0.0), 96, 176)
    assert np.abs(f1.astype(int) - step).mean() < np.abs(f1.astype(int) - turn).mean()
    frames = render_frames(w, torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 90.0, 0.0]]), 96, 176)
    assert np.array_equal(frames[0], f1) and np.array_equal(frames[1], turn)
    with pytest.raises(ValueError):
        render_view(w, (0.0, float("nan"), 0.0, 0.0), 96, 176)
    assert EYE_HEIGHT > 0


def test_walking_through_a_building_sees_out_of_it():
    w = make_world(3)
    i, j = np.argwhere(w.solid[10:-10, 10:-10])[0] + 10
    inside = (i - w.half + 0.5, j - w.half + 0.5, 0.0, 0.0)
    img = render_view(w, inside, 48, 88)
    assert img.std() > 5  # not one flat wall colour


def test_motion_model_calibration():
    # MG2's camera step 0.1 turns 45 degrees per chunk; walking covers 1 unit per chunk
    plan = plan_of("{action: camera_r, chunks: 2}", "{action: forward, chunks: 1}")
    poses = dead_reckon(plan)  # pose after each row
    assert poses[20, 2].item() == pytest.approx(21 * 3.75)    # 21 rows of yaw 0.1
    assert poses[-1, :2].tolist() == pytest.approx([12 / 12 * np.sin(np.deg2rad(78.75)),
                                                     12 / 12 * np.cos(np.deg2rad(78.75))])
    # pixel frame k shows the pose after rows 0..k-1: frame 0 is the start (the conditioning image)
    frames = plan_frame_poses(plan)
    assert frames[0].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert torch.equal(frames[1:], poses[:-1])
    # a start pose moves the whole path; steps integrate in the camera frame
    steps = pose_steps("universal", plan.keyboard, plan.mouse)
    moved = integrate(steps, torch.tensor([1.0, 2.0, 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(moved[:, :2] - poses[:, :2], torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert frame_poses("universal", plan.keyboard, plan.mouse).shape == (plan.num_frames, 4)


def test_ground_truth_and_gt_scores():
    plan = plan_of("{label: A, action: camera_r, chunks: 2}", "{label: B, action: camera_l, chunks: 2}", "{label: A}")
    truth = GroundTruth(5, plan, 48, 88)
    assert np.array_equal(truth.start_image(), render_view(make_world(5), (0, 0, 0, 0), 48, 88))
    frames = truth.frames(0, 9)
    assert frames.shape == (9, 48, 88, 3) and np.array_equal(frames[0], truth.start_image())
    same = gt_scores(frames, frames)
    assert same["psnr"] == [PSNR_CAP_DB] * 9 and same["ssim"] == pytest.approx([1.0] * 9)
    noisy = frames.astype(np.int16)
    noisy[..., 0] += np.where(np.arange(88) % 2 == 0, 4, -4).astype(np.int16)  # MSE = 16 / 3 exactly
    noisy = np.clip(noisy, 0, 255).astype(np.uint8)
    exact = (noisy.astype(float) - frames) ** 2
    want = 10 * np.log10(255**2 / exact.reshape(9, -1).mean(1))
    assert gt_scores(noisy, frames)["psnr"] == pytest.approx(want.tolist())
    assert gt_scores(frames[::-1].copy(), frames)["psnr"][0] < 30
    with pytest.raises(ValueError):
        gt_scores(frames[:2], frames[:3])
    with pytest.raises(ValueError):
        GroundTruth(0, plan_actions(parse_trajectory("mode: templerun\nsegments:\n  - {action: idle, chunks: 1}\n")),
                    48, 88)
    summary = gt_summary([30.0, 20.0, 10.0, 40.0], [0.9, 0.8, 0.7, 0.6], plan)
    assert summary["psnr"] == pytest.approx(25.0) and "detail" not in summary
    assert summary["return"]["chunks"] == [2, 3] and summary["return"]["psnr"] == pytest.approx(25.0)
    sums = [(4.0, 4.0), (1.0, 2.0), None, (0.3, 0.1)]  # (generated, true) detail per chunk; chunk 3 faces a wall
    summary = gt_summary([30.0, 20.0, 10.0, 40.0], [0.9, 0.8, 0.7, 0.6], plan, sums)
    assert summary["detail"] == pytest.approx(5.3 / 6.1)        # a ratio of sums: the wall weighs little
    assert summary["return"]["detail"] == pytest.approx(3.0)    # return chunks 2 (unknown) and 3


def test_gt_detail_says_how_much_of_the_picture_is_left():
    """GT detail: 1 for the truth itself, below 1 for a blurred copy, above 1 for added noise, 0 for
    a flat frame; detail exact on a known pattern; None against a flat truth."""
    from worldtrace_cli.metrics.scores import detail, detail_ratio

    plan = plan_of("{label: A, action: camera_r, chunks: 1}")
    frames = GroundTruth(3, plan, 48, 88).frames(0, 5)

    def ratio(x):
        scores = gt_scores(x, frames)
        return detail_ratio([(sum(scores["detail"]), sum(scores["detail_true"]))])

    blurred = torch.nn.functional.avg_pool2d(torch.from_numpy(frames).permute(0, 3, 1, 2).float(), 5, 1, 2,
                                             count_include_pad=False)
    blurred = blurred.round().clamp(0, 255).byte().permute(0, 2, 3, 1).contiguous().numpy()
    flat = np.broadcast_to(frames.reshape(5, -1, 3).mean(1).astype(np.uint8)[:, None, None], frames.shape).copy()
    rng = np.random.default_rng(0)
    noisy = np.clip(frames + rng.normal(0, 20, frames.shape), 0, 255).astype(np.uint8)
    assert ratio(frames) == pytest.approx(1.0) and 0.2 < ratio(blurred) < 0.8
    assert ratio(flat) == 0 and ratio(noisy) > 1.5
    assert np.mean(gt_scores(blurred, frames)["psnr"]) > np.mean(gt_scores(flat, frames)["psnr"])
    stripes = np.zeros((1, 4, 6, 3), np.uint8)
    stripes[:, :, ::2] = 90  # columns 0, 2, 4: 5 horizontal steps of 90 in every row, no vertical ones
    assert detail(stripes).tolist() == [pytest.approx(90.0)]
    assert detail_ratio([(1.0, 0.0)]) is None and detail_ratio([None]) is None


def test_world_render_command(tmp_path):
    from worldtrace_cli.cli import main

    traj = tmp_path / "t.yaml"
    traj.write_text("mode: universal\nsegments:\n  - {action: forward+camera_l, chunks: 2}\n")
    out = tmp_path / "gt"
    result = CliRunner().invoke(main, ["world", "render", str(traj), "--world-seed", "2", "-o", str(out),
                                       "--no-progress"])
    assert result.exit_code == 0, result.output
    from worldtrace_cli.outputs import read_video_frames

    video = read_video_frames(out / "video.mp4")
    poses = json.loads((out / "poses.json").read_text())
    assert video.shape == (21, 96, 176, 3) and len(poses["poses"]) == 21 and poses["world_seed"] == 2
    truth = render_view(make_world(2), poses["poses"][20], 96, 176)
    assert np.abs(video[20].astype(int) - truth).mean() < 6  # H.264 is lossy, not wrong
    bad = CliRunner().invoke(main, ["world", "render", str(tmp_path / "missing.yaml"), "-o", str(out)])
    assert bad.exit_code == 2 and "missing.yaml" in bad.output


def test_camera_to_world_follows_the_motion_model():
    """The cache contract's poses: OpenCV c2w matrices whose forward axis is the direction the motion
    model walks (W at yaw 0 goes +y, at yaw 90 goes +x), rigid, centred at the camera."""
    from worldtrace_cli.world.motion import camera_to_world, latent_frame_poses

    poses = torch.tensor([[0, 0, 0, 0], [1, 2, 90, 0], [0, 0, 0, 30], [3, -1, -45, -20]], dtype=torch.float64)
    c2w = camera_to_world(poses)
    rot = c2w[:, :3, :3]
    assert torch.allclose(rot.transpose(1, 2) @ rot, torch.eye(3, dtype=torch.float64).expand(4, 3, 3), atol=1e-12)
    assert torch.allclose(torch.linalg.det(rot), torch.ones(4, dtype=torch.float64))
    assert torch.allclose(c2w[0, :3, 2], torch.tensor([0.0, 1, 0], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(c2w[1, :3, 2], torch.tensor([1.0, 0, 0], dtype=torch.float64), atol=1e-12)
    assert torch.allclose(c2w[0, :3, 1], torch.tensor([0.0, 0, -1], dtype=torch.float64), atol=1e-12)  # y down
    assert c2w[2, 2, 2] > 0.49  # pitch up looks up
    assert c2w[1, :2, 3].tolist() == [1.0, 2.0] and c2w[:, 3].tolist() == [[0, 0, 0, 1]] * 4
    # walking forward one row moves the camera along its own forward axis
    keyboard = torch.zeros(13, 4)
    keyboard[:, 0] = 1
    mouse = torch.zeros(13, 2)
    mouse[:, 1] = 0.1
    pixel = frame_poses("universal", keyboard, mouse)
    latent = latent_frame_poses(pixel, 4)
    assert torch.equal(latent[0], pixel[0]) and torch.equal(latent[3], pixel[12])
    step = camera_to_world(pixel[1:2])[0, :3, 3] - camera_to_world(pixel[:1])[0, :3, 3]
    assert torch.allclose(step / step.norm(), camera_to_world(pixel[1:2])[0, :3, 2], atol=1e-9)  # yaw applies first


# the towers style (issue 47): drawn for what a small model can draw

def test_a_towers_world_is_solid_2x2_towers_off_the_plaza_and_corridor():
    from worldtrace_cli.world.scene import CORRIDOR_HALF_WIDTH, PLAZA_RADIUS, TOWER_HEIGHT

    a, b = make_world.__wrapped__(7, style="towers"), make_world.__wrapped__(7, style="towers")
    city = make_world(7)
    assert np.array_equal(a.solid, b.solid) and np.array_equal(a.color_a, b.color_a)
    assert a.style == "towers" and a.wall_height == TOWER_HEIGHT and not np.array_equal(a.solid, city.solid)
    inner = a.solid[2:-2, 2:-2]  # every tower is a whole aligned 2x2 block
    blocks = inner.reshape(inner.shape[0] // 2, 2, inner.shape[1] // 2, 2)
    assert np.array_equal(blocks.all(axis=(1, 3)), blocks.any(axis=(1, 3)))
    assert 0.08 < a.solid[1:-1, 1:-1].mean() < 0.2 < city.solid[1:-1, 1:-1].mean()  # fewer, larger objects
    centres = np.arange(a.cells) - a.half + 0.5
    cx, cy = np.meshgrid(centres, centres, indexing="ij")
    assert not a.solid[np.hypot(cx, cy) <= PLAZA_RADIUS].any()
    assert not a.solid[(np.abs(cx) < CORRIDOR_HALF_WIDTH) & (cy > -6) & (cy < 50)].any()
    assert np.array_equal(a.color_a, a.color_b) and np.array_equal(a.floor_a, a.floor_b)  # solid colours
    with pytest.raises(ValueError, match="world style"):
        make_world(7, style="castles")


def test_a_towers_sky_says_where_the_camera_looks():
    """The horizon's tint turns with heading and the sun stands at its heading: looking at it shows a
    pale warm disc at the image centre; the opposite way shows none (the world's towers cleared away
    here, so that none stands in front of the sun)."""
    from dataclasses import replace

    w = make_world(3, style="towers")
    open_sky = replace(w, solid=np.zeros_like(w.solid))
    yaw, elevation, _ = w.sun
    toward = render_view(open_sky, (0, 0, yaw, elevation), 96, 176).astype(int)
    away = render_view(open_sky, (0, 0, yaw + 180, elevation), 96, 176).astype(int)
    centre = toward[44:52, 84:92].mean((0, 1))
    assert np.abs(centre - [255, 237, 178]).max() < 3  # the sun
    assert np.abs(away[44:52, 84:92].mean((0, 1)) - [255, 237, 178]).max() > 30
    level = [render_view(w, (0, 0, a, 30), 96, 176)[60].astype(float).mean(0) for a in (0, 90, 180, 270)]
    assert min(np.abs(level[i] - level[j]).max() for i in range(4) for j in range(i + 1, 4)) > 8
    city = make_world(3)  # the city's sky has no heading: the same horizon all round (before the buildings)
    assert city.compass is None and city.sun is None


def test_a_towers_preset_scores_against_its_own_world(tmp_path):
    """A preset's ``world: towers`` reaches the ground truth (start image and true frames) and `world
    render`; training data record the style and their held-out clips follow it."""
    import yaml

    from worldtrace_cli.cli import main
    from worldtrace_cli.config import load_preset
    from worldtrace_cli.train.evaluate import data_world

    raw = yaml.safe_load(open("worldtrace_cli/presets/loopworld.yaml"))
    preset_file = tmp_path / "towers.yaml"
    preset_file.write_text(yaml.safe_dump({**raw, "world": "towers"}))
    preset = load_preset(str(preset_file))
    assert preset.world == "towers" and preset.has_world
    plan = plan_of("{action: camera_r, chunks: 2}")
    truth = GroundTruth(0, plan, 96, 176, preset.world)
    assert np.array_equal(truth.start_image(), render_view(make_world(0, style="towers"), truth.poses[0], 96, 176))
    assert not np.array_equal(truth.start_image(), GroundTruth(0, plan, 96, 176).start_image())
    out = CliRunner().invoke(main, ["world", "render", "trajectories/look_around.yaml", "--chunks", "1", "--preset",
                                    str(preset_file), "-o", str(tmp_path / "truth"), "--no-progress"])
    assert out.exit_code == 0, out.output
    assert json.loads((tmp_path / "truth" / "poses.json").read_text())["world"] == "towers"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "data.json").write_text(json.dumps({"mix": {"world": "towers"}}))
    assert data_world(tmp_path / "data") == "towers" and data_world(tmp_path) == "procedural"
