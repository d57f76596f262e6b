"""Golden parity: the LingBot DiT, camera conditioning and the product's causal-fast rollout
(LingbotRollout), driven through the project's cache writers, replay the three official rollouts (fixtures README: ``main`` window 18 sink 6,
``nosink_la10``, ``global``) within 1e-4 in float32: every denoising call's x0 and the final latents.

The official cache (spec §7) maps onto existing writers (:func:`official_memory`): ``full`` for the
global cache, ``sliding`` (budget W - F) without a sink, ``sink`` (budget W - F, k = s) with one. Slots
must be read at their true offsets (``positions="actual"``); rank-contiguous positions are shown to
change the sink rollout (spec §14)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from worldtrace_cli.memory import MemoryConfig
from worldtrace_cli.model.lingbot.camera import camera_embedding, frame_counts
from worldtrace_cli.model.lingbot.checkpoint import load_lingbot_dit
from worldtrace_cli.model.lingbot.config import official_memory
from worldtrace_cli.model.lingbot.sampler import OfficialNoise
from worldtrace_cli.model.rope import MainRope
from worldtrace_cli.jobs.parity_lingbot import load_lingbot_fixture, replay_variant

DATA = Path(__file__).parent / "data" / "lingbot"
VARIANTS = {"main": (18, 6), "nosink_la10": (10, 0), "global": (-1, 0)}
TOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    model = load_lingbot_dit(DATA / "tiny_config.json", weights=DATA / "tiny_weights.safetensors")
    data = load_file(str(DATA / "tiny_data.safetensors"))
    kept, lat_f, _ = frame_counts(len(data["poses"]), 137)
    cam = camera_embedding(data["poses"].numpy()[:kept], data["intrinsics"].numpy(), lat_f, (32, 64))
    return model, data, cam


def replay(model, local_attn_size, sink_size, positions="actual", noise=None):
    """The 8-chunk rollout through the product's LingbotRollout (parity_lingbot.replay_variant);
    returns (x0 per (chunk, step), latents [16, 32, 4, 8], writer)."""
    memory = MemoryConfig.of(**{**official_memory(local_attn_size, sink_size), "positions": positions})
    inputs, _ = load_lingbot_fixture(DATA)
    x0s, latents, writer = replay_variant(model, inputs, local_attn_size, sink_size, memory=memory, noise=noise)
    return {tuple(int(n) for n in k[1:-3].split("_s")): v for k, v in x0s.items()}, latents, writer


def test_camera_from_pose_files_matches_official_tensor(setup):
    _, data, cam = setup
    assert cam.shape == (1, 384, 32, 4, 8)
    assert (cam[:, :, :8] - data["cam_emb_head"]).abs().max().item() < 2e-5
    assert (cam[:, :, 28:] - data["cam_emb_tail"]).abs().max().item() < 2e-5


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rollout_replays_official_run(setup, variant, one_thread):
    model, data, _ = setup
    x0s, latents, _ = replay(model, *VARIANTS[variant])
    assert len(x0s) == 32
    diffs = {key: (x0 - data[f"{variant}/c{key[0]}_s{key[1]}_x0"]).abs().max().item() for key, x0 in x0s.items()}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, f"chunk {worst[0]} step {worst[1]}: {diffs[worst]:.3g}"
    assert (latents - data[f"{variant}/output_latents"]).abs().max().item() <= TOL


def test_official_noise_order_reproduces_the_stored_draws(setup, one_thread):
    """Seed 42 on a CPU generator, whole-rollout noise first, then three draws per chunk (spec §9.1)."""
    model, data, _ = setup
    noise = OfficialNoise(42, 32, (4, 8))
    assert torch.equal(noise.initial, data["noise"])
    _, latents, _ = replay(model, 10, 0, noise=noise)
    assert (latents - data["nosink_la10/output_latents"]).abs().max().item() <= TOL


@pytest.mark.parametrize("positions", [None, "slot_rank"])
def test_sink_needs_true_offsets_not_ranks(setup, positions, one_thread):
    """Rank-contiguous positions (the sink writer's own default, StreamingLLM-style) close the gap
    between sink and window frames: a visible change from the official run (spec §14: 0.036)."""
    model, data, _ = setup
    _, latents, writer = replay(model, 18, 6, positions=positions)
    assert writer.positions_scheme != "actual"
    assert (latents - data["main/output_latents"]).abs().max().item() > 1e-2


def test_canonical_cache_rotated_to_absolute_frames_equals_official_buffer(setup, one_thread):
    """After chunk 7 the writer holds sink frames 0-5 and frames 24-31 as canonical keys; rotated to
    their absolute frame index they equal the official buffer (sink 0-5, then frames 20-31)."""
    model, data, _ = setup
    _, _, writer = replay(model, 18, 6)
    frames = [s.frames[0] for s in writer.slots()]
    assert frames == [0, 1, 2, 3, 4, 5] + list(range(24, 32))
    k, v = writer._read_kv(0)
    k_abs = MainRope(128).rotate_slots(k, torch.tensor(frames, dtype=torch.float64))
    rows = torch.cat([torch.arange(8 * b, 8 * b + 8) for b in [0, 1, 2, 3, 4, 5] + [6 + f - 20 for f in frames[6:]]])
    assert int(data["main/kv_after_c7_L0_local_end"]) == 144
    assert (k_abs - data["main/kv_after_c7_L0_k"][:, rows]).abs().max().item() <= TOL
    assert (v - data["main/kv_after_c7_L0_v"][:, rows]).abs().max().item() <= TOL


def test_official_memory_mapping():
    assert official_memory(-1, 0) == {"cache": "full", "positions": "actual"}
    assert official_memory(10, 0) == {"cache": "sliding", "budget": 6, "positions": "actual"}
    assert official_memory(18, 6) == {"cache": "sink", "budget": 14, "sink_frames": 6, "positions": "actual"}
    with pytest.raises(ValueError, match="must exceed"):
        official_memory(9, 6)


def test_bfloat16_model_runs_the_same_rollout_approximately(setup, one_thread):
    """The official GPU dtype (bf16 weights, spec §15.8): same loop and writers, bf16 rounding only."""
    _, data, _ = setup
    model = load_lingbot_dit(DATA / "tiny_config.json", weights=DATA / "tiny_weights.safetensors", dtype=torch.bfloat16)
    _, latents, writer = replay(model, 18, 6)
    assert latents.dtype == torch.float32 and writer.geometry.dtype == torch.bfloat16
    diff = (latents - data["main/output_latents"]).abs()
    assert diff.max().item() < 0.1 and diff.mean().item() < 0.02


OFFICIAL = Path(__file__).resolve().parents[2] / "shared" / "reference" / "lingbot" / "fixtures"


def test_a_lingbot_variant_the_replay_cannot_reproduce_is_named_never_passed():
    """variant_settings reads an official-layout run_config.json, or says why the replay cannot
    reproduce it (fixture-free)."""
    from worldtrace_cli.jobs.parity_lingbot import variant_settings

    cfg = {"chunk_size": 4, "local_attn_size": 18, "sink_size": 6, "frame_num_requested": 137, "shift": 10.0,
           "timesteps_index": [0, 250, 500, 750], "infer_mode": "causal_fast", "num_train_timesteps": 1000}
    assert variant_settings(cfg) == ((18, 6, 137), None)
    for bad, why in (({**cfg, "shift": 5.0}, "shift 5.0: this replay reproduces 10.0"),
                     ({**cfg, "chunk_size": 3}, "chunk_size 3"), ({**cfg, "infer_mode": "causal_pretrain"}, "infer_mode"),
                     ({k: v for k, v in cfg.items() if k != "sink_size"}, "lacks 'sink_size'"),
                     ({**cfg, "local_attn_size": "18"}, "not a whole number"), ([1], "not an object")):
        settings, reason = variant_settings(bad)
        assert settings is None and why in reason, (bad, reason)


@pytest.mark.skipif(not OFFICIAL.is_dir(), reason="the official-layout LingBot fixtures live in ../shared beside the clone")
def test_parity_of_an_official_layout_folder_names_what_it_does_not_replay(tmp_path):
    """``worldtrace parity`` on a copy of the official-layout fixtures with an extra variant of another
    shift and one without its window: the real variants pass, the two are named as not replayed (one
    line), exit 0; a folder whose only variant is not replayable is exit 2, one line."""
    import json
    import shutil
    import subprocess
    import sys

    folder = tmp_path / "lingbot"
    shutil.copytree(OFFICIAL, folder)
    for name, change in (("other-shift", {"shift": 5.0}), ("no-window", {"local_attn_size": None})):
        shutil.copytree(folder / "main", folder / name)
        cfg = json.loads((folder / name / "run_config.json").read_text())
        cfg.update(change)
        (folder / name / "run_config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    run = subprocess.run([sys.executable, "-m", "worldtrace_cli", "parity", str(folder)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    (skipped,) = [ln for ln in run.stderr.splitlines() if "not replayed:" in ln]
    assert "other-shift (shift 5.0" in skipped and "no-window (run_config.json lacks 'local_attn_size')" in skipped
    assert "main/latents" in run.stdout and "other-shift/" not in run.stdout and "Traceback" not in run.stderr
    for sub in ("main", "nosink_la10", "global", "no-window"):
        shutil.rmtree(folder / sub)
    run = subprocess.run([sys.executable, "-m", "worldtrace_cli", "parity", str(folder)], capture_output=True,
                         text=True, timeout=300)
    errors = [ln for ln in run.stderr.splitlines() if ln.startswith("worldtrace: error:")]
    assert run.returncode == 2 and len(errors) == 1 and "no replayable variant" in errors[0], run.stderr
