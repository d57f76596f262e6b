"""`worldtrace bench`: the mechanism benchmark measures what it claims; the speed bench runs on CPU
(smoke test: structure and memory bookkeeping, never timings)."""

import json

from click.testing import CliRunner

from worldtrace_cli.bench import SceneSetup, evaluate, speed_benchmark
from worldtrace_cli.cli import main

SETUP = SceneSetup()


def test_full_cache_is_the_reference_and_sliding_forgets_scene_a():
    full = evaluate("full", "actual", "ABA", 8, SETUP)
    assert full["mismatch"] == 0.0 and full["mismatch_content"] == 0.0
    assert full["scene_a_mass"] > 0.8
    sliding = evaluate("sliding", "actual", "ABA", 8, SETUP)
    assert sliding["scene_a_mass"] == 0.0 and sliding["mismatch"] > 1.9


def test_repositioning_changes_attention_and_content_mismatch_ignores_it():
    moved = evaluate("full", "block_relative", "ABA", 8, SETUP)
    assert moved["mismatch"] > 0.1 and moved["mismatch_content"] == 0.0


def test_summary_writers_keep_the_departed_scene():
    for writer in ("field", "naive", "landmark"):
        assert evaluate(writer, "slot_rank", "ABA", 8, SETUP)["scene_a_mass"] > 0.5, writer


def test_landmark_threshold_below_within_scene_noise_churns_scene_a_away():
    """tau = 0.1 fires on within-scene noise, so landmarks churn and the oldest (scene A) is evicted;
    tau = 0.3 keeps scene A (README: 'Benchmark findings')."""
    low = evaluate("landmark", "slot_rank", "ABCA", 32, SETUP, landmark_threshold=0.1)
    high = evaluate("landmark", "slot_rank", "ABCA", 32, SETUP, landmark_threshold=0.3)
    assert low["scene_a_mass"] < 0.05 < 0.5 < high["scene_a_mass"]


def test_mechanism_cli_writes_tables(tmp_path):
    result = CliRunner().invoke(main, ["bench", "mechanism", "--writers", "sliding,landmark", "--schemes", "slot_rank",
                                       "--routes", "ABA", "--legs", "2,4", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "mechanism.json").read_text())["rows"]
    assert len(rows) == 4 and "| landmark | slot_rank |" in (tmp_path / "mechanism.md").read_text()


def test_speed_bench_smoke_on_cpu():
    result = speed_benchmark("tiny", ("sliding", "field-streaming"), (2, 3), device="cpu", warmup_chunks=1)
    rows = result["rows"]
    assert [(r["cache"], r["chunks"]) for r in rows] == [("sliding", 2), ("sliding", 3),
                                                         ("field-streaming", 2), ("field-streaming", 3)]
    assert result["meta"]["device"] == "cpu" and result["meta"]["torch"]
    for r in rows:
        assert set(r["phase_seconds_per_chunk"]) == {"denoise", "context", "cache", "decode"}
        assert r["gpu_peak_bytes"] is None and r["rss_bytes"] > 0 and r["fps"] > 0
    assert rows[0]["kv_bytes"] == rows[1]["kv_bytes"]  # bounded cache: same bytes at 2 and 3 chunks
