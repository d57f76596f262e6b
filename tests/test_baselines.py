"""Baselines faithful to their releases (paper App. E), window-derived defaults (Eq. 2), flags a
writer would ignore, the registry, and YaRN in the mechanism benchmark."""

import math
import pkgutil
import sys

import pytest
import torch

import worldtrace_cli.memory as memory
from worldtrace_cli.jobs.bench_mechanism import evaluate, mechanism_benchmark, SceneSetup
from worldtrace_cli.errors import InputError
from worldtrace_cli.memory import SCHEMES, WRITERS, CacheGeometry, MemoryConfig, build_writer, example_specs

UNIVERSAL = CacheGeometry(num_layers=2, heads=2, head_dim=24, tokens_per_frame=4, frames_per_chunk=3, trained_offset=5)
GTA = CacheGeometry(num_layers=2, heads=2, head_dim=24, tokens_per_frame=4, frames_per_chunk=3, trained_offset=3)
SHAPE = (1, 3 * UNIVERSAL.tokens_per_frame, UNIVERSAL.heads, UNIVERSAL.head_dim)
WORLDTRACE = ["field", "field-streaming", "landmark", "mixed:2", "naive"]


def frame_valued_chunk(c):
    """Chunk c's canonical K/V: every entry of latent frame f equals f (and -f for V)."""
    k = torch.cat([torch.full((1, 4, 2, 24), float(f)) for f in range(3 * c, 3 * c + 3)], 1)
    return [(k, -k) for _ in range(2)]


def random_chunk(c):
    gen = torch.Generator().manual_seed(c)
    return [(torch.randn(SHAPE, generator=gen), torch.randn(SHAPE, generator=gen)) for _ in range(2)]


def run(spec, chunks, geometry=UNIVERSAL, make=frame_valued_chunk, **kw):
    w = build_writer(MemoryConfig.of(cache=spec, **kw), geometry.trained_offset + 1 - geometry.frames_per_chunk)
    w.reset(geometry)
    if w.needs_poses:  # pose-retrieval writers get the camera as the rollout gives it
        from test_memory_contract import loop_poses

        w.set_poses(loop_poses(3 * chunks + 3))
    for c in range(chunks):
        w.begin_chunk(3 * c)
        w.commit(make(c), [3 * c, 3 * c + 1, 3 * c + 2])
    w.begin_chunk(3 * chunks)
    return w


# --- MemRoPE (release: YoungRaeKimm/MemRoPE, wan/modules/causal_model.py) ---

def ema_closed_form(chunk_means, alpha):
    """e_1 = m_1; e_c = (1 - alpha) e_{c-1} + alpha m_c, one step per chunk (float64)."""
    e = chunk_means[0]
    for m in chunk_means[1:]:
        e = (1 - alpha) * e + alpha * m
    return e


def test_memrope_updates_its_emas_once_per_chunk_with_the_chunks_evicted_mean():
    chunks = 30
    w = run("memrope", chunks)  # MG2 window: 1 sink + long + short + 3 recent
    slots = w.slots()
    assert [s.kind for s in slots] == ["sink", "ema", "ema", "recent", "recent", "recent"]
    assert slots[0].frames == (0,) and [s.frames for s in slots[3:]] == [(87,), (88,), (89,)]
    # commit c evicts frames 3c-3 .. 3c-1; frame 0 went to the sink, so chunk 1 folds frames 1 and 2
    means = [1.5] + [3 * c - 2.0 for c in range(2, chunks)]
    k, v, _ = w.read(1)
    t = UNIVERSAL.tokens_per_frame
    for i, alpha in ((1, 0.01), (2, 0.1)):
        expected = ema_closed_form(means, alpha)
        assert torch.allclose(k[:, i * t:(i + 1) * t].double(), torch.full_like(k[:, :t].double(), expected), atol=1e-4)
        assert torch.allclose(v[:, i * t:(i + 1) * t].double(), torch.full_like(v[:, :t].double(), -expected), atol=1e-4)
        assert slots[i].time == pytest.approx(expected)
        per_frame = ema_closed_form([1.0, 2.0] + [float(f) for f in range(3, 87)], alpha)
        assert abs(per_frame - expected) > 0.5, "a per-latent-frame update would run about 3x too fast"


def test_memrope_reads_rank_contiguous_positions_like_its_release():
    w = run("memrope", 40)
    assert w.positions_scheme == "rank"
    assert w.positions().tolist() == [-6.0, -5.0, -4.0, -3.0, -2.0, -1.0]
    # the paper's Table 9 configurations stay one flag away
    assert run("memrope", 40, positions="slot_rank").positions().tolist() == [-6.0, -5.0, -4.0, -3.0, -2.0, -1.0]
    capped = run("memrope", 40, positions="block_relative").positions().tolist()
    assert capped[:3] == [-3.0, -3.0, -3.0]  # Remark 1: sink and both EMA slots collapse at F - 1 - Delta


def test_memrope_sizes_follow_sink_frames_and_budget():
    w = run("memrope", 10, sink_frames=2, budget=7)
    assert [s.kind for s in w.slots()] == ["sink", "sink", "ema", "ema", "recent", "recent", "recent"]
    assert w.describe()["ema_update"].startswith("once per chunk")


# --- StreamingLLM sink ---

def test_sink_reads_its_sink_at_rank_positions_at_chunk_39():
    w = run("sink", 39)
    assert w.positions_scheme == "rank" and [s.frames for s in w.slots()] == [(0,), (115,), (116,)]
    assert w.positions().tolist() == [-3.0, -2.0, -1.0]
    assert run("sink", 39, positions="actual").positions().tolist() == [-117.0, -2.0, -1.0]


def test_rank_scheme_is_registered_and_equals_slot_rank_for_every_writer():
    assert "rank" in SCHEMES
    for spec in example_specs():
        if spec in ("full", "yarn"):
            continue
        a, b = run(spec, 15, positions="rank"), run(spec, 15, positions="slot_rank")
        assert torch.equal(a.positions(), b.positions()), spec


# --- defaults from the model's window (Eq. 2) ---

@pytest.mark.parametrize("spec", WORLDTRACE + ["memrope"])
def test_defaults_follow_the_window_so_no_slot_falls_below_t_min(spec):
    for geometry, budget in ((UNIVERSAL, 6), (GTA, 4)):
        w = run(spec, 40, geometry=geometry, make=random_chunk)
        assert w.budget == len(w.slots()) == budget == geometry.trained_offset + 1
        t_min_offset = -1 - geometry.trained_offset  # t_min = q - Delta with q = a - 1
        assert w.positions().min().item() >= t_min_offset, (spec, geometry.trained_offset)
    assert (run(spec, 3).n_summary, run(spec, 3).n_recent) == ((4, 2) if spec != "memrope" else (3, 3))
    if spec != "memrope":
        assert (run(spec, 3, geometry=GTA).n_summary, run(spec, 3, geometry=GTA).n_recent) == (2, 2)


def test_explicit_sizes_still_win_and_mixed_checks_k_against_the_windows_summary_slots():
    assert run("field", 5, geometry=GTA, summary_slots=4, recent_slots=2).budget == 6
    with pytest.raises(InputError, match="mixed:3"):
        run("mixed:3", 1, geometry=GTA)


# --- flags a writer would ignore, invalid values ---

@pytest.mark.parametrize("spec,flags,flag", [
    ("memrope", {"summary_slots": 2}, "--summary-slots"),
    ("memrope", {"recent_slots": 3}, "--recent-slots"),
    ("memrope", {"budget": 3}, "--budget"),
    ("sink", {"summary_slots": 1}, "--summary-slots"),
    ("sink", {"recent_slots": 2}, "--recent-slots"),
    ("sliding", {"summary_slots": 4}, "--summary-slots"),
    ("sliding", {"recent_slots": 2}, "--recent-slots"),
    ("full", {"summary_slots": 4}, "--summary-slots"),
    ("full", {"budget": 6}, "--budget"),
    ("yarn", {"recent_slots": 2}, "--recent-slots"),
    ("yarn", {"budget": 6}, "--budget"),
    ("landmark", {"spill_dir": "x"}, "--spill-dir"),
    ("field-streaming", {"spill_dir": "x"}, "--spill-dir"),
    ("sliding", {"spill_dir": "x"}, "--spill-dir"),
    ("landmark", {"landmark_threshold": math.nan}, "--landmark-threshold"),
    ("landmark", {"landmark_threshold": 0.0}, "--landmark-threshold"),
    ("mixed:2", {"landmark_threshold": -0.1}, "--landmark-threshold"),
    ("landmark", {"landmark_threshold": 2.5}, "--landmark-threshold"),
    ("sink", {"sink_frames": 0}, "--sink-frames"),
    ("sink", {"sink_frames": 3}, "--sink-frames"),  # the default budget (3): the sinks alone only with --budget 3
    ("sink", {"sink_frames": 4, "budget": 3}, "--sink-frames"),  # above the budget
    ("full", {"max_cache_gb": 0.0}, "--max-cache-gb"),
    ("yarn", {"max_cache_gb": math.inf}, "--max-cache-gb"),
    ("full", {"max_cache_gb": math.nan}, "--max-cache-gb"),
    ("field", {"budget": -1}, "--budget"),
])
def test_a_writer_refuses_flags_it_would_ignore_or_invalid_values(spec, flags, flag):
    with pytest.raises(InputError) as err:
        build_writer(MemoryConfig.of(cache=spec, **flags), 3)
    message = str(err.value)
    assert message.startswith(flag) and "\n" not in message and len(message) < 200


def test_defaults_are_accepted_by_every_writer():
    for spec in example_specs():
        build_writer(MemoryConfig.of(cache=spec), 3)
    assert run("field", 2, spill_dir=None).budget == 6


# --- registry ---

def test_every_module_of_the_memory_package_is_imported_and_every_writer_has_an_example():
    names = {m.name for m in pkgutil.iter_modules(memory.__path__)}
    assert {f"worldtrace_cli.memory.{n}" for n in names} <= set(sys.modules)
    assert sorted(spec.split(":")[0] for spec in example_specs()) == sorted(WRITERS)
    assert all(line and "\n" not in line for line in memory.descriptions().values())


# --- YaRN in the mechanism benchmark ---

def test_bench_mechanism_applies_yarns_frequency_scaling():
    full = evaluate("full", "actual", "ABA", 8, SceneSetup())
    yarn = evaluate("yarn", "actual", "ABA", 8, SceneSetup())
    assert full["mismatch"] == 0.0 and yarn["mismatch"] > 0.01
    assert yarn["scene_a_mass"] != full["scene_a_mass"] and yarn["mismatch_content"] == 0.0


def test_bench_mechanism_runs_every_registered_writer_by_default():
    rows = mechanism_benchmark(schemes=["rank"], routes=("ABA",), legs=(2,))
    assert [r["writer"] for r in rows] == example_specs()
