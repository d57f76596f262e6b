"""LoopBench's figures: ``pac_vs_chunks.png`` (recall against rollout length on ABA-type loops) and
``tiers.png`` (each metric per tier and writer, return-leg GT-PSNR first). Axes are scaled to the
data (PAC values of 0.95-1.00 would otherwise be flat bars from 0), an error bar is drawn only where
the report's table gives an interval (a t-interval over two scenes reaching PAC 1.47 or GT detail
-1.0 is no interval: no bar, as the table's †), and tiers are named, not numbered."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from .names import GT_DETAIL, GT_METRIC, TIER_ORDER, TIER_TITLES, has_interval, writers_of


def tier_label(tier) -> str:
    """``"Tier 1: topology"`` -> ``"Tier 1\\ntopology"`` (wrapped to ~18 characters a line)."""
    title = TIER_TITLES.get(tier, str(tier))
    head, _, rest = title.partition(": ")
    return head + ("\n" + textwrap.fill(rest, 18) if rest else "")


def clipped(mean: float | None, ci: float | None, metric: str | None = None) -> tuple[float, float]:
    """The (below, above) lengths of ``mean``'s error bar: ``ci`` each way, or (0, 0), no bar, where
    the report's table has no interval either (:func:`~worldtrace_cli.loopbench.names.has_interval`:
    one scene, or an interval reaching values ``metric`` cannot take, PAC past 1, GT detail below 0)."""
    if mean is None or math.isnan(mean) or not has_interval({"mean": mean, "ci": ci}, metric):
        return 0.0, 0.0
    return ci, ci


def _fit_y(ax, stats, metric: str | None = None) -> None:
    """Scale the y axis to ``(mean, ci)`` pairs (with the error bars :func:`clipped` draws) with a
    10 % margin (bars drawn from the lower edge)."""
    ends = [(m - below, m + above) for m, c in stats if m is not None and not math.isnan(m)
            for below, above in [clipped(m, c, metric)]]
    if not ends:
        return
    low, high = min(e[0] for e in ends), max(e[1] for e in ends)
    pad = 0.1 * (high - low) or 0.05 * max(abs(high), 1e-6)
    ax.set_ylim(low - pad, high + pad)


def plot_pac_vs_chunks(agg: dict, path: Path) -> None:
    """PAC (mean ± CI over scenes) against N per writer, over the ABA-type configurations."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=120)
    ax = fig.add_subplot()
    cells = [c for c in agg["aba_by_chunks"] if c["pac"]["mean"] is not None]
    for w in writers_of([{"cache": c["writer"]} for c in cells]):
        mine = sorted((c for c in cells if c["writer"] == w), key=lambda c: c["chunks"])
        bars = [clipped(c["pac"]["mean"], c["pac"]["ci"], "pac") for c in mine]
        ax.errorbar([c["chunks"] for c in mine], [c["pac"]["mean"] for c in mine],
                    yerr=[[b for b, _ in bars], [a for _, a in bars]], marker="o", capsize=3, label=w)
    _fit_y(ax, [(c["pac"]["mean"], c["pac"]["ci"]) for c in cells], "pac")
    if cells:
        ns = sorted({c["chunks"] for c in cells})
        if ns[-1] >= 8 * ns[0]:
            ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no ABA-type runs with PAC in this sweep", ha="center", va="center",
                transform=ax.transAxes)
    ax.set(xlabel="rollout length N (chunks)", ylabel="PAC (mean ± 95% CI over scenes)",
           title="ABA loops: recall vs rollout length")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)


def plot_tiers(agg: dict, path: Path) -> None:
    """Grouped bars per tier, one panel per metric: with ground truth return-leg GT-PSNR and GT detail
    first, then PAC and TempSSIM (mean ± CI over scenes; no error bar where the interval leaves the
    metric's range, :func:`clipped`) of each writer."""
    from matplotlib.figure import Figure

    cells = agg["by_tier"]
    tiers = [t for t in TIER_ORDER if any(c["tier"] == t for c in cells)]
    writers = writers_of([{"cache": c["writer"]} for c in cells])
    index = {(c["writer"], c["tier"]): c for c in cells}
    panels = [(metric, label) for metric, label in ((GT_METRIC, "GT-PSNR, return (dB)"),
                                                    (GT_DETAIL, "GT detail, return"))
              if any(metric in c for c in cells)] + [("pac", "PAC"), ("temp_ssim", "TempSSIM")]
    fig = Figure(figsize=(max(6, 1.6 * len(tiers) + 2), 3.25 * len(panels)), dpi=120, layout="constrained")
    width = 0.8 / max(1, len(writers))
    for k, (metric, label) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, k + 1)
        for j, w in enumerate(writers):
            stats = [index.get((w, t), {}).get(metric, {}) for t in tiers]
            means = [s.get("mean") if s.get("mean") is not None else math.nan for s in stats]
            bars = [clipped(s.get("mean"), s.get("ci"), metric) for s in stats]
            ax.bar([i + (j - (len(writers) - 1) / 2) * width for i in range(len(tiers))], means, width,
                   yerr=[[b for b, _ in bars], [a for _, a in bars]], capsize=3, label=w)
        _fit_y(ax, [(s.get("mean"), s.get("ci")) for s in (index.get((w, t), {}).get(metric, {})
                                                          for w in writers for t in tiers)], metric)
        ax.set_xticks(range(len(tiers)), [tier_label(t) for t in tiers], fontsize="small")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("LoopBench per tier (mean ± 95% CI over scenes; no bar: too few scenes for an interval)")
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(writers),
               fontsize="small")
    fig.savefig(path)


__all__ = ["clipped", "plot_pac_vs_chunks", "plot_tiers", "tier_label"]
