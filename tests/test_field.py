"""WorldTrace Field writers (paper §3.3, Def. 2, Prop. 1, App. F) and the naive baseline (§2.2),
checked against closed forms and float64 brute force: uniform groups, mean attention preservation,
phase cancellation, streaming == recompute where their groups coincide, bounded drift, spill to disk,
slot-count flags, and an end-to-end tiny rollout of each writer."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import worldtrace_cli.memory.field as field_mod
from worldtrace_cli.errors import InputError, OutputError
from worldtrace_cli.memory import CacheGeometry, MemoryConfig, build_writer
from worldtrace_cli.memory.field import FieldWriter
from worldtrace_cli.memory.field_streaming import FieldStreamingWriter
from worldtrace_cli.memory.naive import NaiveWriter
from worldtrace_cli.writer_options import resolve_slots
from worldtrace_cli.model.rope import MainRope
from worldtrace_cli.outputs.records import expand_slot_records

FIXTURES = Path(__file__).parent / "data" / "fixtures"
# head_dim 24: temporal pairs with omega = 1, 0.1, 0.01, 0.001 (axis_channels -> 8 temporal channels)
GEOM = CacheGeometry(num_layers=2, heads=2, head_dim=24, tokens_per_frame=4, frames_per_chunk=3)
FRAME_SHAPE = (1, GEOM.tokens_per_frame, GEOM.heads, GEOM.head_dim)
ROPE = MainRope(GEOM.head_dim)


def writer(cache, ns=4, nr=2, **kw):
    w = build_writer(MemoryConfig.of(cache=cache, summary_slots=ns, recent_slots=nr, **kw), 3)
    w.reset(GEOM)
    return w


def random_frame(gen, scale=1.0):
    """Per layer (k, v) [1, T, H, D] float32."""
    return [(scale * torch.randn(FRAME_SHAPE, generator=gen), torch.randn(FRAME_SHAPE, generator=gen))
            for _ in range(GEOM.num_layers)]


def commit(w, frames, ids):
    """Commit latent frames (per layer (k, v) [1, T, H, D]) as one chunk."""
    layers = [(torch.cat([f[l][0] for f in frames], 1), torch.cat([f[l][1] for f in frames], 1))
              for l in range(GEOM.num_layers)]
    w.commit(layers, list(ids))


def read_slots(w, layer):
    """Per slot (k, v) [1, T, H, D] of one layer, in slots() order."""
    k, v, _ = w.read(layer)
    t = GEOM.tokens_per_frame
    return [(k[:, i:i + t], v[:, i:i + t]) for i in range(0, k.shape[1], t)]


def uniform(m, n):
    """Uniform contiguous groups of evicted indices 0..m-1, boundaries floor(s*m/n) (via float numpy)."""
    b = np.floor(np.arange(n + 1) * m / n + 1e-9).astype(int)
    return [list(range(b[s], b[s + 1])) for s in range(n)]


def at(k, position):
    """Rotate k [1, T, H, D] (float64) to one temporal position with MainRope."""
    return ROPE.apply_temporal(k, torch.full((k.shape[1],), float(position), dtype=torch.float64))


def brute(frames, group, layer, cache):
    """Float64 slot (k, v) of one group: field = canonical mean; naive = R(-c) mean_i R(t_i) k_i."""
    ks = [frames[i][layer][0].double() for i in group]
    v = torch.stack([frames[i][layer][1].double() for i in group]).mean(0)
    if cache == "naive":
        c = sum(group) / len(group)
        return at(torch.stack([at(k, i) for k, i in zip(ks, group)]).mean(0), -c), v
    return torch.stack(ks).mean(0), v


@pytest.mark.parametrize("cache", ["field", "naive"])
def test_slots_are_means_of_uniform_contiguous_groups(cache):
    ns, nr = 4, 2
    w, gen, frames = writer(cache, ns, nr), torch.Generator().manual_seed(0), []
    for c in range(40):
        new = [random_frame(gen) for _ in range(3)]
        frames += new
        commit(w, new, range(3 * c, 3 * c + 3))
        m = max(0, len(frames) - nr)
        groups = [g for g in uniform(m, ns) if g]
        slots = w.slots()
        assert [s.kind for s in slots] == [cache] * len(groups) + ["recent"] * min(nr, len(frames))
        assert [s.role for s in slots] == ["summary"] * len(groups) + ["recent"] * min(nr, len(frames))
        assert [list(s.frames) for s in slots[:len(groups)]] == groups
        assert sum(groups, []) == list(range(m)), "oldest to newest, every evicted frame once"
        for layer in range(GEOM.num_layers):
            got = read_slots(w, layer)
            for (k, v), g in zip(got, groups):
                ek, ev = brute(frames, g, layer, cache)
                assert torch.allclose(k.double(), ek, atol=2e-6) and torch.allclose(v.double(), ev, atol=2e-6)
            for (k, v), fid in zip(got[len(groups):], range(m, len(frames))):
                assert torch.equal(k, frames[fid][layer][0]) and torch.equal(v, frames[fid][layer][1])
    assert w.host_bytes() == 118 * 2 * GEOM.num_layers * 4 * 2 * 24 * 4  # M frames x K,V x layers x fp32


def test_drift_is_bounded_by_the_periodic_exact_recompute(monkeypatch):
    """Huge keys pass through the newest slot and leave it: float32 add/subtract leaves a residue of
    ~eps * 1e7 in its running sum. The exact recompute after <= 64 incremental updates removes it;
    with the recompute disabled the residue stays."""
    def run():
        w, gen, frames = writer("field", ns=2, nr=1), torch.Generator().manual_seed(1), []
        for c in range(100):
            new = [random_frame(gen, scale=1e7 if 3 <= 3 * c + i < 9 else 1.0) for i in range(3)]
            frames += new
            commit(w, new, range(3 * c, 3 * c + 3))
            read_slots(w, 0)
            assert max(w._components[0]._updates) <= field_mod.REFRESH_EVERY
        g = uniform(len(frames) - 1, 2)[1]
        return (read_slots(w, 0)[1][0].double() - brute(frames, g, 0, "field")[0]).abs().max().item()

    assert run() < 1e-5
    monkeypatch.setattr(field_mod, "REFRESH_EVERY", 10 ** 9)
    assert run() > 1e-3


@pytest.mark.parametrize("position", [-6.0, -2.5, 0.0, 1234.25])
def test_prop1_mean_attention_preservation(position):
    """<q, R(p) mean_i k_i> == mean_i <q, R(p) k_i> for every query, at any virtual position p."""
    w, gen, frames = writer("field", ns=3, nr=2), torch.Generator().manual_seed(2), []
    for c in range(8):
        new = [random_frame(gen) for _ in range(3)]
        frames += new
        commit(w, new, range(3 * c, 3 * c + 3))
    q = torch.randn(16, GEOM.heads, GEOM.head_dim, generator=gen, dtype=torch.float64)
    slots = w.slots()
    for (k, _), slot in zip(read_slots(w, 1), slots[:3]):
        assert len(slot.frames) >= 7
        score = torch.einsum("qhd,thd->hqt", q, at(k.double(), position)[0])
        src = torch.stack([torch.einsum("qhd,thd->hqt", q, at(frames[i][1][0].double(), position)[0])
                           for i in slot.frames])
        assert torch.allclose(score, src.mean(0), atol=1e-5)


def phase_case(cache, n_frames, gap=1, ns=1):
    """Every frame has the same canonical key; returns (slot keys, the key) after n_frames evictions."""
    gen = torch.Generator().manual_seed(3)
    frame = random_frame(gen)
    w = writer(cache, ns=ns, nr=1)
    for i in range(n_frames + 1):
        commit(w, [frame], [gap * i])
    return [k.double() for k, _ in read_slots(w, 0)[:-1]], frame[0][0].double(), w


def pair_norms(k):
    """Norm of each temporal RoPE pair over tokens and heads: [t_ch / 2]."""
    t = k[..., :ROPE.t_ch]
    return (t[..., 0::2] ** 2 + t[..., 1::2] ** 2).sum(dim=(0, 1, 2)).sqrt()


@pytest.mark.parametrize("n,gap", [(2, 1), (4, 1), (16, 1), (64, 1), (4, 3)])
def test_phase_cancellation_closed_form(n, gap):
    """§2.2: per temporal pair j the naive slot is k_j scaled by |mean_i exp(i w_j t_i)| (Dirichlet
    kernel); the field slot of the same sources is k itself."""
    (naive,), k, _ = phase_case("naive", n, gap)
    (fld,), _, _ = phase_case("field", n, gap)
    assert torch.allclose(fld, k, atol=1e-6)
    t = gap * np.arange(n)
    expected = np.abs(np.exp(1j * np.outer(ROPE.omega_t.numpy(), t)).mean(1))
    assert np.allclose((pair_norms(naive) / pair_norms(k)).numpy(), expected, atol=1e-5)
    assert torch.allclose(naive[..., ROPE.t_ch:], k[..., ROPE.t_ch:], atol=1e-6), "spatial channels keep"
    assert naive.norm().item() < k.norm().item() == pytest.approx(fld.norm().item())


def test_naive_norm_shrinks_with_spread_and_recovers_with_more_slots():
    key = phase_case("naive", 1)[1]
    norms = [phase_case("naive", n)[0][0].norm().item() for n in (1, 2, 4, 8, 16, 32, 64)]
    assert norms[0] == pytest.approx(key.norm().item(), rel=1e-6)
    assert all(a > b for a, b in zip(norms, norms[1:])), "more frames per slot: more cancellation"
    gaps = [phase_case("naive", 4, gap)[0][0].norm().item() for gap in (1, 2, 3)]
    assert gaps[0] > gaps[1] > gaps[2], "larger time gaps: more cancellation"
    ratio = pair_norms(phase_case("naive", 64)[0][0]) / pair_norms(key)
    assert ratio[0] < 0.05 and ratio[-1] > 0.99, "fast pair ~0, slow pair intact"
    # fixed history: more slots -> shorter groups -> less cancellation (mean slot norm grows with N_s)
    by_ns = [np.mean([s.norm().item() for s in phase_case("naive", 64, ns=ns)[0]]) for ns in (1, 2, 4, 8)]
    assert all(a < b for a, b in zip(by_ns, by_ns[1:]))


@pytest.mark.parametrize("ns", [3, 4])
def test_streaming_equals_recompute_where_groups_coincide(ns):
    nr, gen = 2, torch.Generator().manual_seed(4)
    rec, stream, frames = writer("field", ns, nr), writer("field-streaming", ns, nr), []
    comp = stream._components[0]
    checked, state = 0, set()
    for fid in range(ns * 16 + nr):
        frames.append(random_frame(gen))
        commit(rec, frames[-1:], [fid])
        commit(stream, frames[-1:], [fid])
        m = fid + 1 - nr
        counts = [len(s.frames) for s in stream.slots()[:-nr]]
        assert sum(counts) == max(0, m) and len(counts) == min(max(0, m), ns), "every slot used"
        assert all(a >= b for a, b in zip(counts, counts[1:])) and all(a & (a - 1) == 0 for a in counts[:-1])
        for layer in range(GEOM.num_layers):  # buckets are exact means of their own sources
            for (k, v), s in zip(read_slots(stream, layer), stream.slots()):
                ek, ev = brute(frames, list(s.frames), layer, "field")
                assert torch.allclose(k.double(), ek, atol=2e-6) and torch.allclose(v.double(), ev, atol=2e-6)
        if m > 0 and (m <= ns or (m % ns == 0 and (m // ns) & (m // ns - 1) == 0)):
            assert stream.slots() == rec.slots()
            for layer in range(GEOM.num_layers):
                for (a, b), (c, d) in zip(read_slots(stream, layer), read_slots(rec, layer)):
                    assert torch.allclose(a, c, atol=2e-6) and torch.allclose(b, d, atol=2e-6)
            checked += 1
        if m >= ns:
            state.add((comp.state_bytes(), sum(t.numel() for t in vars(comp).values()
                                               if isinstance(t, torch.Tensor))))
        assert stream.host_bytes() == 0
        assert rec.host_bytes() == max(0, m) * 2 * GEOM.num_layers * 4 * 2 * 24 * 4  # linear in M
    assert checked == ns + 4 and len(state) == 1


def test_spill_dir_gives_the_same_slots_as_host_storage(tmp_path):
    frames = [random_frame(torch.Generator().manual_seed(i)) for i in range(60)]
    host, disk = writer("field"), writer("field", spill_dir=str(tmp_path))
    for c in range(20):
        for w in (host, disk):
            commit(w, frames[3 * c:3 * c + 3], range(3 * c, 3 * c + 3))
        assert host.slots() == disk.slots()
        for layer in range(GEOM.num_layers):
            assert all(torch.equal(a, b) for a, b in zip(host.read(layer), disk.read(layer)))
    comp = disk._components[0]
    assert all(isinstance(p, Path) for p in comp._store), "no RAM copy once spilled"
    files = sorted(tmp_path.glob("field-*/*.safetensors"))
    assert len(files) == 58 and disk.host_bytes() == sum(f.stat().st_size for f in files)
    assert disk.describe()["field"]["store"] == "disk" and host.describe()["field"]["store"] == "host"
    del comp
    disk.reset(GEOM)  # new components: the old one (and its folder) is garbage-collected
    assert not any(f.exists() for f in files), "a new rollout removes the old spill folder"


def test_unwritable_spill_dir_is_an_output_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OutputError, match="--spill-dir"):
        writer("field", spill_dir=str(blocker))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cache", ["field", "field-streaming", "naive"])
def test_cuda_matches_cpu(cache):
    """Pinned host store, non-blocking copies and device sums give the CPU writer's slots."""
    cuda = CacheGeometry(**{**GEOM.__dict__, "device": torch.device("cuda")})
    cpu_w, gpu_w = writer(cache), build_writer(MemoryConfig.of(cache=cache, summary_slots=4, recent_slots=2), 3)
    gpu_w.reset(cuda)
    gen = torch.Generator().manual_seed(7)
    for c in range(30):
        new = [random_frame(gen) for _ in range(3)]
        commit(cpu_w, new, range(3 * c, 3 * c + 3))
        commit(gpu_w, [[(k.cuda(), v.cuda()) for k, v in f] for f in new], range(3 * c, 3 * c + 3))
        assert cpu_w.slots() == gpu_w.slots()
        for layer in range(GEOM.num_layers):
            for a, b in zip(cpu_w.read(layer)[:2], gpu_w.read(layer)[:2]):
                assert b.is_cuda and torch.allclose(a, b.cpu(), atol=1e-5)
    if cache != "field-streaming":
        assert all(t.is_pinned() for t in gpu_w._components[0]._store)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_host_store_reserved_at_reset_is_carved_without_page_locking():
    """issue 45: reserve_host(frames) page-locks the store's slabs at reset; 30 chunks then allocate no
    slab, and the slots equal a writer's without the reservation."""
    cuda = CacheGeometry(**{**GEOM.__dict__, "device": torch.device("cuda")})
    plain, ahead = (build_writer(MemoryConfig.of(cache="field", summary_slots=4, recent_slots=2), 3) for _ in "ab")
    plain.reset(cuda)
    ahead.reset(cuda)
    assert ahead.reserve_host(90) > 0
    made = ahead._components[0]._arena.slabs_made
    gen = torch.Generator().manual_seed(7)
    for c in range(30):
        new = [[(k.cuda(), v.cuda()) for k, v in random_frame(gen)] for _ in range(3)]
        commit(plain, new, range(3 * c, 3 * c + 3))
        commit(ahead, new, range(3 * c, 3 * c + 3))
    assert ahead._components[0]._arena.slabs_made == made
    for layer in range(GEOM.num_layers):
        assert all(torch.equal(a, b) for a, b in zip(plain.read(layer)[:2], ahead.read(layer)[:2]))


@pytest.mark.parametrize("flags,counts", [
    ({}, (4, 2)),
    ({"summary_slots": 2, "recent_slots": 4}, (2, 4)),
    ({"budget": 8}, (6, 2)),
    ({"budget": 3}, (1, 2)),
    ({"budget": 1}, (0, 1)),
    ({"budget": 6, "recent_slots": 5}, (1, 5)),
    ({"budget": 6, "summary_slots": 5}, (5, 1)),
])
@pytest.mark.parametrize("cache", ["field", "field-streaming", "naive"])
def test_budget_and_slot_flags(cache, flags, counts):
    cfg = MemoryConfig.of(cache=cache, **flags)
    assert resolve_slots(cfg) == counts
    w = build_writer(cfg, 3)
    w.reset(GEOM)
    gen = torch.Generator().manual_seed(6)
    for c in range(12):
        commit(w, [random_frame(gen) for _ in range(3)], range(3 * c, 3 * c + 3))
    kinds = [s.kind for s in w.slots()]
    summary_kind = "naive" if cache == "naive" else "field"
    assert kinds == [summary_kind] * counts[0] + ["recent"] * counts[1] and w.budget == sum(counts)


def test_inconsistent_slot_flags_are_input_errors():
    with pytest.raises(InputError, match="--budget"):
        build_writer(MemoryConfig.of(cache="field", budget=5, summary_slots=2, recent_slots=2), 3)
    with pytest.raises(InputError, match="--recent-slots"):
        build_writer(MemoryConfig.of(cache="field-streaming", recent_slots=0), 3)


def test_writers_register_with_their_default_positions():
    assert (FieldWriter.default_positions, FieldStreamingWriter.default_positions,
            NaiveWriter.default_positions) == ("slot_rank", "slot_rank", "block_relative")


# --- end to end on the tiny DiT (the pattern of tests/test_rollout.py) ---

@pytest.mark.parametrize("cache", ["field", "field-streaming", "naive"])
def test_tiny_rollout_end_to_end(cache, dit):
    from worldtrace_cli.model.sampler import FlowMatchSchedule
    from worldtrace_cli.engine.rollout import Rollout

    hw, chunks = (4, 8), 12
    gen = torch.Generator().manual_seed(11)
    rows = 12 * chunks - 3
    cond = torch.cat([torch.zeros(1, 4, 1, *hw), torch.randn(1, 16, 1, *hw, generator=gen)], 1)

    class Conditioning:
        def cond_concat(self, start, count):
            out = cond.expand(-1, -1, count, -1, -1).clone()
            out[:, :4, 0] = float(start == 0)
            return out

    w = build_writer(MemoryConfig.of(cache=cache), dit.cfg.local_attn_size - 3)
    roll = Rollout(dit, w, Conditioning(), torch.randn(1, 257, 1280, generator=gen),
                   (torch.rand(1, rows, 4, generator=gen) > 0.5).float(), torch.zeros(1, rows, 2),
                   FlowMatchSchedule(), 0, torch.device("cpu"), hw)
    for c in range(chunks):
        rec = json.loads(json.dumps(roll.step().record))
        slots = expand_slot_records(rec["cache"]["slots"])
        m = max(0, 3 * c - 2)
        groups = [g for g in uniform(m, 4) if g] if cache != "field-streaming" or m <= 4 else None
        field = [s["frames"] for s in slots if s["kind"] in ("field", "naive")]
        assert sum(field, []) == list(range(m)) and len(field) == min(m, 4)
        assert groups is None or field == groups
        assert [s["frames"] for s in slots if s["kind"] == "recent"] == [[f] for f in range(m, 3 * c)]
        assert torch.isfinite(torch.tensor(rec["latents"]["mean"]))
    assert roll.writer.describe()["field"]["groups"]
