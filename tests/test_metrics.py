"""Metrics against independent computations; revisit pairing and dead reckoning on hand-made paths."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from pytorch_msssim import ssim as msssim_ssim

from worldtrace_cli.metrics import (
    clip_embeddings,
    dead_reckon,
    latent_diff,
    pac,
    pairs_from_poses,
    pairs_from_waypoints,
    revisit_pairs,
    scene_drift,
    summarise_run,
    temp_ssim,
)
from worldtrace_cli.trajectory import chunk_rows, parse_trajectory, plan_actions


def doc(*segments: str, mode: str = "universal") -> str:
    return f"mode: {mode}\nsegments:\n" + "".join(f"  - {s}\n" for s in segments)


def plan_of(*segments: str, mode: str = "universal"):
    return plan_actions(parse_trajectory(doc(*segments, mode=mode)))


def aba(out_chunks: int, labels: bool = True):
    a, b = ("label: A, ", "label: B, ") if labels else ("", "")
    end = ["{label: A}"] if labels else []
    return plan_of("{%saction: forward, chunks: %d}" % (a, out_chunks),
                   "{%saction: back, chunks: %d}" % (b, out_chunks), *end)


@pytest.fixture(scope="module")
def tower():
    from worldtrace_cli.model.image_encoder import build_clip_tower
    return build_clip_tower("tiny")


def random_video(t: int, h: int = 24, w: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- TempSSIM


def gaussian_ssim(x: np.ndarray, y: np.ndarray) -> float:
    """Wang et al. SSIM written out: 11-tap Gaussian (sigma 1.5), valid region, K = (0.01, 0.03),
    data range 1, mean over pixels then channels. x, y: float64 [H, W, 3] in [0, 1]."""
    g = np.exp(-((np.arange(11) - 5.0) ** 2) / (2 * 1.5**2))
    g /= g.sum()
    win = np.lib.stride_tricks.sliding_window_view

    def blur(a):
        return win(win(a, 11, axis=0) @ g, 11, axis=1) @ g

    c1, c2 = 0.01**2, 0.03**2
    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    smap = (2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(smap.mean(axis=(0, 1)).mean())


def test_temp_ssim_identical_frames_is_one():
    video = np.repeat(random_video(1), 6, axis=0)
    out = temp_ssim(video)
    assert len(out["pairs"]) == 5
    assert out["pairs"] == pytest.approx([1.0] * 5, abs=1e-6)
    assert out["mean"] == pytest.approx(1.0, abs=1e-6)


def test_temp_ssim_matches_independent_computations():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    shifted = np.roll(base, 2, axis=1)
    noisy = np.clip(base.astype(int) + rng.integers(-30, 31, base.shape), 0, 255).astype(np.uint8)
    video = np.stack([base, shifted, noisy, base])
    out = temp_ssim(torch.from_numpy(video))  # torch input is accepted too
    f = video.astype(np.float64) / 255.0
    by_hand = [gaussian_ssim(f[t - 1], f[t]) for t in range(1, 4)]
    t = torch.from_numpy(video).permute(0, 3, 1, 2).float() / 255.0
    direct = [float(msssim_ssim(t[i - 1:i], t[i:i + 1], data_range=1.0)) for i in range(1, 4)]
    assert out["pairs"] == pytest.approx(by_hand, abs=1e-5)
    assert out["pairs"] == pytest.approx(direct, abs=1e-6)
    assert max(out["pairs"]) < 0.99  # a shift or noise is visible
    assert temp_ssim(video, batch_size=1)["pairs"] == pytest.approx(out["pairs"], abs=1e-7)


def test_temp_ssim_groups_pairs_by_the_chunk_of_the_later_frame():
    # 3 chunks = 33 frames; only frame 9 (the first of chunk 1) differs, so both pairs that touch
    # it, (8, 9) and (9, 10), must land in chunk 1.
    video = np.repeat(random_video(1), 33, axis=0)
    video[9] = random_video(1, seed=5)[0]
    out = temp_ssim(video)
    assert len(out["pairs"]) == 32
    assert len(out["per_chunk"]) == 3
    assert out["per_chunk"][0] == pytest.approx(1.0, abs=1e-6)
    assert out["per_chunk"][2] == pytest.approx(1.0, abs=1e-6)
    assert out["per_chunk"][1] == pytest.approx(np.mean(out["pairs"][8:20]))
    assert out["per_chunk"][1] < 0.9
    assert out["mean"] == pytest.approx(np.mean(out["pairs"]))
    # LingBot-World's chunks (4 latent frames: 13 pixel frames, then 16 each): frame 9 is chunk 0's,
    # frame 13 the first of chunk 1
    lingbot = temp_ssim(video, frames_per_chunk=4)
    assert len(lingbot["per_chunk"]) == 3 and lingbot["per_chunk"][1] == pytest.approx(1.0, abs=1e-6)
    assert lingbot["per_chunk"][0] == pytest.approx(np.mean(out["pairs"][:12])) and lingbot["per_chunk"][0] < 0.95
    assert lingbot["per_chunk"][2] == pytest.approx(np.mean(out["pairs"][28:]))


def test_temp_ssim_edge_cases():
    assert temp_ssim(random_video(1)) == {"pairs": [], "per_chunk": [], "mean": None}
    with pytest.raises(ValueError, match="at least 11x11"):
        temp_ssim(random_video(3, h=10, w=32))
    with pytest.raises(ValueError, match=r"uint8 \[T, H, W, 3\]"):
        temp_ssim(random_video(3).astype(np.float32))


# --------------------------------------------------------------------------- CLIP metrics


def test_clip_embeddings_are_normalised_tower_outputs(tower):
    video = random_video(5)
    e = clip_embeddings(tower, video, batch_size=2)
    assert e.shape == (5, 32) and e.dtype == torch.float32
    assert e.norm(dim=1) == pytest.approx(torch.ones(5), abs=1e-6)
    raw = tower.image_embeds(torch.from_numpy(video).permute(0, 3, 1, 2).float() / 127.5 - 1.0)
    assert torch.allclose(e, raw / raw.norm(dim=1, keepdim=True), atol=1e-6)


def test_pac_uses_exactly_the_given_pairs(tower):
    video = random_video(3, seed=3)
    e = clip_embeddings(tower, video)
    assert pac(e, [(0, 0), (2, 2)])["mean"] == pytest.approx(1.0, abs=1e-6)
    raw = tower.image_embeds(torch.from_numpy(video).permute(0, 3, 1, 2).float() / 127.5 - 1.0)
    cos01 = float(torch.nn.functional.cosine_similarity(raw[0], raw[1], dim=0))
    cos12 = float(torch.nn.functional.cosine_similarity(raw[1], raw[2], dim=0))
    out = pac(e, [(0, 1), (1, 2)])
    assert out["pairs"] == 2
    assert out["per_pair"] == pytest.approx([cos01, cos12], abs=1e-5)
    assert out["mean"] == pytest.approx((cos01 + cos12) / 2, abs=1e-5)
    assert pac(e, []) == {"pairs": 0, "mean": None, "per_pair": []}


def test_scene_drift_of_a_constant_video_is_zero(tower):
    video = np.repeat(random_video(1), 33, axis=0)
    out = scene_drift(clip_embeddings(tower, video), num_chunks=3)
    assert out["per_chunk"][0] is None
    assert out["per_chunk"][1:] == pytest.approx([0.0, 0.0], abs=1e-6)


def test_scene_drift_closed_form():
    e = torch.zeros(33, 4)
    e[:9, 0] = 1.0  # chunk 0 -> x
    e[9:, 1] = 2.0  # chunks 1, 2 -> y (scale is normalised away)
    out = scene_drift(e, num_chunks=3)
    assert out["per_chunk"] == [None, pytest.approx(1.0), pytest.approx(0.0)]
    assert out["mean"] == pytest.approx(0.5)
    e[20] = torch.tensor([1.0, 0, 0, 0])  # the last row of chunk 1 (rows 9..20) points along x
    out = scene_drift(e, num_chunks=3)
    assert out["per_chunk"][1] == pytest.approx(1 - 1 / 122**0.5)  # mean (1/12, 11/12)
    assert out["per_chunk"][2] == pytest.approx(1 - 11 / 122**0.5)
    partial = scene_drift(e[:15], num_chunks=3)  # a killed run: chunk 2 has no frames
    assert len(partial["per_chunk"]) == 2


# --------------------------------------------------------------------------- LatentDiff


def test_latent_diff_closed_form():
    z0 = torch.randn(1, 16, 1, 4, 6)
    latents = torch.cat([(1 + t) * z0 for t in range(6)], dim=2)  # z_t = (1+t) z_0
    out = latent_diff(latents)
    expected = [1 / t for t in range(1, 6)]  # ||z_0|| / ||t z_0||
    assert out["pairs"] == pytest.approx(expected)
    assert out["per_chunk"] == pytest.approx([np.mean(expected[:2]), np.mean(expected[2:])])
    assert out["mean"] == pytest.approx(np.mean(expected))
    as_chunks = latent_diff([latents[:, :, :3], latents[:, :, 3:]])
    assert as_chunks["pairs"] == pytest.approx(expected)
    frozen = latent_diff(z0.repeat(1, 1, 4, 1, 1))
    assert frozen["mean"] == 0.0


# --------------------------------------------------------------------------- pairing


@pytest.mark.parametrize("L", [3, 8])
def test_aba_pairs_from_waypoints_and_poses(L):
    expected = [(i, 2 * L - 1 - i) for i in range(L)]
    labelled = aba(L)
    assert pairs_from_waypoints(labelled) == expected
    out = revisit_pairs(labelled)
    assert out["source"] == "waypoints" and out["chunk_pairs"] == expected
    unlabelled = aba(L, labels=False)
    assert pairs_from_poses(dead_reckon(unlabelled), unlabelled.num_chunks) == expected
    out = revisit_pairs(unlabelled)
    assert out["source"] == "poses" and out["chunk_pairs"] == expected


def test_frame_pairs_align_at_the_chunk_ends():
    out = revisit_pairs(aba(3))
    frames = out["frame_pairs"]
    (s5, e5), (s4, e4) = chunk_rows(5), chunk_rows(4)
    assert frames[:9] == [(k, s5 + 3 + k) for k in range(9)]  # chunk 0 (9 frames) vs chunk 5
    assert frames[9:21] == [(9 + k, s4 + k) for k in range(12)]  # chunk 1 vs chunk 4
    assert len(frames) == 9 + 12 + 12 and e5 == 69


def test_pan_pairs_by_yaw():
    pan = plan_of("{action: camera_r, chunks: 2}", "{action: camera_l, chunks: 2}")
    assert pairs_from_poses(dead_reckon(pan), pan.num_chunks) == [(0, 3), (1, 2)]
    assert revisit_pairs(pan)["source"] == "poses"
    # Same positions but looking elsewhere: pan right 4 chunks (180 deg) and stand still.
    away = plan_of("{action: camera_r, chunks: 4}", "{action: idle, chunks: 4}")
    assert pairs_from_poses(dead_reckon(away), away.num_chunks) == []


@pytest.mark.parametrize("segments", [
    ("{action: forward, chunks: 10}",),  # walks on
    ("{action: idle, chunks: 10}",),  # stands still
    ("{action: forward, chunks: 1}", "{action: idle, chunks: 6}"),  # walks, then stops
    ("{action: forward, frames: 4}", "{action: idle, frames: 20}") * 4,  # creeps
])
def test_no_return_no_pairs(segments):
    plan = plan_of(*segments)
    assert pairs_from_poses(dead_reckon(plan), plan.num_chunks) == []
    assert revisit_pairs(plan) == {"source": "none", "chunk_pairs": [], "frame_pairs": []}


def test_waypoint_rules_for_repeats_and_label_returns():
    ababa = plan_of("{label: A, action: forward, chunks: 2}", "{label: B, action: back, chunks: 2}",
                    "{label: A, action: forward, chunks: 2}", "{label: B, action: back, chunks: 2}",
                    "{label: A}")
    pairs = pairs_from_waypoints(ababa)
    assert {(0, 3), (1, 2)} <= set(pairs)  # first return, reversed
    assert {(0, 4), (1, 5)} <= set(pairs)  # second A->B, same direction as the first
    assert {(0, 7), (1, 6)} <= set(pairs)  # second return, against the first leg
    triangle = plan_of("{label: A, action: forward, chunks: 3}", "{label: B, action: right, chunks: 3}",
                       "{label: C, action: back+left, chunks: 4}", "{label: A}")
    assert pairs_from_waypoints(triangle) == [(0, 9)]  # no leg retraced: only the label's return
    uneven = plan_of("{label: A, action: forward, chunks: 4}", "{label: B, action: back, chunks: 2}",
                     "{label: A}")
    assert pairs_from_waypoints(uneven) == [(0, 5), (1, 5), (2, 4), (3, 4)]


# --------------------------------------------------------------------------- dead reckoning


def test_dead_reckoning_closed_forms():
    walk = dead_reckon(plan_of("{action: forward, chunks: 2}"))  # 21 rows
    assert walk[-1].tolist() == pytest.approx([0.0, 21 / 12, 0.0, 0.0])
    diagonal = dead_reckon(plan_of("{action: forward+right, chunks: 1}"))  # 9 rows, unit speed
    assert diagonal[-1, :2].tolist() == pytest.approx([9 / 12 / 2**0.5] * 2)
    turn = dead_reckon(plan_of("{action: idle, frames: 9}", "{action: camera_r, chunks: 1}",
                               "{action: forward, chunks: 1}"))
    assert turn[20, 2] == pytest.approx(45.0)  # 12 rows of yaw 0.1
    assert turn[-1, :2].tolist() == pytest.approx([np.sin(np.pi / 4), np.cos(np.pi / 4)])
    up = dead_reckon(plan_of("{action: camera_up, chunks: 4}", "{action: camera_down, frames: 4}"))
    assert up[40, 3] == pytest.approx(85.0)  # clamped
    assert up[48, 3] == pytest.approx(85.0 - 4 * 3.75)  # rows 45..48 turn down
    strafe_turned = dead_reckon(plan_of("{action: camera_r, frames: 24}", "{action: right, frames: 12}"))
    assert strafe_turned[35, :2].tolist() == pytest.approx([0.0, -1.0], abs=1e-6)  # faces +x
    run = dead_reckon(plan_of("{action: idle, frames: 9}", "{action: turn_right, frames: 12}",
                              "{action: idle, frames: 12}", mode="templerun"))
    assert run[-1, 2] == pytest.approx(90.0)  # one snap per press, not per row
    assert run[-1, :2].tolist() == pytest.approx([24 / 12, 9 / 12])
    drive = dead_reckon(plan_of("{action: forward, frames: 12}", mode="gta_drive"))
    assert drive[11].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0])


# --------------------------------------------------------------------------- run folders


def test_summarise_run(tmp_path, tower):
    from worldtrace_cli.outputs import JsonlWriter, VideoStreamWriter, read_video_frames

    traj = tmp_path / "aba.yaml"
    traj.write_text(doc("{label: A, action: forward, chunks: 1}", "{label: B, action: back, chunks: 1}",
                        "{label: A}"))
    run = tmp_path / "run"
    run.mkdir()
    video = random_video(21, h=32, w=48, seed=7)
    with VideoStreamWriter(run / "video.mp4", 48, 32) as writer:
        writer.write(video)
    with JsonlWriter(run / "chunks.jsonl") as jsonl:
        for c in range(2):
            jsonl.write({"chunk": c, "pixel_frames": list(chunk_rows(c))})

    fast = summarise_run(run)
    decoded = read_video_frames(run / "video.mp4")
    assert fast["status"] == "partial" and fast["chunks"] == 2 and fast["pixel_frames"] == 21
    assert fast["temp_ssim"]["mean"] == pytest.approx(temp_ssim(decoded)["mean"])
    assert fast["latent_diff"] is None and any("LatentDiff" in n for n in fast["notes"])
    with pytest.raises(ValueError, match="CLIP tower"):
        summarise_run(run, level="all")

    no_traj = summarise_run(run, tower, level="all")
    assert no_traj["scene_drift"]["per_chunk"][0] is None and no_traj["pac"] is None
    (run / "summary.json").write_text(json.dumps(
        {"status": "complete", "config": {"trajectory": str(traj)}, "resolved": {"chunks": 2}}))
    full = summarise_run(run, tower, level="all")
    assert full["status"] == "complete"
    assert full["revisit"]["source"] == "waypoints"
    assert full["revisit"]["chunk_pairs"] == [(0, 1)]
    embeds = clip_embeddings(tower, decoded)
    expected = pac(embeds, [(k, 12 + k) for k in range(9)])  # chunk 0 vs the end of chunk 1
    assert full["pac"]["pairs"] == 9 and full["pac"]["mean"] == pytest.approx(expected["mean"])
    json.dumps(full)  # JSON-able


def test_online_metrics_equal_whole_video_metrics():
    """Chunk-by-chunk scoring (what generate records) equals scoring the whole video at once,
    boundary pairs between chunks included."""
    from worldtrace_cli.metrics import OnlineMetrics, latent_diff, temp_ssim

    gen = torch.Generator().manual_seed(0)
    frames = (torch.rand(9 + 2 * 12, 24, 32, 3, generator=gen) * 255).to(torch.uint8)
    frames[10:20] = frames[9]  # some identical frames: SSIM 1 there
    latents = torch.randn(1, 16, 9, 4, 8, generator=gen)
    online = OnlineMetrics("fast")
    bounds = [(0, 9), (9, 21), (21, 33)]
    recs = [online.add_chunk(latents[:, :, 3 * c:3 * c + 3], frames[a:b]) for c, (a, b) in enumerate(bounds)]
    whole_ssim, whole_ld = temp_ssim(frames), latent_diff(latents)
    summary = online.summary()
    assert summary["temp_ssim"] == pytest.approx(whole_ssim["mean"], abs=1e-9)
    assert summary["latent_diff"] == pytest.approx(whole_ld["mean"], abs=1e-12)
    assert [r["temp_ssim"] for r in recs] == pytest.approx(whole_ssim["per_chunk"], abs=1e-9)
    assert OnlineMetrics("none").add_chunk(latents, frames) == {}


def test_online_gt_detail_and_resume_from_an_older_state():
    """With ground truth every chunk record carries gt_detail (and gt_psnr, gt_ssim); a resume state
    saved before GT detail existed restores it as unknown for the chunks before the resume, so the
    run's detail covers the chunks after it."""
    from worldtrace_cli.metrics import OnlineMetrics
    from worldtrace_cli.trajectory import parse_trajectory, plan_actions
    from worldtrace_cli.world.truth import GroundTruth

    plan = plan_actions(parse_trajectory("mode: universal\nsegments:\n  - {action: camera_r, chunks: 3}\n"))
    truth = GroundTruth(1, plan, 48, 88)
    latents = torch.zeros(1, 16, 3, 6, 11)
    online = OnlineMetrics("fast", truth=truth)
    rec = online.add_chunk(latents, truth.frames(0, 9))
    assert rec["gt_detail"] == pytest.approx(1.0) and rec["gt_psnr"] == 100.0
    state = online.state_dict()
    del state["gt_detail"]                       # as written before the entry existed
    resumed = OnlineMetrics("fast", truth=truth)
    resumed.load_state_dict(state)
    flat = np.full((12, 48, 88, 3), 128, np.uint8)
    assert resumed.add_chunk(latents, flat)["gt_detail"] == 0.0
    summary = resumed.summary()["gt"]
    assert summary["detail"] == 0.0 and summary["psnr"] < 100.0
