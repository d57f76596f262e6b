"""LoopBench's figures: ``pac_vs_chunks.png`` (recall against rollout length on ABA-type loops) and
``tiers.png`` (each metric per tier and writer). Axes are scaled to the data (PAC values of 0.95-1.00
would otherwise be flat bars from 0) and tiers are named, not numbered."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from .names import GT_DETAIL, GT_METRIC, TIER_ORDER, TIER_TITLES, writers_of


def tier_label(tier) -> str:
    """``"Tier 1: topology"`` -> ``"Tier 1\\ntopology"`` (wrapped to ~18 characters a line)."""
    title = TIER_TITLES.get(tier, str(tier))
    head, _, rest = title.partition(": ")
    return head + ("\n" + textwrap.fill(rest, 18) if rest else "")


def _fit_y(ax, stats) -> None:
    """Scale the y axis to ``(mean, ci)`` pairs with a 10 % margin (bars drawn from the lower edge)."""
    lo = [m - (c or 0.0) for m, c in stats if m is not None and not math.isnan(m)]
    hi = [m + (c or 0.0) for m, c in stats if m is not None and not math.isnan(m)]
    if not lo:
        return
    low, high = min(lo), max(hi)
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
        ax.errorbar([c["chunks"] for c in mine], [c["pac"]["mean"] for c in mine],
                    yerr=[c["pac"]["ci"] or 0.0 for c in mine], marker="o", capsize=3, label=w)
    _fit_y(ax, [(c["pac"]["mean"], c["pac"]["ci"]) for c in cells])
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
    """Grouped bars per tier: PAC, TempSSIM and, with ground truth, return-leg GT-PSNR and GT detail
    (mean ± CI over scenes) of each writer."""
    from matplotlib.figure import Figure

    cells = agg["by_tier"]
    tiers = [t for t in TIER_ORDER if any(c["tier"] == t for c in cells)]
    writers = writers_of([{"cache": c["writer"]} for c in cells])
    index = {(c["writer"], c["tier"]): c for c in cells}
    panels = [("pac", "PAC"), ("temp_ssim", "TempSSIM")]
    if any(GT_METRIC in c for c in cells):
        panels.append((GT_METRIC, "GT-PSNR, return (dB)"))
    if any(GT_DETAIL in c for c in cells):
        panels.append((GT_DETAIL, "GT detail, return"))
    fig = Figure(figsize=(max(6, 1.6 * len(tiers) + 2), 3.25 * len(panels)), dpi=120, layout="constrained")
    width = 0.8 / max(1, len(writers))
    for k, (metric, label) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, k + 1)
        for j, w in enumerate(writers):
            stats = [index.get((w, t), {}).get(metric, {}) for t in tiers]
            means = [s.get("mean") if s.get("mean") is not None else math.nan for s in stats]
            ax.bar([i + (j - (len(writers) - 1) / 2) * width for i in range(len(tiers))], means, width,
                   yerr=[s.get("ci") or 0.0 for s in stats], capsize=3, label=w)
        _fit_y(ax, [(s.get("mean"), s.get("ci")) for s in (index.get((w, t), {}).get(metric, {})
                                                          for w in writers for t in tiers)])
        ax.set_xticks(range(len(tiers)), [tier_label(t) for t in tiers], fontsize="small")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("LoopBench per tier (mean ± 95% CI over scenes)")
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(writers),
               fontsize="small")
    fig.savefig(path)


__all__ = ["plot_pac_vs_chunks", "plot_tiers", "tier_label"]
