"""`worldtrace bench`: the mechanism benchmark measures what it claims; the speed bench runs on CPU
(smoke test: structure and memory bookkeeping, never timings)."""

import json

from click.testing import CliRunner

from worldtrace_cli.jobs.bench_mechanism import SceneSetup, evaluate
from worldtrace_cli.jobs.bench_speed import speed_benchmark, speed_markdown
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
                                       "--routes", "ABA", "--legs", "2,4", "--seed", "7", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "mechanism.json").read_text())["rows"]
    assert json.loads((tmp_path / "mechanism.json").read_text())["meta"]["setup"]["seed"] == 7
    assert len(rows) == 4 and "| landmark | slot_rank |" in (tmp_path / "mechanism.md").read_text()
    assert result.stdout.strip() == str(tmp_path / "mechanism.md")  # one scriptable line on stdout


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
    for r in rows:  # chunk 0's wall clock is part of the one warm-up chunk's; both are per run, not per snapshot
        assert 0 < r["first_chunk_seconds"] <= r["warmup_seconds"]
    assert rows[0]["warmup_seconds"] == rows[1]["warmup_seconds"] and rows[2]["first_chunk_seconds"] != rows[0]["first_chunk_seconds"]
    assert "Budgets differ (sliding 3, field-streaming 6 past latent frames)" in speed_markdown(result)
    bare = speed_benchmark("tiny", ("sliding",), (1,), device="cpu", decode=False, warmup_chunks=0)["rows"][0]
    assert bare["first_chunk_seconds"] is None and bare["warmup_seconds"] is None  # nothing excluded, nothing apart
    summary = {(e["cache"], e["chunks"]): e for e in result["summary"]}
    assert summary[("sliding", 3)]["vs_reference"] == 1.0
    assert summary[("field-streaming", 3)]["vs_reference"] == rows[3]["seconds_per_chunk"] / rows[1]["seconds_per_chunk"]


def test_speed_bench_repeats_interleave_writers_and_take_medians():
    result = speed_benchmark("tiny", ("sliding", "landmark"), (2,), device="cpu", decode=False, repeats=3,
                             budget=6)
    assert [(r["cache"], r["repeat"]) for r in result["rows"]] == [
        ("sliding", 0), ("landmark", 0), ("sliding", 1), ("landmark", 1), ("sliding", 2), ("landmark", 2)]
    assert {r["budget"] for r in result["rows"]} == {6}
    for entry in result["summary"]:
        runs = sorted(r["seconds_per_chunk"] for r in result["rows"] if r["cache"] == entry["cache"])
        assert entry["seconds_per_chunk"] == runs[1]  # the median of three
        assert entry["fps"] is None and entry["wall_seconds_per_chunk"] > 0
    assert "Budgets differ" not in speed_markdown(result)  # one budget: the ratio is like for like
    first = {r["cache"]: r["seconds_per_chunk"] for r in result["rows"] if r["repeat"] == 0}
    landmark = next(e for e in result["summary"] if e["cache"] == "landmark")
    assert landmark["first_run_seconds_per_chunk"] == first["landmark"]  # a fresh process's run, not the median
    assert landmark["first_run_vs_reference"] == first["landmark"] / first["sliding"]
    md = speed_markdown(result)
    assert "first run x sliding |" in md and f"| {first['landmark']:.3f} | {first['landmark'] / first['sliding']:.3f} |" in md
    once = speed_benchmark("tiny", ("sliding",), (2,), device="cpu", decode=False, warmup_chunks=0)
    assert "first run" not in speed_markdown(once)  # one repeat: the median is the first run


def test_speed_cli_writes_json_and_markdown(tmp_path):
    result = CliRunner().invoke(main, ["bench", "speed", "--caches", "sliding", "--chunks", "2", "--device", "cpu",
                                       "--no-decode", "--budget", "6", "--rope-precision", "float64",
                                       "-o", str(tmp_path), "--name", "smoke"])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "smoke.json").read_text())
    assert data["meta"]["rope_precision"] == "float64" and data["meta"]["budget"] == 6 and data["meta"]["command"]
    assert "| sliding | 6 | 2 |" in (tmp_path / "smoke.md").read_text()
    bad = CliRunner().invoke(main, ["bench", "speed", "--compile", "fastest"])
    assert bad.exit_code == 2 and "fastest" in bad.output


def test_bad_bench_lists_are_usage_errors_before_anything_runs(tmp_path):
    """Comma-separated lists are checked at parse time: one usage error naming the option (exit 2),
    no traceback, nothing written."""
    cases = [
        (["speed", "--chunks", "abc"], "--chunks: 'abc': comma-separated integers expected"),
        (["speed", "--chunks", "3,-1"], "--chunks: every value must be >= 1"),
        (["speed", "--chunks", ","], "--chunks: at least one value expected"),
        (["speed", "--warmup", "-2"], "--warmup:"),
        (["speed", "--caches", "sliding,nosuch"], "unknown writer 'nosuch'"),
        (["mechanism", "--legs", "0"], "--legs: every value must be >= 1"),
        (["mechanism", "--routes", "ABA,A"], "--routes: 'A': a route is two or more scene letters"),
        (["mechanism", "--writers", "nosuch"], "unknown writer 'nosuch'"),
        (["mechanism", "--schemes", "nosuch"], "--schemes: unknown scheme 'nosuch'"),
        (["mechanism", "--routes", "ABA,AB"], "--routes: 'AB': the last scene is the return"),
        (["speed", "--caches", "sliding,mixed:x"], "mixed:x: expected mixed:k with k an integer"),
        (["mechanism", "--writers", "worldkv:2"], "worldkv:2: expected worldkv:r with r the keep ratio"),
        (["speed", "--caches", "sliding:3"], "sliding:3: sliding takes no ':' argument"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["bench", *args, "-o", str(tmp_path / "out")])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), args
    assert not (tmp_path / "out").exists()
