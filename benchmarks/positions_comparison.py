"""The paper's positions comparison on loopworld, against ground truth (issue 47 part 4).

    python benchmarks/positions_comparison.py LABEL=SWEEP [LABEL=SWEEP ...] [--reference field] -o table.md
        [--json positions.json] [--plot horizon.png]

Each SWEEP is a ``worldtrace loopbench run`` folder on a procedural-world preset; LABEL names what
its runs differ in (e.g. ``base=lb/`` for the writers at their own positions, ``actual=lb-actual/``
for a sweep run with ``--positions actual``). A run is named ``writer`` when its label is ``base``,
else ``writer@label`` (``field@actual``). The paper's premise (Sec. "RoPE out of distribution"): a
model trained on query-key offsets up to ``trained_offset`` (MG2: 5 latent frames) cannot read keys
at offsets it never saw, so ``full`` at ``actual`` positions degrades as the rollout grows past the
window while Field at ``slot_rank`` positions (every slot read within the window) does not; the
ablation holds the writer (Field) fixed and varies only the positions (its Table "pos_ablation").

Writes Markdown:

- per configuration and run name: runs, return-leg GT-PSNR (dB, the run summary's), GT-PSNR of the
  other chunks, the largest query-key offset read (latent frames, from ``chunks.jsonl``), and the
  paired difference of return GT-PSNR to ``--reference`` (runs matched on configuration, world and
  seed; mean, wins, two-sided paired t-test) and to ``sliding``;
- per configuration, GT-PSNR by horizon (chunk bins 1-7, 8-15, 16-31, 32-63, ...): where a writer
  falls behind as the rollout grows.

``--plot``: the longest configuration's GT-PSNR per chunk (mean over runs, a running mean over 4
chunks), one line per run name. Errors: SystemExit with a one-line message for a malformed LABEL=SWEEP or a folder without complete runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from worldtrace_cli.loopbench.report import collect  # noqa: E402
from worldtrace_cli.outputs import read_jsonl  # noqa: E402


def load(label: str, sweep: Path) -> list[dict]:
    """The complete runs with ground truth of a sweep (:func:`~worldtrace_cli.loopbench.report.collect`'s
    rows, others skipped), per run ``{"name", "config", "world"`` (the run's scene folder, e.g.
    ``world3``), ``"seed", "return"`` (return-leg GT-PSNR, dB; None for a configuration without a
    revisit), ``"return_chunks", "psnr"`` (per chunk, dB, from ``chunks.jsonl``), ``"max_offset"}`` (the
    largest query-key offset any chunk's cache read, latent frames).

    Raises:
        SystemExit: no such run under ``sweep``.
    """
    rows = []
    for row in collect(sweep):
        if row["gt_psnr"] is None:
            continue
        run = sweep / row["run_dir"]
        chunks = read_jsonl(run / "chunks.jsonl")
        back = json.loads((run / "summary.json").read_text())["metrics"]["gt"].get("return") or {}
        rows.append({"name": row["cache"] if label == "base" else f"{row['cache']}@{label}", "config": row["config"],
                     "world": row["image"], "seed": row["seed"], "return": row["gt_return_psnr"],
                     "return_chunks": back.get("chunks") or [], "psnr": [c["metrics"]["gt_psnr"] for c in chunks],
                     "max_offset": max((c["cache"].get("max_offset") or 0) for c in chunks)})
    if not rows:
        raise SystemExit(f"{sweep}: no complete LoopBench run of a procedural world")
    return rows


def paired(rows: list[dict], name: str, other: str, config: str) -> str:
    """Run ``name`` minus run ``other`` on return GT-PSNR over the runs of ``config`` paired on world
    and seed (runs without a return leg left out): ``"+0.40 (7/8, p = 0.004)"`` (mean difference in
    dB, runs where ``name`` is higher / pairs, scipy's two-sided paired t-test), or "—" for fewer
    than 2 pairs or ``name == other``."""
    from scipy import stats

    index = {(r["world"], r["seed"]): r["return"] for r in rows
             if r["name"] == other and r["config"] == config and r["return"] is not None}
    pairs = [(r["return"], index[(r["world"], r["seed"])]) for r in rows
             if r["name"] == name and r["config"] == config and r["return"] is not None and (r["world"], r["seed"]) in index]
    if name == other or len(pairs) < 2:
        return "—"
    a, b = np.array(pairs).T
    p = stats.ttest_rel(a, b).pvalue
    return f"{np.mean(a - b):+.2f} ({int(np.sum(a > b))}/{len(a)}, {'p < 0.001' if p < 0.001 else f'p = {p:.3f}'})"


def bins(n: int) -> list[tuple[int, int]]:
    """Chunk bins 1-7, 8-15, 16-31, 32-63, ... up to ``n`` chunks (chunk 0 holds the start image)."""
    out, lo = [], 1
    while lo < n:
        hi = min(n, 8 if lo == 1 else 2 * lo)
        out.append((lo, hi))
        lo = hi
    return out


def markdown(rows: list[dict], reference: str) -> str:
    """The two tables (module docstring) of ``rows`` (:func:`load`'s), paired with run ``reference``."""
    names = sorted({r["name"] for r in rows}, key=lambda s: (s.split("@")[0] != "sliding", "@" in s, s))
    configs = sorted({r["config"] for r in rows})
    lines = ["| configuration | run | runs | GT-PSNR return (dB) | GT-PSNR other chunks | largest offset read "
             f"(latent frames) | return vs {reference} (mean, wins, p) | return vs sliding |", "|---|---|---|---|---|---|---|---|"]
    for config in configs:
        for name in names:
            sel = [r for r in rows if r["name"] == name and r["config"] == config]
            if not sel:
                continue
            other = [p for r in sel for c, p in enumerate(r["psnr"]) if c > 0 and c not in set(r["return_chunks"])]
            back = [r["return"] for r in sel if r["return"] is not None]
            lines.append(f"| {config} | {name} | {len(sel)} | {f'{np.mean(back):.2f}' if back else '—'} | "
                         f"{np.mean(other):.2f} | {max(r['max_offset'] for r in sel):g} | "
                         f"{paired(rows, name, reference, config)} | {paired(rows, name, 'sliding', config)} |")
    for config in configs:
        sel = [r for r in rows if r["config"] == config]
        spans = bins(min(len(r["psnr"]) for r in sel))
        lines += ["", f"GT-PSNR (dB) by horizon, `{config}` (mean over runs of the chunks' GT-PSNR):", "",
                  "| run | " + " | ".join(f"chunk {lo}" if hi == lo + 1 else f"chunks {lo}-{hi - 1}" for lo, hi in spans) + " |",
                  "|---|" + "---|" * len(spans)]
        for name in names:
            mine = [r for r in sel if r["name"] == name]
            if mine:
                lines.append(f"| {name} | " + " | ".join(
                    f"{np.mean([np.mean(r['psnr'][lo:hi]) for r in mine]):.2f}" for lo, hi in spans) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """A PNG at ``path``: the mean GT-PSNR (dB) per chunk of the configuration with the longest runs in
    ``rows`` (:func:`load`'s), a running mean over 4 chunks, one line per run name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = max({r["config"] for r in rows}, key=lambda c: min(len(r["psnr"]) for r in rows if r["config"] == c))
    sel = [r for r in rows if r["config"] == config]
    n = min(len(r["psnr"]) for r in sel)
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    for name in sorted({r["name"] for r in sel}, key=lambda s: (s.split("@")[0] != "sliding", "@" in s, s)):
        curve = np.mean([r["psnr"][:n] for r in sel if r["name"] == name], axis=0)
        smooth = np.convolve(curve, np.ones(4) / 4, mode="valid")
        ax.plot(np.arange(len(smooth)) + 1.5, smooth, label=name, lw=2 if name in ("sliding", "full") else 1.3)
    ax.set_xlabel(f"chunk of `{config}` (3 latent frames each)")
    ax.set_ylabel("GT-PSNR (dB), mean over runs, 4-chunk running mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", help="LABEL=SWEEP folder (label base: the writers' own positions)")
    parser.add_argument("--reference", default="field", help="the run name the others are paired with")
    parser.add_argument("-o", "--output", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="PNG of GT-PSNR per chunk, longest configuration")
    args = parser.parse_args(argv)
    rows = []
    for spec in args.sweeps:
        label, sep, folder = spec.partition("=")
        if not sep or not label or not Path(folder).is_dir():
            raise SystemExit(f"{spec}: expected LABEL=SWEEP with an existing folder")
        rows += load(label, Path(folder))
    keys = [(r["name"], r["config"], r["world"], r["seed"]) for r in rows]
    if len(set(keys)) < len(keys):
        twice = next(k for k in keys if keys.count(k) > 1)
        raise SystemExit(f"two runs of {twice[0]}, {twice[1]}, {twice[2]}, seed {twice[3]}: give each sweep "
                         f"its own label")
    text = markdown(rows, args.reference)
    if args.json:
        args.json.write_text(json.dumps(rows, separators=(",", ":")) + "\n")
    if args.plot:
        plot(rows, args.plot)
    if args.output:
        args.output.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
