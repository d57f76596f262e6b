"""Retrieval memory (issue 14): the ``worldkv`` baseline and the ``retrieval`` writer.

Mechanism tests on synthetic poses and keys (shared/reference/worldkv.md): pose retrieval on known
loops, store-time compression, positions per mode, resume, bad settings; then both writers
through the real MG2 rollout (tiny DiT) and the LingBot loop (tiny official-layout model).
"""

import math
import re
from pathlib import Path

import pytest
import torch

from worldtrace_cli.errors import InputError
from worldtrace_cli.memory import CacheGeometry, MemoryConfig, build_writer
from worldtrace_cli.memory.bank import ChunkBank, keep_indices, kept_per_frame, nearest, pose_distances
from worldtrace_cli.model.chunk import CacheView, LayerPast
from worldtrace_cli.model.rope import MainRope
from worldtrace_cli.runs.state import load_state, save_state, unpack
from worldtrace_cli.world.motion import camera_to_world

GEOM = CacheGeometry(num_layers=2, heads=2, head_dim=128, tokens_per_frame=8, frames_per_chunk=3, trained_offset=5)


def chunk_kv(chunk, geom=GEOM, seed=0):
    gen = torch.Generator().manual_seed(seed * 1009 + chunk)
    n = geom.frames_per_chunk * geom.tokens_per_frame
    return [(torch.randn(1, n, geom.heads, geom.head_dim, generator=gen),
             torch.randn(1, n, geom.heads, geom.head_dim, generator=gen)) for _ in range(geom.num_layers)]


def circle(frames, period_frames, radius=5.0):
    """A loop walked every ``period_frames`` latent frames, facing along the path (x, y, yaw, pitch)."""
    a = 2 * math.pi * torch.arange(frames, dtype=torch.float64) / period_frames
    return camera_to_world(torch.stack([radius * a.cos(), radius * a.sin(), torch.rad2deg(a), 0 * a], 1))


def spin(frames, period_frames):
    """Yaw-only loop: the camera turns on the spot (zero translation), one turn per ``period_frames``."""
    yaw = 360.0 * torch.arange(frames, dtype=torch.float64) / period_frames
    return camera_to_world(torch.stack([0 * yaw, 0 * yaw, yaw, 0 * yaw], 1))


def writer(cache="worldkv", poses=None, geom=GEOM, **flags):
    w = build_writer(MemoryConfig.of(cache=cache, **flags), 3)
    w.reset(geom)
    w.set_poses(poses if poses is not None else circle(300, 24))
    return w


def roll(w, chunks, start=0, geom=GEOM, seed=0):
    """Commit chunks start..chunks-1 and begin the next one; returns that chunk's events."""
    for c in range(start, chunks):
        w.begin_chunk(3 * c)
        w.events()
        w.commit(chunk_kv(c, geom, seed), [3 * c, 3 * c + 1, 3 * c + 2])
    w.begin_chunk(3 * chunks)
    return w.events()


# --- pose distance and top-k -------------------------------------------------------------------

def test_distance_is_the_spec_formula_and_nearest_breaks_ties_to_the_older():
    t = torch.tensor([[0.0, 0, 0], [2.0, 0, 0], [0.0, 1, 0], [2.0, 0, 0]], dtype=torch.float64)
    yaw = camera_to_world(torch.tensor([[0, 0, a, 0] for a in (0.0, 0.0, 90.0, 0.0)], dtype=torch.float64))
    d, d_t, d_r = pose_distances(t, yaw[:, :3, :3], torch.zeros(3, dtype=torch.float64), yaw[0, :3, :3])
    assert d_t.tolist() == [0.0, 4.0, 1.0, 4.0]  # squared L2
    assert torch.allclose(d_r, torch.tensor([0, 0, math.pi / 2, 0], dtype=torch.float64))
    assert torch.allclose(d, 0.5 * d_t / 4 + 0.5 * d_r / (math.pi / 2))
    assert d.tolist()[1:] == [0.5, 0.625, 0.5] and nearest(d, 4) == [0, 1, 3, 2]  # 1 and 3 tie: older first


def test_yaw_only_loop_is_ranked_by_rotation_alone():
    """Zero translation: d_t is 0 for every candidate and is not divided by its zero maximum."""
    poses = spin(12, 12)  # 30 degrees per frame
    d, d_t, d_r = pose_distances(poses[:, :3, 3], poses[:, :3, :3], poses[0, :3, 3], poses[3, :3, :3])
    assert torch.isfinite(d).all() and (d_t == 0).all()
    assert torch.allclose(d, 0.5 * d_r / d_r.max())
    assert nearest(d, 3) == [3, 2, 4]  # 0 deg, then 30 deg each side (tie: the older)


def test_worldkv_retrieves_the_chunks_of_the_same_place_on_the_second_lap():
    """A loop of 8 chunks: on the second lap chunk n's nearest banked chunk is n - 8, then its neighbours."""
    w = writer(poses=circle(300, 24))  # 24 latent frames = 8 chunks per lap
    events = roll(w, 13)
    (event,) = events
    picked = [r["chunk"] for r in event["retrieved"]]
    assert event["window"] == "retrieved" and event["candidates"] == 11  # chunks 0..10 (m < n - 2)
    assert picked[0] == 13 - 8 and set(picked[1:3]) == {4, 6}
    assert 11 not in picked and 12 not in picked  # n - 2 (the release's quirk) and n - 1 (recent)
    assert [r["distance"] for r in event["retrieved"]] == sorted(r["distance"] for r in event["retrieved"])
    frames = [s.frames[0] for s in w.slots()]
    assert frames[:3] == [15, 16, 17] and frames[-3:] == [36, 37, 38]  # closest chunk first, then chunk n-1


def test_worldkv_yaw_only_loop_and_ties():
    w = writer(poses=spin(300, 24), top_k=2)
    (event,) = roll(w, 10)  # chunk 10 faces as chunk 2 did; chunks 1 and 3 tie at 45 degrees
    assert [r["chunk"] for r in event["retrieved"]] == [2, 1]
    assert event["retrieved"][0]["translation_sq"] == 0.0


def test_before_any_candidate_worldkv_reads_a_plain_window_and_retrieval_reads_only_recent_frames():
    w = writer()
    for c, expect in ((0, []), (1, [0, 1, 2]), (2, list(range(6)))):
        w.begin_chunk(3 * c)
        (event,) = w.events()
        assert event["window"] == "plain" and event["candidates"] == 0 and event["retrieved"] == []
        assert [s.frames[0] for s in w.slots()] == expect and all(s.kind == "recent" for s in w.slots())
        w.commit(chunk_kv(c), [3 * c, 3 * c + 1, 3 * c + 2])
    w.begin_chunk(9)
    assert w.events()[0]["window"] == "retrieved" and [s.kind for s in w.slots()].count("retrieved") == 3
    r = writer("retrieval")
    r.begin_chunk(0)
    assert r.slots() == [] and r.events()[0]["candidates"] == 0
    r.commit(chunk_kv(0), [0, 1, 2])
    r.begin_chunk(3)  # frame 0 has left the 2-frame recent window: the one candidate
    assert [(s.kind, s.frames) for s in r.slots()] == [("retrieved", (0,)), ("recent", (1,)), ("recent", (2,))]


def test_retrieval_fills_summary_slots_with_the_nearest_evicted_frames_oldest_first():
    w = writer("retrieval", poses=circle(300, 24))
    (event,) = roll(w, 9)  # query frames 27..29: the places of frames 3..5 on lap one
    picked = [r["frame"] for r in event["retrieved"]]
    assert set(picked) == {3, 4, 5, 2} or set(picked) == {3, 4, 5, 6}
    assert [s.frames[0] for s in w.slots()][:4] == sorted(picked)
    assert all(f < 25 for f in picked)  # only frames that left the recent window (25, 26 are recent)


# --- store-time compression ------------------------------------------------------------------

def test_compression_keeps_the_anchor_whole_and_the_least_similar_tokens_in_order():
    t, c, heads, dim = 8, 3, 2, 4
    e1, e2 = torch.zeros(heads * dim), torch.zeros(heads * dim)
    e1[0], e2[1] = 1, 1
    anchor = e1.repeat(t, 1)
    angles = torch.rand(2 * t, generator=torch.Generator().manual_seed(0)) * math.pi  # similarity cos(angle)
    rest = torch.stack([a.cos() * e1 + a.sin() * e2 for a in angles]) * (1 + torch.arange(2 * t))[:, None]
    keys = torch.cat([anchor, rest]).view(c * t, heads, dim)
    for r in (0.25, 0.5, 1.0):
        kept = keep_indices(keys, c, t, r)
        n = (c - 1) * math.ceil(r * t)
        assert kept.shape == (t + n,) and kept[:t].tolist() == list(range(t))
        assert kept.tolist() == sorted(kept.tolist())
        assert set(kept[t:].tolist()) == set((torch.argsort(angles, descending=True)[:n] + t).tolist())
    assert kept_per_frame(0.1, 30) == 3  # not 4: 0.1 * 30 is 3.0000000000000004 in floating point


def test_bank_stores_exact_canonical_tokens_per_layer_and_r_quarter_halves_it():
    geom = CacheGeometry(**{**GEOM.__dict__, "tokens_per_frame": 4})
    kv = chunk_kv(0, geom)
    full, quarter = ChunkBank(geom, 1.0, "cpu"), ChunkBank(geom, 0.25, "cpu")
    poses = circle(3, 24)
    full.store(kv, [0, 1, 2], poses)
    e = quarter.store(kv, [0, 1, 2], poses)
    assert quarter.nbytes() * 2 == full.nbytes()  # 4 + 2 * ceil(0.25 * 4) = 6 of 12 tokens
    assert e.counts[:, 0].tolist() == [4, 4] and e.counts.sum(1).tolist() == [6, 6]
    rope = MainRope(geom.head_dim, precision=torch.float32)
    positions = torch.arange(3, dtype=torch.float64).repeat_interleave(4)
    for layer, (k, v) in enumerate(kv):
        idx = keep_indices(rope.apply_temporal(k, positions)[0], 3, 4, 0.25)  # scored on rotated keys (A15)
        assert torch.equal(e.k[layer], k[0, idx]) and torch.equal(e.v[layer], v[0, idx])  # canonical, exact


def test_variable_slots_are_rotated_at_their_frame_position():
    """A compressed frame's kept tokens are read exactly as the same tokens of the whole frame."""
    rope = MainRope(128, precision=torch.float32)
    k = torch.randn(1, 3 * 8, 2, 128)
    positions = torch.tensor([-9.0, -8.0, -7.0], dtype=torch.float64)
    keep = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 9, 12, 20, 23])
    counts = torch.tensor([8, 2, 2])
    whole = rope.rotate_slots(k, positions)
    part = rope.rotate_slots(k[:, keep], positions, counts=counts)
    assert torch.equal(part, whole[:, keep])
    view_full = CacheView(past=[LayerPast(k, k, positions)])
    view_counts = CacheView(past=[LayerPast(k, k, positions, torch.tensor([8, 8, 8]))])
    a = view_full.kv_buffer(0, rope, 4, torch.float32)[0][:, :24]
    b = view_counts.kv_buffer(0, rope, 4, torch.float32)[0][:, :24]
    assert torch.equal(a, b)  # the counts path is bit-identical when every slot is whole


# --- positions, k, memory ------------------------------------------------------------------

def test_positions_original_contiguous_and_slot_rank():
    original = writer(top_k=2)
    roll(original, 12)
    frames = [s.frames[0] for s in original.slots()]
    assert original.positions().tolist() == [f - 36.0 for f in frames]  # each frame at its own index
    contiguous = writer(top_k=2, positions="rank")
    roll(contiguous, 12)
    k, c = 2, 3
    want = [-3 - (k - i) * c + j for i in range(k) for j in range(c)] + [-3, -2, -1]  # spec §2.5
    assert contiguous.positions().tolist() == want
    ret = writer("retrieval")
    roll(ret, 40)
    assert ret.positions().tolist() == [-6, -5, -4, -3, -2, -1]  # Def. 1: inside the trained window


def test_k_from_a_token_budget_and_window_sizes():
    geom = CacheGeometry(**{**GEOM.__dict__, "tokens_per_frame": 8})
    w = writer(retrieval_budget=18, keep_ratio=0.25, geom=geom)
    assert w.k == 12 and w.budget == 39  # 18 * 8 / (8 + 2 * 2) = 12 chunks (the paper's "2x history")
    assert writer(geom=geom).k == 6 and writer(keep_ratio=0.25, geom=geom).k == 6  # the release: k = 18 / 3
    lingbot = CacheGeometry(**{**GEOM.__dict__, "frames_per_chunk": 4})
    w4 = writer(geom=lingbot)
    assert (w4.k, w4.recent_chunks) == (4, 2)  # C = 4: 18 // 4 chunks, recent = 2 chunks (spec §2.4)


def test_bank_grows_on_the_host_and_the_window_stays_flat():
    w = writer(keep_ratio=0.25)
    per_token = 2 * GEOM.heads * GEOM.head_dim * 4
    kv, host = [], []
    for c in range(14):
        w.begin_chunk(3 * c)
        kv.append(w.kv_bytes())
        host.append(w.host_bytes())
        w.commit(chunk_kv(c), [3 * c, 3 * c + 1, 3 * c + 2])
    growth = {b - a for a, b in zip(host, host[1:])}
    assert growth == {GEOM.num_layers * (8 + 2 * 2) * per_token}  # one compressed chunk per chunk
    assert len(set(kv[9:])) == 1  # 6 retrieved chunks + 1 recent chunk, whatever the horizon
    assert w.describe()["bank"]["entries"] == 14


@pytest.mark.gpu
@pytest.mark.parametrize("cache", ["worldkv", "retrieval"])
def test_a_bank_on_cuda_serves_a_model_on_the_cpu_what_a_cpu_bank_does(cache):
    """`--device cpu --bank-device cuda`: the bank's device-to-host copies complete before the CPU reads
    them (an asynchronous copy to the CPU returns before its data arrives): every read equals a CPU
    bank's."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    a, b = writer(cache, keep_ratio=0.5), writer(cache, keep_ratio=0.5, bank_device="cuda")
    for c in range(12):
        for w in (a, b):
            w.begin_chunk(3 * c)
        # the one field that should differ: where each bank lives
        events = [{**e, "bank_device": f"cuda:{torch.cuda.current_device()}"} for e in a.events()]
        assert a.slots() == b.slots() and events == b.events()
        for layer in range(GEOM.num_layers):
            for x, y in zip(a.read(layer), b.read(layer)):
                assert y.device.type == "cpu" and torch.allclose(x, y, atol=1e-6)
        for w in (a, b):
            w.commit(chunk_kv(c), [3 * c, 3 * c + 1, 3 * c + 2])


# --- resume, errors -------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [{"cache": "worldkv", "keep_ratio": 0.25, "positions": "rank"},
                                   {"cache": "worldkv", "retrieval_budget": 9, "keep_ratio": 0.5},
                                   {"cache": "retrieval", "keep_ratio": 0.25}])
def test_state_saved_mid_run_resumes_bit_identically(flags, tmp_path):
    cfg = dict(flags)
    cache = cfg.pop("cache")
    w1 = writer(cache, **cfg)
    roll(w1, 7)
    save_state(tmp_path / "s", {}, {"writer": w1.state_dict()})
    _, parts, tensors = load_state(tmp_path / "s")
    w2 = writer(cache, **cfg)
    w2.load_state_dict(unpack(parts["writer"], tensors))
    for w in (w1, w2):  # w1 begun again: its event of chunk 7 was read by roll
        w.begin_chunk(21)
    for c in range(7, 16):
        assert w1.slots() == w2.slots() and torch.equal(w1.positions(), w2.positions())
        assert w1.events() == w2.events() and w1.host_bytes() == w2.host_bytes()
        for layer in range(GEOM.num_layers):
            assert all(torch.equal(a, b) for a, b in zip(w1.read(layer), w2.read(layer)))
            ca, cb = w1.token_counts(layer), w2.token_counts(layer)
            assert (ca is None and cb is None) or torch.equal(ca, cb)
        for w in (w1, w2):
            w.commit(chunk_kv(c, seed=1), [3 * c, 3 * c + 1, 3 * c + 2])
            w.begin_chunk(3 * c + 3)


@pytest.mark.parametrize("flags,flag", [
    ({"cache": "worldkv", "top_k": -1}, "--top-k: must be >= 0"),
    ({"cache": "worldkv", "retrieval_budget": -3}, "--retrieval-budget"),
    ({"cache": "worldkv", "keep_ratio": 0.0}, "--keep-ratio: must be in"),
    ({"cache": "retrieval", "keep_ratio": 1.5}, "--keep-ratio: must be in"),
    ({"cache": "worldkv", "keep_ratio": float("nan")}, "--keep-ratio"),
    ({"cache": "worldkv", "bank_device": "cuda:99"}, "--bank-device cuda:99"),
    ({"cache": "worldkv", "bank_device": "banana"}, "--bank-device: must be cpu or cuda[:i], got 'banana'"),
    ({"cache": "retrieval", "bank_device": "meta"}, "--bank-device: must be cpu or cuda"),
    ({"cache": "worldkv", "top_k": 3, "retrieval_budget": 9}, "give one"),
    ({"cache": "worldkv", "summary_slots": 2}, "--summary-slots"),
    ({"cache": "worldkv", "budget": 6}, "--budget"),
    ({"cache": "retrieval", "top_k": 3}, "--top-k"),
    ({"cache": "sliding", "keep_ratio": 0.5}, "--keep-ratio: --cache sliding does not use it"),
    ({"cache": "landmark", "bank_device": "cpu"}, "--bank-device"),
    ({"cache": "worldkv:2"}, "--cache worldkv:2: expected worldkv:r"),
    ({"cache": "retrieval:x"}, "--cache retrieval:x: expected retrieval:r"),
    ({"cache": "worldkv:0.25", "keep_ratio": 0.5}, "give the keep ratio once"),
])
def test_bad_settings_are_one_line_input_errors(flags, flag):
    with pytest.raises(InputError, match=re.escape(flag)) as err:
        build_writer(MemoryConfig.of(**flags), 3)
    assert "\n" not in str(err.value)


def test_keep_ratio_from_the_spec():
    assert build_writer(MemoryConfig.of(cache="worldkv:0.25"), 3).keep_ratio == 0.25
    assert build_writer(MemoryConfig.of(cache="worldkv"), 3).keep_ratio == 0.5  # the release's
    assert build_writer(MemoryConfig.of(cache="retrieval"), 3).keep_ratio == 1.0  # no compression
    assert build_writer(MemoryConfig.of(cache="retrieval", keep_ratio=0.5), 3).keep_ratio == 0.5


def test_pose_writers_refuse_a_model_without_poses():
    for cache in ("worldkv", "retrieval"):
        w = build_writer(MemoryConfig.of(cache=cache), 3)
        w.reset(GEOM)
        with pytest.raises(InputError, match="camera pose"):
            w.set_poses(None)


# --- through the real loops ----------------------------------------------------------------

@pytest.mark.parametrize("cache,flags", [("worldkv", {"keep_ratio": 0.25}), ("retrieval", {"keep_ratio": 0.5})])
def test_writers_run_through_the_mg2_rollout(dit, cache, flags, one_thread):
    from worldtrace_cli.model.sampler import FlowMatchSchedule
    from worldtrace_cli.engine.rollout import Rollout
    from test_rollout import LATENT_HW, ConstantConditioning

    chunks = 5
    w = build_writer(MemoryConfig.of(cache=cache, **flags), 3)
    gen = torch.Generator().manual_seed(1)
    rollout = Rollout(dit, w, ConstantConditioning(), torch.randn(1, 257, 1280, generator=gen),
                      torch.zeros(1, 12 * chunks - 3, 4), torch.zeros(1, 12 * chunks - 3, 2), FlowMatchSchedule(), 0,
                      torch.device("cpu"), LATENT_HW, poses=spin(3 * chunks, 12))
    records = [rollout.step().record for _ in range(chunks)]
    last = records[-1]["cache"]
    assert all(torch.isfinite(torch.tensor(r["latents"]["mean"])) for r in records)
    assert [e["type"] for e in last["events"]] == ["retrieval"] and last["events"][0]["retrieved"]
    compressed = [s for s in last["slots"] if s["kind"] == "retrieved" and s["tokens"] < 8]
    assert compressed, "a compressed chunk's frames keep fewer of the 8 tokens"
    assert last["kv_bytes"] == sum(s["bytes"] for s in last["slots"]) and last["host_bytes"] > 0


def test_worldkv_runs_through_the_lingbot_rollout(one_thread):
    """WorldKV on LingBot's 4-frame chunks: the fixture inputs through the product's LingbotRollout
    (poses from LingBot's camera track, handed over by set_poses)."""
    from worldtrace_cli.model.lingbot.checkpoint import load_lingbot_dit
    from worldtrace_cli.jobs.parity_lingbot import load_lingbot_fixture, replay_variant

    data_dir = Path(__file__).parent / "data" / "lingbot"
    model = load_lingbot_dit(data_dir / "tiny_config.json", weights=data_dir / "tiny_weights.safetensors")
    inputs, _ = load_lingbot_fixture(data_dir)
    _, latents, w = replay_variant(model, inputs, 18, 6, memory=MemoryConfig.of(cache="worldkv", keep_ratio=0.25, top_k=2))
    lat_f = latents.shape[1]
    assert torch.isfinite(latents).all() and lat_f == 32
    assert w.describe()["bank"]["entries"] == lat_f // 4 and w.recent_chunks == 2


def test_a_pinned_bank_reserved_ahead_carves_every_chunk_without_a_new_slab():
    """issue 45: ChunkBank.reserve(chunks) page-locks at reset what that many entries' K and V take
    (compressed or not), so storing them allocates no slab on the generating thread. The arena here
    is unpinned (no CUDA) with the pinned bank's layout: the same slabs and offsets."""
    from worldtrace_cli.memory.pinned import PinnedArena

    for ratio in (1.0, 0.25):
        geom = CacheGeometry(**{**GEOM.__dict__, "tokens_per_frame": 4})
        bank = ChunkBank(geom, ratio, "cpu")
        bank._pin, bank._arena = True, PinnedArena(pin=False, limit=4096)  # small slabs: several are needed
        reserved = bank.reserve(6)
        made = bank._arena.slabs_made
        assert made > 1 and reserved > 0
        for chunk in range(6):
            e = bank.store(chunk_kv(chunk, geom), [3 * chunk, 3 * chunk + 1, 3 * chunk + 2], circle(3, 24))
            assert e.k.shape[1] == bank.entry_tokens()
        assert bank._arena.slabs_made == made  # every entry carved from the reserved slabs
        bank.store(chunk_kv(6, geom), [18, 19, 20], circle(3, 24))
        assert bank._arena.slabs_made >= made  # a seventh chunk may need a slab of its own
    cpu_bank = ChunkBank(geom, 1.0, "cpu")
    assert cpu_bank.reserve(6) == 0  # a CPU model's bank is not page-locked: nothing to reserve
