"""``report.md``: a LoopBench sweep's aggregates (:func:`~worldtrace_cli.loopbench.report.aggregate`)
as Markdown a person reads at a glance.

One metric per table, return-leg GT-PSNR first (the ground truth of a procedural world), then GT
detail, PAC and TempSSIM; one number ± its 95% half-width per cell; a cell without an interval
marked ``†`` and the reason said once, in the report's legend. Before them, the paper's own layout
(Tab. "loopbench_full": PAC of Landmark and sliding on ABA, ABABA, long ABA and the 360° pan) with
the paper's numbers beside this sweep's and the return-leg GT-PSNR of the same runs.
"""

from __future__ import annotations

from pathlib import Path

from .configs import CONFIGS, tier_of
from .names import (BASELINE, GT_DETAIL, GT_METRIC, METRIC_NAMES, PAPER_PAC, RECALL, RECALL_LIFT, TIER_ORDER,
                    TIER_TITLES, has_interval, metrics_of, writers_of)

NO_INTERVAL = "†"
BETTER = {GT_METRIC: "higher is better", GT_DETAIL: "nearer 1 is better (below 1 blurred, above 1 noisier)",
          RECALL: "the memory being read: higher = more of the chunk's attention on what it saw there before",
          RECALL_LIFT: "above 0 = the return chunks read the first visit's slots more than those slots' position "
                       "alone gets them (reading by content); 0 = by position alone",
          "pac": "higher is better", "temp_ssim": "higher is better",
          "ref_psnr": "higher is better (prefixed runs only: --prefix)"}


def cell(stat: dict | None, metric: str | None) -> str:
    """``mean ± ci`` (3 decimals); ``mean †`` without an interval (:func:`has_interval`); ``—`` without
    a value."""
    if not stat or stat.get("mean") is None:
        return "—"
    if not has_interval(stat, metric):
        return f"{stat['mean']:.3f} {NO_INTERVAL}"
    return f"{stat['mean']:.3f} ± {stat['ci']:.3f}"


def p_cell(stat: dict | None) -> str:
    """A paired test's p-value (``<0.001`` below that), ``—`` without one."""
    p = (stat or {}).get("p")
    return "—" if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def size(n) -> str:
    """Bytes as ``792.0 KiB``; ``—`` for None."""
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def md_table(header: list[str], body: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in body)]


def grid(cells: list[dict], column_key: str, columns: list, titles: dict, writers: list[str], metric: str) -> list[str]:
    """One metric's table: rows = writers, a column per ``columns`` entry (titled by ``titles``) and,
    where any writer has a p-value there, a ``p vs sliding`` column beside it."""
    index = {(c["writer"], c[column_key]): c for c in cells}
    with_p = {col: any((index.get((w, col)) or {}).get(metric, {}).get("p") is not None for w in writers)
              for col in columns}
    header = ["writer"]
    for col in columns:
        header += [titles[col]] + (["p vs sliding"] if with_p[col] else [])
    body = []
    for w in writers:
        row = [w]
        for col in columns:
            stat = (index.get((w, col)) or {}).get(metric)
            row.append(cell(stat, metric))
            if with_p[col]:
                row.append(p_cell(stat) if w != BASELINE else "—")
        body.append(row)
    return md_table(header, body)


def span(rows: list[dict]) -> str:
    """``N=16``, or ``N=8-32`` when the runs differ in length."""
    values = sorted({r["chunks"] for r in rows})
    return f"N={values[0]}" if len(values) == 1 else f"N={values[0]}-{values[-1]}"


def plural(count: int, noun: str) -> str:
    """``plural(1, "run")`` -> ``"1 run"``, ``plural(3, "run")`` -> ``"3 runs"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def paper_table(rows: list[dict], agg: dict) -> list[str]:
    """The paper's layout: per loop of its Tab. "loopbench_full" that LoopBench reproduces (ABA N=16,
    ABABA N=32, long ABA N=32, 360° pan N=8), the paper's PAC of sliding and Landmark (MG2, 100
    scenes) beside this sweep's, and the return-leg GT-PSNR of the same runs with the paired test of
    Landmark against sliding. Loops the sweep did not run say so, with the command that runs them."""
    index = {(c["config"], c["writer"]): c for c in agg["by_config"]}
    gt = any(r.get(GT_METRIC) is not None for r in rows)
    recall = any(r.get(RECALL) is not None for r in rows)
    header = ["loop", "paper: sliding PAC", "paper: landmark PAC", "sliding PAC", "landmark PAC"]
    if gt:
        header += ["sliding GT-PSNR (dB)", "landmark GT-PSNR (dB)", "p (GT-PSNR)"]
    if recall:
        header += ["sliding recall attention", "landmark recall attention", "p (recall)"]
    header.append("scenes")
    body, missing = [], []
    for config, (title, paper) in PAPER_PAC.items():
        ours = [r for r in rows if r["config"] == config]
        label = f"{title} ({config}, {span(ours) if ours else 'N=' + str(CONFIGS[config].num_chunks)})"
        row = [label] + [f"{m:.3f} ± {c:.3f}" for m, c in (paper["sliding"], paper["landmark"])]
        slid, land = index.get((config, BASELINE)), index.get((config, "landmark"))
        if slid is None and land is None:
            missing.append(config)
            body.append(row + ["not run"] * (len(header) - 3))
            continue
        row += [cell((slid or {}).get("pac"), "pac"), cell((land or {}).get("pac"), "pac")]
        if gt:
            row += [cell((slid or {}).get(GT_METRIC), GT_METRIC), cell((land or {}).get(GT_METRIC), GT_METRIC),
                    p_cell((land or {}).get(GT_METRIC))]
        if recall:
            row += [cell((slid or {}).get(RECALL), RECALL), cell((land or {}).get(RECALL), RECALL),
                    p_cell((land or {}).get(RECALL))]
        row.append(str(len({r["image"] for r in ours})))
        body.append(row)
    lines = md_table(header, body)
    if missing:
        lines += ["", f"Not in this sweep: {', '.join(missing)} (`worldtrace loopbench run --configs "
                      f"{','.join(PAPER_PAC)} --caches sliding,landmark -o lb-paper/` runs the paper's loops; "
                      f"add --images with a preset other than loopworld)."]
    return lines


def legend(metrics: tuple[str, ...]) -> list[str]:
    """What a cell means, said once for every table."""
    lines = ["How to read: each table holds one metric; a cell is its mean over scenes ± the 95% confidence "
             "half-width (each scene averaged over its seeds first; t-distribution). "
             f"{NO_INTERVAL} = no interval: one scene, or a t-interval that would reach values the metric cannot "
             "take (too few scenes, or values at the metric's bound, where a symmetric interval is not valid; "
             "`report.json` keeps it). p vs sliding: paired t-test over runs matched on "
             "(configuration, scene, seed); — with fewer than 2 pairs.", ""]
    for m in metrics:
        lines.append(f"- {METRIC_NAMES[m]}: {BETTER.get(m, 'higher is better')}"
                     + (": generated vs true frames (the world rendered at the same poses) over the chunks that "
                        "return to a place seen before" if m == GT_METRIC else "")
                     + (": the generated frames' neighbouring-pixel differences over the true frames', on the "
                        "same chunks" if m == GT_DETAIL else "")
                     + (": on each return chunk, the share of its attention (last denoising step, mean over "
                        "layers, heads and queries) on the cache slots holding latent frames taken at the revisited "
                        "pose before (`--attention-stats`; docs/attention.md)" if m == RECALL else "")
                     + (": recall attention minus the share the same slots (by their place in the cache) get on the "
                        "run's other chunks" if m == RECALL_LIFT else "")
                     + ("; with the tiny CLIP tower it does not track ground truth on loopworld"
                        if m == "pac" and GT_METRIC in metrics else "") + ".")
    return lines


def markdown(rows: list[dict], agg: dict, failed: list[dict], out_dir: Path) -> str:
    """The report's Markdown: the sweep in one line, the legend, the paper's layout, then per metric
    (GT-PSNR on return legs first) its tables by tier, per tier and for ABA loops by N, the cost
    table, failed jobs and the two plots."""
    writers = writers_of(rows)
    metrics = metrics_of(rows)
    scenes, seeds = len({r["image"] for r in rows}), len({r["seed"] for r in rows})
    configs = sorted({r["config"] for r in rows}, key=lambda c: (list(CONFIGS).index(c) if c in CONFIGS else 999, c))
    full = len(rows) == len(configs) * len(writers) * scenes * seeds
    lines = ["# LoopBench report", "",
             f"Sweep `{out_dir}`: {plural(len(rows), 'complete run')} ({plural(len(configs), 'configuration')} x "
             f"{plural(len(writers), 'writer')} x {plural(scenes, 'scene')} x {plural(seeds, 'seed')}"
             + ("" if full else ", not every combination") + ")"
             + (f"; {len(failed)} failed (see `failures.jsonl`)." if failed else "."), ""]
    lines += legend(metrics)
    if all(tier_of(c) == "prompt" for c in configs):  # LoopBench for prompts: the paper has no such table
        lines += ["", "Prompt loops (text-to-video): PAC pairs each chunk of the return to prompt A with the same "
                  "chunk of the first A segment (docs/metrics.md, 'From prompts').", ""]
    else:
        lines += ["", "## The paper's table, side by side", "",
                  "Tab. \"loopbench_full\" of the paper (Matrix-Game-2.0, 100 scenes) against this sweep: PAC of "
                  "WorldTrace-Landmark and the sliding window on the same loops, and beside it the return-leg "
                  "GT-PSNR of the same runs.", ""]
        lines += paper_table(rows, agg)
    tiers = [t for t in TIER_ORDER if any(r["tier"] == t for r in rows)]
    for k, metric in enumerate(metrics, 1):
        lines += ["", f"## {k}. {METRIC_NAMES[metric]}", "", "### By tier", ""]
        lines += grid(agg["by_tier"], "tier", tiers, {t: TIER_TITLES[t] for t in tiers}, writers, metric)
        for tier in tiers:
            names = [c for c in configs if tier_of(c) == tier]
            titles = {c: f"{c} ({span([r for r in rows if r['config'] == c])})" for c in names}
            lines += ["", f"### {TIER_TITLES[tier]}", ""]
            lines += grid([c for c in agg["by_config"] if c["tier"] == tier], "config", names, titles, writers, metric)
        if agg["aba_by_chunks"]:
            ns = sorted({c["chunks"] for c in agg["aba_by_chunks"]})
            lines += ["", "### ABA loops by rollout length", "",
                      "All ABA-type configurations pooled by N (`pac_vs_chunks.png` draws PAC).", ""]
            lines += grid(agg["aba_by_chunks"], "chunks", ns, {n: f"N={n}" for n in ns}, writers, metric)
    lines += ["", "## Cost", ""]
    lines += md_table(["writer", "runs", "s/chunk (mean)", "KV cache (max)", "peak RSS (max)", "GPU peak (max)"],
                      [[c["writer"], str(c["runs"]), "—" if c["s_per_chunk"] is None else f"{c['s_per_chunk']:.3f}",
                        size(c["kv_bytes"]), size(c["peak_rss_bytes"]), size(c["gpu_peak_bytes"])]
                       for c in agg["cost"]])
    if failed:
        lines += ["", "## Failed jobs", ""]
        lines += md_table(["job", "error", "message"],
                          [[f["job"], f["error"], f["message"].replace("|", "\\|")] for f in failed])
    lines += ["", "![Tiers](tiers.png)", "", "![PAC vs rollout length](pac_vs_chunks.png)", ""]
    return "\n".join(lines)


__all__ = ["NO_INTERVAL", "cell", "grid", "legend", "markdown", "md_table", "p_cell", "paper_table",
           "plural", "size", "span"]
