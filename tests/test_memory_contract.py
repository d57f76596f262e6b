"""The cache contract, for every registered writer x every position scheme (docs/architecture.md §2).

Synthetic canonical K/V are committed chunk by chunk straight into each writer; the contract says
what read() must return. New writers are covered by registering them: nothing to edit here.
"""

import itertools

import pytest
import torch

from worldtrace_cli.errors import InputError, RunError
from worldtrace_cli.memory import SCHEMES, WRITERS, CacheGeometry, MemoryConfig, build_writer, example_specs
from worldtrace_cli.runs.state import load_state, save_state, unpack

GEOM = CacheGeometry(num_layers=2, heads=2, head_dim=128, tokens_per_frame=4, frames_per_chunk=3, trained_offset=5)
UNBOUNDED = {"full", "yarn"}
DEFAULT_BUDGET = 3  # MG2 universal: local_attn_size 6 - 3 frames per chunk


SPECS = example_specs()  # one runnable spec per registered writer: a new writer is covered here


def cache_name(name):
    return dict(zip(sorted(WRITERS), SPECS))[name]


def chunk_kv(chunk, seed=0):
    gen = torch.Generator().manual_seed(seed * 100_003 + chunk)
    n = GEOM.frames_per_chunk * GEOM.tokens_per_frame
    return [(torch.randn(1, n, GEOM.heads, GEOM.head_dim, generator=gen),
             torch.randn(1, n, GEOM.heads, GEOM.head_dim, generator=gen)) for _ in range(GEOM.num_layers)]


def loop_poses(frames, period=30):
    """Camera-to-world poses [frames, 4, 4] of a circle walked every ``period`` latent frames (a loop
    that revisits every place): what the rollout hands pose-retrieval writers (set_poses)."""
    from worldtrace_cli.world.motion import camera_to_world

    f = torch.arange(frames, dtype=torch.float64)
    angle = 2 * torch.pi * f / period
    return camera_to_world(torch.stack([5 * angle.cos(), 5 * angle.sin(), torch.rad2deg(angle), 0 * f], 1))


def reset(writer, chunks, geometry=GEOM):
    """``reset`` and, for writers that retrieve by camera pose, ``set_poses`` as the rollout does."""
    writer.reset(geometry)
    if writer.needs_poses:
        writer.set_poses(loop_poses(3 * chunks + 3))


def run(writer, chunks, seed=0, observe=None):
    reset(writer, chunks)
    for c in range(chunks):
        writer.begin_chunk(3 * c)
        if observe:
            observe(c, writer)
        writer.commit(chunk_kv(c, seed), [3 * c, 3 * c + 1, 3 * c + 2])
    writer.begin_chunk(3 * chunks)
    return writer


@pytest.mark.parametrize("name,scheme", list(itertools.product(sorted(WRITERS), sorted(SCHEMES))))
def test_contract(name, scheme):
    writer = build_writer(MemoryConfig.of(cache=cache_name(name), positions=scheme), DEFAULT_BUDGET)
    kv_bytes = []

    def observe(c, w):
        slots = w.slots()
        pos = w.positions()
        assert pos.shape == (len(slots),) and pos.dtype == torch.float64
        assert torch.isfinite(pos).all()
        assert (pos < 0).all(), "past slots are read before the current chunk"
        for layer in range(GEOM.num_layers):
            k, v, p = w.read(layer)
            counts = w.token_counts(layer)  # None: every slot one whole latent frame
            tokens = len(slots) * GEOM.tokens_per_frame if counts is None else int(counts.sum())
            assert counts is None or (counts.shape == (len(slots),) and (counts >= 0).all())
            assert k.shape == v.shape == (1, tokens, GEOM.heads, GEOM.head_dim)
            assert torch.isfinite(k).all() and torch.isfinite(v).all()
            assert torch.equal(p, pos)
        for s in slots:
            assert all(f < 3 * c for f in s.frames), "a slot holds only finished frames"
        kv_bytes.append(w.kv_bytes())

    run(writer, 40, observe=observe)
    if name not in UNBOUNDED:
        assert len(set(kv_bytes[10:])) == 1, "bounded writers hold a constant number of slots"
        assert len(writer.slots()) <= writer.budget
    if scheme == "slot_rank":
        pos = writer.positions()
        assert len(set(pos.tolist())) == len(pos), "slot_rank positions are distinct"


@pytest.mark.parametrize("name", sorted(set(WRITERS) - UNBOUNDED))
def test_slot_rank_positions_do_not_depend_on_the_horizon(name):
    """Def. 1: offsets fixed by rank alone, identical at chunk 50 and chunk 1000."""
    cfg = MemoryConfig.of(cache=cache_name(name), positions="slot_rank")
    w50 = run(build_writer(cfg, DEFAULT_BUDGET), 50)
    w1000 = run(build_writer(cfg, DEFAULT_BUDGET), 1000)
    assert torch.equal(w50.positions(), w1000.positions())
    assert w1000.positions().min() >= -w1000.budget


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_deterministic(name):
    a = run(build_writer(MemoryConfig.of(cache=cache_name(name)), DEFAULT_BUDGET), 20, seed=3)
    b = run(build_writer(MemoryConfig.of(cache=cache_name(name)), DEFAULT_BUDGET), 20, seed=3)
    assert a.slots() == b.slots()
    for layer in range(GEOM.num_layers):
        assert all(torch.equal(x, y) for x, y in zip(a.read(layer), b.read(layer)))


@pytest.mark.parametrize("name", ["sliding", "full", "sink", "landmark", "field-streaming", "memrope"])
def test_kept_frames_do_not_pin_their_whole_chunk(name):
    """Verbatim frames (sliding, the recent window, sink frames, landmarks) are stored as per-frame
    copies: no stored tensor's memory is larger than what that tensor itself needs."""
    writer = run(build_writer(MemoryConfig.of(cache=name), DEFAULT_BUDGET), 6)
    frame_bytes = GEOM.tokens_per_frame * GEOM.heads * GEOM.head_dim * 4
    stored = []

    def walk(obj):
        if isinstance(obj, torch.Tensor):
            stored.append(obj)
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(value)
        elif isinstance(obj, (list, tuple, set)) or type(obj).__name__ == "deque":
            for value in obj:
                walk(value)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("worldtrace_cli.memory"):
            walk(vars(obj))

    walk(vars(writer))
    frames = [t for t in stored if t.shape[1:] == (GEOM.tokens_per_frame, GEOM.heads, GEOM.head_dim)]
    assert frames, "the writer keeps verbatim frames"
    assert all(t.untyped_storage().nbytes() == frame_bytes for t in frames)


def test_block_relative_collapses_old_slots_and_slot_rank_keeps_them_distinct():
    """Remark 1: beyond the trained offset, distinct summary slots share one position."""
    br = run(build_writer(MemoryConfig.of(cache="sink", positions="block_relative", sink_frames=2, budget=4),
                          DEFAULT_BUDGET), 30)
    pos = br.positions().tolist()
    sinks = [p for s, p in zip(br.slots(), pos) if s.kind == "sink"]
    assert len(sinks) == 2 and sinks[0] == sinks[1] == 3 - 1 - 5
    sr = run(build_writer(MemoryConfig.of(cache="sink", positions="slot_rank", sink_frames=2, budget=4),
                          DEFAULT_BUDGET), 30)
    assert sorted(sr.positions().tolist()) == [-4, -3, -2, -1]


def test_actual_positions_of_sliding_are_true_offsets():
    w = run(build_writer(MemoryConfig.of(cache="sliding"), DEFAULT_BUDGET), 10)
    assert [s.frames for s in w.slots()] == [(27,), (28,), (29,)]
    assert w.positions().tolist() == [-3.0, -2.0, -1.0]


def test_centroid_linear_stays_in_range_but_moves_with_the_horizon():
    cfg = MemoryConfig.of(cache="sink", positions="centroid_linear", sink_frames=1, budget=3)
    p20 = run(build_writer(cfg, DEFAULT_BUDGET), 20).positions()
    p200 = run(build_writer(cfg, DEFAULT_BUDGET), 200).positions()
    # q = a - 1; t_min = q - 5 -> offset -6; the sink (frame 0) maps to t_min at every horizon,
    # recent slots keep actual offsets: in range, but a summary centroid's offset moves with N
    assert p20[0] == p200[0] == -6.0
    assert p20[1:].tolist() == p200[1:].tolist() == [-2.0, -1.0]


def test_full_refuses_past_its_memory_cap():
    w = build_writer(MemoryConfig.of(cache="full", max_cache_gb=2 * 5 * 16384 / 1e9), DEFAULT_BUDGET)
    w.reset(GEOM)
    assert w.frame_bytes() == 2 * 4 * 2 * 128 * 2 * 4  # K+V x tokens x heads x head_dim x layers x fp32
    w.commit(chunk_kv(0), [0, 1, 2])  # 3 of the 5 frames the cap allows
    with pytest.raises(RunError, match="max-cache-gb"):
        w.commit(chunk_kv(1), [3, 4, 5])


def test_yarn_interpolates_temporal_frequencies_as_the_window_grows():
    w = run(build_writer(MemoryConfig.of(cache="yarn"), DEFAULT_BUDGET), 10)
    assert w.scale() == pytest.approx((30 + 3 - 0) / 6)
    scale = w.temporal_frequency_scale()
    assert scale.shape == (22,) and torch.allclose(scale, torch.full((22,), 6 / 33, dtype=torch.float64))


def test_bad_memory_flags_are_input_errors():
    with pytest.raises(InputError, match="--cache"):
        build_writer(MemoryConfig.of(cache="nope"), 3)
    with pytest.raises(InputError, match="--budget"):
        build_writer(MemoryConfig.of(cache="sliding", budget=-1), 3)
    with pytest.raises(InputError, match="--sink-frames"):
        build_writer(MemoryConfig.of(cache="sink", sink_frames=3), 3)  # the default budget: no recent slot left
    assert build_writer(MemoryConfig.of(cache="sink", sink_frames=3, budget=3), 3).n_recent == 0  # asked for
    with pytest.raises(InputError, match="--budget"):
        build_writer(MemoryConfig.of(cache="memrope", budget=3), 3)


def test_every_registered_writer_has_a_runnable_example_spec():
    assert len(SPECS) == len(WRITERS) and "mixed:2" in SPECS
    for spec in SPECS:
        build_writer(MemoryConfig.of(cache=spec), DEFAULT_BUDGET)


def assert_same(a, b, chunk):
    assert a.slots() == b.slots(), f"chunk {chunk}: slots differ"
    assert a.budget == b.budget and a.kv_bytes() == b.kv_bytes() and a.host_bytes() == b.host_bytes()
    for layer in range(GEOM.num_layers):
        for x, y in zip(a.read(layer), b.read(layer)):
            assert x.dtype == y.dtype and torch.equal(x, y), f"chunk {chunk}, layer {layer}: read differs"
        ca, cb = a.token_counts(layer), b.token_counts(layer)
        assert (ca is None and cb is None) or torch.equal(ca, cb)
    fa, fb = a.temporal_frequency_scale(), b.temporal_frequency_scale()
    assert (fa is None and fb is None) or torch.equal(fa, fb)
    assert a.events() == b.events()


@pytest.mark.parametrize("spec", SPECS)
def test_state_dict_round_trip_through_the_resume_files_is_bit_identical(spec, tmp_path):
    """Save mid-run (state_dict -> save_state: safetensors + JSON, no pickle), restore into a fresh
    writer built from the same config, continue both with the same commits: identical every chunk."""
    kw = {"spill_dir": str(tmp_path / "spill")} if spec.split(":")[0] in ("field", "naive", "mixed") else {}
    cfg = MemoryConfig.of(cache=spec, **kw)
    w1 = build_writer(cfg, DEFAULT_BUDGET)
    reset(w1, 20)
    for c in range(9):  # field groups have moved, landmarks and EMA streams exist, sinks are full
        w1.begin_chunk(3 * c)
        w1.read(0)
        w1.commit(chunk_kv(c, seed=5), [3 * c, 3 * c + 1, 3 * c + 2])
    w1.begin_chunk(27)
    state = w1.state_dict()
    save_state(tmp_path / "state", {"chunk": 9}, {"writer": state})
    _, parts, tensors = load_state(tmp_path / "state")
    w2 = build_writer(cfg, DEFAULT_BUDGET)
    reset(w2, 20)
    w2.load_state_dict(unpack(parts["writer"], tensors))
    w2.begin_chunk(27)
    for c in range(9, 20):
        assert_same(w1, w2, c)
        for w in (w1, w2):
            w.commit(chunk_kv(c, seed=5), [3 * c, 3 * c + 1, 3 * c + 2])
            w.begin_chunk(3 * c + 3)
    assert_same(w1, w2, 20)


def test_state_is_plain_data_and_names_its_writer():
    allowed = (dict, list, int, float, str, bool, type(None), torch.Tensor)

    def walk(x):
        assert isinstance(x, allowed), type(x)
        if isinstance(x, dict):
            assert all(isinstance(k, str) for k in x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for spec in SPECS:
        w = run(build_writer(MemoryConfig.of(cache=spec), DEFAULT_BUDGET), 6)
        state = w.state_dict()
        walk(state)
        assert state["writer"] == spec.split(":")[0] and state["version"] == 1
    sliding = run(build_writer(MemoryConfig.of(cache="sliding"), DEFAULT_BUDGET), 3).state_dict()
    other = build_writer(MemoryConfig.of(cache="full"), DEFAULT_BUDGET)
    other.reset(GEOM)
    with pytest.raises(InputError, match="sliding"):
        other.load_state_dict(sliding)
    bigger = build_writer(MemoryConfig.of(cache="sliding", budget=5), DEFAULT_BUDGET)
    bigger.reset(GEOM)
    with pytest.raises(InputError, match="budget"):
        bigger.load_state_dict(sliding)


def test_slots_say_their_role():
    for spec in SPECS:
        w = run(build_writer(MemoryConfig.of(cache=spec), DEFAULT_BUDGET), 12)
        roles = [s.role for s in w.slots()]
        assert set(roles) <= {"summary", "recent"} and roles == sorted(roles, key=lambda r: r == "recent"), spec
    kinds = {spec: {(s.kind, s.role) for s in run(build_writer(MemoryConfig.of(cache=spec), DEFAULT_BUDGET), 12).slots()}
             for spec in ("naive", "sink", "memrope", "sliding")}
    assert kinds["naive"] == {("naive", "summary"), ("recent", "recent")}
    assert kinds["sink"] == {("sink", "summary"), ("recent", "recent")}
    assert kinds["memrope"] == {("sink", "summary"), ("ema", "summary"), ("recent", "recent")}
    assert kinds["sliding"] == {("past", "recent")}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", SPECS)
def test_state_round_trip_on_cuda_keeps_host_stores_on_the_host(spec, tmp_path):
    cuda = CacheGeometry(**{**GEOM.__dict__, "device": torch.device("cuda")})
    w1, w2 = build_writer(MemoryConfig.of(cache=spec), DEFAULT_BUDGET), build_writer(MemoryConfig.of(cache=spec), DEFAULT_BUDGET)
    reset(w1, 14, cuda)
    for c in range(8):
        w1.begin_chunk(3 * c)
        w1.commit([(k.cuda(), v.cuda()) for k, v in chunk_kv(c)], [3 * c, 3 * c + 1, 3 * c + 2])
    w1.begin_chunk(24)
    save_state(tmp_path / "state", {}, {"writer": w1.state_dict()})
    _, parts, tensors = load_state(tmp_path / "state")
    reset(w2, 14, cuda)
    w2.load_state_dict(unpack(parts["writer"], tensors))
    w2.begin_chunk(24)
    for c in range(8, 14):
        assert_same(w1, w2, c)
        for w in (w1, w2):
            w.commit([(k.cuda(), v.cuda()) for k, v in chunk_kv(c)], [3 * c, 3 * c + 1, 3 * c + 2])
            w.begin_chunk(3 * c + 3)
    if spec in ("field", "naive", "mixed:2"):
        assert all(t.is_pinned() for t in w2._components[0]._store)


def test_a_resume_state_of_another_head_count_is_refused_in_one_line():
    """A --split-heads process's cache holds H/N heads per slot: restoring it into a whole model must
    be refused (InputError naming the heads), not fail mid-chunk on a shape."""
    from dataclasses import replace

    from worldtrace_cli.errors import InputError

    saved = run(build_writer(MemoryConfig.of(cache="sliding"), DEFAULT_BUDGET), 4).state_dict()
    assert saved["heads"] == GEOM.heads
    other = build_writer(MemoryConfig.of(cache="sliding"), DEFAULT_BUDGET)
    other.reset(replace(GEOM, heads=GEOM.heads // 2))
    with pytest.raises(InputError, match=f"holds {GEOM.heads} heads per slot, this model {GEOM.heads // 2}"):
        other.load_state_dict(saved)
    older = {k: v for k, v in saved.items() if k != "heads"}  # states saved before heads were recorded
    same = build_writer(MemoryConfig.of(cache="sliding"), DEFAULT_BUDGET)
    same.reset(GEOM)
    same.load_state_dict(older)
