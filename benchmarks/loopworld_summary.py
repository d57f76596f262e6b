"""Summarise a LoopBench sweep on loopworld: return leg vs the rest of each run, and (optionally)
a paired comparison with the same sweep on other weights.

    python benchmarks/loopworld_summary.py SWEEP/ [--against OLD_SWEEP/] -o summary.md

Reads the sweep's run folders (``<config>/<cache>/<image>/seed<N>/summary.json`` + ``chunks.jsonl``,
the layout ``worldtrace loopbench run`` writes) through ``worldtrace_cli.loopbench.report.collect``.
Writes Markdown:

- per (configuration, writer): runs, mean GT-PSNR of the return leg and of the run's other chunks
  (dB, per-chunk means from ``chunks.jsonl``), their difference, mean PAC, and in how many runs
  paired on (configuration, world, seed) the writer beats ``sliding`` on return GT-PSNR;
- the Spearman correlation of PAC with return GT-PSNR over all runs, and how often PAC and
  GT-PSNR agree on the sign of a writer's difference to ``sliding`` (paired runs);
- with ``--against``: per (configuration, writer), the paired difference of return GT-PSNR
  (this sweep minus the other; pairs matched on world and seed), wins, and a two-sided paired
  t-test (scipy ``ttest_rel``). The other sweep is its folder or the ``report.json`` that
  ``worldtrace loopbench report`` wrote of it (its ``rows``: the committed reports pair without
  the run folders).

Unlike ``worldtrace loopbench report`` (scene-level means with CIs, the product's report), this is
the run-level reading docs/loopworld.md quotes. Errors: SystemExit with a one-line message for a
folder without complete runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from worldtrace_cli.loopbench.configs import CONFIGS  # noqa: E402
from worldtrace_cli.loopbench.report import collect, paired_test  # noqa: E402
from worldtrace_cli.outputs import read_jsonl  # noqa: E402

BASE = "sliding"
WRITER_ORDER = ("sliding", "full", "field", "field-streaming", "landmark", "mixed:2", "memrope")


def other_chunks_psnr(sweep: Path, row: dict) -> float | None:
    """Mean per-chunk GT-PSNR (dB) of the run's chunks that are not on its return leg (None if none)."""
    run = sweep / row["run_dir"]
    ret = set((json.loads((run / "summary.json").read_text())["metrics"]["gt"].get("return") or {}).get("chunks") or [])
    values = [r["metrics"]["gt_psnr"] for r in read_jsonl(run / "chunks.jsonl")
              if r["chunk"] not in ret and r["metrics"].get("gt_psnr") is not None]
    return float(np.mean(values)) if values else None


def load(sweep: Path) -> list[dict]:
    """The sweep's complete runs with ground truth: ``collect`` rows plus ``gt_other_psnr`` (dB).
    Raises SystemExit when there are none."""
    rows = [r for r in collect(sweep) if r["gt_return_psnr"] is not None]
    if not rows:
        raise SystemExit(f"{sweep}: no complete run with ground truth (loopworld) found")
    for r in rows:
        r["gt_other_psnr"] = other_chunks_psnr(sweep, r)
    return rows


def load_against(path: Path) -> list[dict]:
    """The other sweep's runs with ground truth: from its folder (:func:`load`) or from a report.json's
    ``rows``. Raises SystemExit when there are none."""
    if path.is_dir():
        return load(path)
    rows = [r for r in json.loads(path.read_text())["rows"] if r.get("gt_return_psnr") is not None]
    if not rows:
        raise SystemExit(f"{path}: no run with ground truth (loopworld) in its rows")
    return rows


def key(r: dict) -> tuple:
    """What pairs two runs: (configuration, world, seed)."""
    return r["config"], r["image"], r["seed"]


def order(rows: list[dict]) -> tuple[list[str], list[str]]:
    """Configurations in LoopBench's order (custom trajectories last), writers baseline first."""
    present = {r["config"] for r in rows}
    configs = [c for c in CONFIGS if c in present] + sorted(present - set(CONFIGS))
    caches = {r["cache"] for r in rows}
    writers = [w for w in WRITER_ORDER if w in caches] + sorted(caches - set(WRITER_ORDER))
    return configs, writers


def mean(values) -> float:
    """Mean of the values that are not None (NaN for none)."""
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def summary_table(rows: list[dict]) -> list[str]:
    """Markdown lines: per (configuration, writer) return / other-chunk GT-PSNR, PAC, wins over sliding."""
    configs, writers = order(rows)
    base = {key(r): r for r in rows if r["cache"] == BASE}
    lines = ["| configuration | writer | runs | GT-PSNR return (dB) | GT-PSNR other chunks (dB) | return - other "
             "| PAC | beats sliding on return GT-PSNR |", "|---|---|---|---|---|---|---|---|"]
    for c in configs:
        for w in writers:
            mine = [r for r in rows if r["config"] == c and r["cache"] == w]
            if not mine:
                continue
            ret, other = mean(r["gt_return_psnr"] for r in mine), mean(r["gt_other_psnr"] for r in mine)
            pairs = [(r, base[key(r)]) for r in mine if key(r) in base]
            wins = "—" if w == BASE else f"{sum(a['gt_return_psnr'] > b['gt_return_psnr'] for a, b in pairs)}/{len(pairs)}"
            lines.append(f"| {c} | {w} | {len(mine)} | {ret:.2f} | {other:.2f} | {ret - other:+.2f} | "
                         f"{mean(r['pac'] for r in mine):.3f} | {wins} |")
    return lines


def pivot(rows: list[dict]) -> list[str]:
    """Markdown lines: mean return-leg GT-PSNR (dB), writers x configurations."""
    configs, writers = order(rows)
    lines = ["| return-leg GT-PSNR (dB) | " + " | ".join(configs) + " |", "| --- |" + " --- |" * len(configs)]
    for w in writers:
        cells = []
        for c in configs:
            v = [r["gt_return_psnr"] for r in rows if r["config"] == c and r["cache"] == w]
            cells.append(f"{np.mean(v):.2f}" if v else "—")
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return lines


def pac_agreement(rows: list[dict]) -> list[str]:
    """One Markdown line: Spearman of PAC vs return GT-PSNR, and sign agreement of both vs sliding."""
    both = [r for r in rows if r["pac"] is not None]
    rho = stats.spearmanr([r["pac"] for r in both], [r["gt_return_psnr"] for r in both]).statistic
    base = {key(r): r for r in both if r["cache"] == BASE}
    pairs = [(r, base[key(r)]) for r in both if r["cache"] != BASE and key(r) in base]
    agree = sum(np.sign(a["pac"] - b["pac"]) == np.sign(a["gt_return_psnr"] - b["gt_return_psnr"]) for a, b in pairs)
    return [f"PAC vs return GT-PSNR over {len(both)} runs: Spearman {rho:.2f}; PAC and GT-PSNR agree on the sign "
            f"of a writer's difference to sliding in {agree} of {len(pairs)} paired runs "
            f"({100 * agree / max(len(pairs), 1):.0f} %)."]


def against(rows: list[dict], old: list[dict]) -> list[str]:
    """Markdown lines: per (configuration, writer), this sweep's return GT-PSNR minus ``old``'s over
    runs paired on (configuration, world, seed), wins, and the report's paired t-test."""
    configs, writers = order(rows)
    old_by = {(r["cache"],) + key(r): r for r in old}
    lines = ["| configuration | writer | pairs | before: return / all (dB) | now: return / all (dB) "
             "| return difference (wins) | p |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in configs:
        for w in writers:
            pairs = [(r, old_by[(w,) + key(r)]) for r in rows
                     if r["config"] == c and r["cache"] == w and (w,) + key(r) in old_by]
            if not pairs:
                continue
            d = [a["gt_return_psnr"] - b["gt_return_psnr"] for a, b in pairs]
            p, _ = paired_test([a for a, _ in pairs], [b for _, b in pairs], "gt_return_psnr")
            lines.append(f"| {c} | {w} | {len(pairs)} | {mean(b['gt_return_psnr'] for _, b in pairs):.2f} / "
                         f"{mean(b['gt_psnr'] for _, b in pairs):.2f} | {mean(a['gt_return_psnr'] for a, _ in pairs):.2f} / "
                         f"{mean(a['gt_psnr'] for a, _ in pairs):.2f} | {np.mean(d):+.2f} ({sum(x > 0 for x in d)}/{len(d)}) "
                         f"| {'—' if p is None else f'{p:.3f}'} |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep", type=Path)
    ap.add_argument("--against", type=Path,
                    help="the same sweep on other weights (its folder or report.json): paired differences")
    ap.add_argument("-o", "--output", type=Path, help="Markdown file (default: stdout)")
    ap.add_argument("--title", default="Return-leg GT-PSNR vs the rest of the run, per configuration and writer")
    args = ap.parse_args(argv)
    rows = load(args.sweep)
    out = [f"# {args.title}", "", *summary_table(rows), "", *pivot(rows), "", *pac_agreement(rows)]
    if args.against:
        out += ["", f"## Paired with `{args.against}` (this sweep minus that one, matched on world and seed)", "",
                *against(rows, load_against(args.against))]
    text = "\n".join(out) + "\n"
    if args.output:
        args.output.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
