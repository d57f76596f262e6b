"""``loopbench report``: aggregate a sweep folder into the paper's tables and two plots.

Statistics follow Tab. "loopbench_full": the unit is the scene (conditioning image). Each scene's
runs are averaged over seeds (and over configurations, for a tier), then the mean over scenes is
reported with the 95% confidence half-width ``t_{0.975, n-1} * sd / sqrt(n)`` (no CI for one
scene). Writers are compared with ``sliding`` by a paired t-test (scipy ``ttest_rel``) over runs
matched on (configuration, scene, seed); with fewer than 2 pairs no p-value is given.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from ..errors import InputError, OutputError
from ..outputs import atomic_path, write_json_atomic
from ..runs import RunFolder
from ..schemas import SCHEMA_VERSION
from ..trajectory import frames_for_chunks
from .configs import is_aba, tier_of
from .names import BASELINE, METRICS, metrics_of, writers_of
from .plan import FAILED_NAME
from .plots import plot_pac_vs_chunks, plot_tiers
from .tables import markdown

ROW_FIELDS = ("config", "tier", "cache", "prefix", "image", "seed", "chunks", "pac", "temp_ssim", "scene_drift",
              "latent_diff", "gt_psnr", "gt_ssim", "gt_detail", "gt_return_psnr", "gt_return_ssim", "gt_return_detail",
              "recall_attention", "recall_lift", "attention_self", "ref_psnr", "ref_ssim", "s_per_chunk", "kv_bytes",
              "peak_rss_bytes", "gpu_peak_bytes", "run_dir")


# --------------------------------------------------------------------------- rows


def _row(out_dir: Path, summary_path: Path) -> dict | None:
    summary = json.loads(summary_path.read_text())
    if summary.get("status") != "complete":
        return None
    rel = summary_path.parent.relative_to(out_dir)
    metrics = summary.get("metrics") or {}
    pac = metrics.get("pac")
    totals = summary.get("totals", {})
    config = rel.parts[0].split("@")[0]  # config@<prefix>: a prefixed job (plan.prefix_tag)
    gt = metrics.get("gt") or {}
    ret = gt.get("return") or {}
    prefix = (summary.get("prefix") or {}).get("source")
    cache = summary.get("config", {}).get("memory", {}).get("cache", rel.parts[1])
    cont = metrics.get("continuation") or {}
    return {"config": config, "tier": tier_of(config),
            # a prefixed run is its own writer row (cache@prefix), reported beside the free one
            "cache": cache if prefix is None else f"{cache}@{prefix}", "prefix": prefix or "free",
            "ref_psnr": cont.get("psnr"), "ref_ssim": cont.get("ssim"),
            "image": rel.parts[2], "seed": summary.get("resolved", {}).get("seed"),
            "chunks": totals.get("chunks"),
            "pac": pac.get("mean") if isinstance(pac, dict) else None,
            "temp_ssim": metrics.get("temp_ssim"), "scene_drift": metrics.get("scene_drift"),
            "latent_diff": metrics.get("latent_diff"), "gt_psnr": gt.get("psnr"), "gt_ssim": gt.get("ssim"),
            "gt_detail": gt.get("detail"), "gt_return_psnr": ret.get("psnr"), "gt_return_ssim": ret.get("ssim"),
            "gt_return_detail": ret.get("detail"),
            "recall_attention": ((summary.get("attention") or {}).get("recall") or {}).get("mean"),
            "recall_lift": ((summary.get("attention") or {}).get("recall") or {}).get("lift"),
            "attention_self": (summary.get("attention") or {}).get("self"),
            "s_per_chunk": totals.get("seconds_per_chunk"),
            "kv_bytes": summary.get("cache", {}).get("kv_bytes"), "peak_rss_bytes": totals.get("peak_rss_bytes"),
            "gpu_peak_bytes": totals.get("gpu_peak_bytes"), "run_dir": str(rel)}


def collect(out_dir: str | Path) -> list[dict]:
    """One row per complete job under a sweep folder (``<config>/<cache>/<image>/seed<N>/summary.json``).

    Row keys: :data:`ROW_FIELDS` (metrics are None where the run did not compute them, e.g. PAC
    without a revisit or with ``--metrics fast``; ``s_per_chunk`` in seconds, ``*_bytes`` in bytes).
    Unreadable summaries are skipped (a job being written by another shard). Sorted by
    (config, cache, image, seed).
    """
    out_dir = Path(out_dir)
    rows = []
    for path in sorted(out_dir.glob("*/*/*/seed*/summary.json")):
        try:
            row = _row(out_dir, path)
        except (OSError, ValueError, AttributeError):
            continue
        if row is not None:
            rows.append(row)
    return sorted(rows, key=lambda r: (r["config"], r["cache"], r["image"], r["seed"] or 0))


def failures(out_dir: str | Path) -> list[dict]:
    """The jobs whose latest attempt failed (their ``failed.json``), sorted by job."""
    out = []
    for path in sorted(Path(out_dir).glob(f"*/*/*/seed*/{FAILED_NAME}")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


# --------------------------------------------------------------------------- statistics


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float | None, float | None]:
    """Mean and confidence half-width ``t_{(1+level)/2, n-1} * sd(ddof=1) / sqrt(n)``.

    Returns (None, None) for no values and (mean, None) for one.
    """
    from scipy import stats

    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf((1 + level) / 2, n - 1) * sd / math.sqrt(n))


def scene_values(rows: list[dict], metric: str) -> list[float]:
    """Per scene (image), the mean of ``metric`` over its rows (seeds, configurations); scenes
    without a value are left out."""
    by_scene: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get(metric) is not None:
            by_scene[r["image"]].append(r[metric])
    return [sum(v) / len(v) for _, v in sorted(by_scene.items())]


def paired_test(rows: list[dict], base_rows: list[dict], metric: str) -> tuple[float | None, int]:
    """Two-sided paired t-test of ``rows`` against ``base_rows`` over runs matched on (config,
    image, seed): (p-value, pairs). p is None with fewer than 2 pairs or zero-variance differences."""
    from scipy import stats

    base = {(r["config"], r["image"], r["seed"]): r[metric] for r in base_rows if r.get(metric) is not None}
    pairs = [(r[metric], base[k]) for r in rows
             if r.get(metric) is not None and (k := (r["config"], r["image"], r["seed"])) in base]
    if len(pairs) < 2:
        return None, len(pairs)
    p = float(stats.ttest_rel([a for a, _ in pairs], [b for _, b in pairs]).pvalue)
    return (p if math.isfinite(p) else None), len(pairs)


def cell_stats(rows: list[dict], base_rows: list[dict] | None, metrics: tuple[str, ...] = METRICS) -> dict:
    """``{metric: {"mean", "ci", "scenes", "p", "pairs"}}`` for each of ``metrics`` over ``rows``."""
    out = {}
    for metric in metrics:
        values = scene_values(rows, metric)
        mean, ci = mean_ci(values)
        p, pairs = paired_test(rows, base_rows, metric) if base_rows is not None else (None, 0)
        out[metric] = {"mean": mean, "ci": ci, "scenes": len(values), "p": p, "pairs": pairs}
    return out


def aggregate(rows: list[dict]) -> dict:
    """Tables of a sweep: ``by_tier`` / ``by_config`` / ``aba_by_chunks`` lists of
    ``{group keys..., "writer", "pac": {...}, "temp_ssim": {...}}`` (see :func:`cell_stats`; the
    baseline's own p is None), and ``cost`` per writer (mean s/chunk, max bytes)."""
    writers = writers_of(rows)
    metrics = metrics_of(rows)

    def table(group_of) -> list[dict]:
        groups: dict = defaultdict(list)
        for r in rows:
            key = group_of(r)
            if key is not None:
                groups[key].append(r)
        out = []
        for key, members in groups.items():
            for w in writers:
                mine = [r for r in members if r["cache"] == w]
                # the baseline of the same mode: sliding for free runs, sliding@<prefix> for prefixed ones
                baseline = BASELINE + (w[w.index("@"):] if "@" in w else "")
                base = [r for r in members if r["cache"] == baseline]
                if mine:
                    stats = cell_stats(mine, base if base and w != baseline else None, metrics)
                    out.append({**dict(key), "writer": w, **stats})
        return out

    cost = []
    for w in writers:
        mine = [r for r in rows if r["cache"] == w]
        spc = [r["s_per_chunk"] for r in mine if r["s_per_chunk"] is not None]
        cost.append({"writer": w, "runs": len(mine), "s_per_chunk": sum(spc) / len(spc) if spc else None,
                     **{k: max((r[k] for r in mine if r[k] is not None), default=None)
                        for k in ("kv_bytes", "peak_rss_bytes", "gpu_peak_bytes")}})
    return {"by_tier": table(lambda r: (("tier", r["tier"]),)),
            "by_config": table(lambda r: (("tier", r["tier"]), ("config", r["config"]))),
            "aba_by_chunks": table(lambda r: (("chunks", r["chunks"]),) if is_aba(r["config"]) else None),
            "cost": cost}


# --------------------------------------------------------------------------- plots


# --------------------------------------------------------------------------- entry point


def report(out_dir: str | Path, dest: str | Path | None = None) -> dict[str, Path]:
    """Write ``report.md``, ``report.csv`` (one row per complete run), ``report.json`` (rows,
    aggregates, failures), ``pac_vs_chunks.png`` and ``tiers.png`` into ``dest`` (default:
    ``out_dir``). Returns ``{name: path}``.

    Every complete run's folder is checked first (:meth:`~worldtrace_cli.runs.RunFolder.check`:
    chunk ids 0..n-1 once each, the summary's chunk count, the video covering the records).

    Raises:
        InputError: ``out_dir`` is not a folder or holds no complete LoopBench run.
        FolderInconsistent: a run folder contradicts itself (exit 7; the folder is named).
        InputError: a run folder lacks its records. OutputError: ``dest`` cannot be written, a run
            folder lacks its video.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise InputError(f"{out_dir}: no such folder")
    rows = collect(out_dir)
    if not rows:
        raise InputError(f"{out_dir}: no complete LoopBench runs (expected <config>/<cache>/<image>/seed<N>/"
                         "summary.json)")
    for row in rows:  # a folder two runs wrote, or whose video lost chunks, is not a result
        RunFolder(out_dir / row["run_dir"]).check(frames_for_chunks)
    dest = Path(dest) if dest is not None else out_dir
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"cannot create {dest}: {err.strerror or err}") from None
    failed = failures(out_dir)
    agg = aggregate(rows)
    paths = {name: dest / name for name in ("report.md", "report.csv", "report.json", "pac_vs_chunks.png",
                                             "tiers.png")}
    # each file under a temporary name, then renamed: a full disk leaves no torn report
    with atomic_path(paths["report.md"]) as tmp:
        tmp.write_text(markdown(rows, agg, failed, out_dir), encoding="utf-8")
    with atomic_path(paths["report.csv"]) as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=ROW_FIELDS)
        writer.writeheader()
        writer.writerows({k: ("" if r[k] is None else r[k]) for k in ROW_FIELDS} for r in rows)
    for name, plot in (("pac_vs_chunks.png", plot_pac_vs_chunks), ("tiers.png", plot_tiers)):
        with atomic_path(paths[name]) as tmp:
            plot(agg, tmp)

    def tier_str(entries):  # one JSON type per field: tiers 1..4, "sweep" and "custom" are all strings
        return [{**e, "tier": str(e["tier"])} if "tier" in e else e for e in entries]

    write_json_atomic(paths["report.json"], {"schema_version": SCHEMA_VERSION, "out_dir": str(out_dir),
                                             "baseline": BASELINE, "confidence": 0.95, "rows": tier_str(rows),
                                             **{k: tier_str(v) for k, v in agg.items()}, "failures": failed})
    return paths


__all__ = ["aggregate", "cell_stats", "collect", "failures", "markdown", "mean_ci", "metrics_of", "paired_test", "report",
           "scene_values"]
