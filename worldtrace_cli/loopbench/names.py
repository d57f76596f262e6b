"""LoopBench's names shared by the report tables and figures: the baseline writer, the metrics, the
paper's tiers and their titles (leaf module)."""

from __future__ import annotations

BASELINE = "sliding"
METRICS = ("pac", "temp_ssim")  # the table's entries: PAC / TempSSIM (+ the return-leg GT metrics for world scenes)
GT_METRIC = "gt_return_psnr"
GT_DETAIL = "gt_return_detail"  # generated over true neighbouring-pixel differences (scores.detail_ratio)
GT_METRICS = (GT_METRIC, GT_DETAIL)
# --attention-stats: on return chunks, the share of attention on the slots holding the first visit
RECALL = "recall_attention"
RECALL_LIFT = "recall_lift"  # recall attention beyond what the same slots get on other chunks (their position)
REF_METRIC = "ref_psnr"  # a continued clip (--prefix): the generated chunks against the real frames after the prefix
METRIC_NAMES = {"pac": "PAC", "temp_ssim": "TempSSIM", GT_METRIC: "GT-PSNR on return legs (dB)",
                GT_DETAIL: "GT detail on return legs", RECALL: "Recall attention on return chunks",
                RECALL_LIFT: "Recall attention beyond the slots' usual share",
                REF_METRIC: "Continuation PSNR against the real frames after the prefix (dB)"}
# the values each metric can take (None: unbounded): PAC and TempSSIM are cosine / SSIM in [-1, 1],
# PSNR and the detail ratio are >= 0; a confidence interval reaching past them says too little data
METRIC_RANGE = {"pac": (-1.0, 1.0), "temp_ssim": (-1.0, 1.0), GT_METRIC: (0.0, None), GT_DETAIL: (0.0, None),
                RECALL: (0.0, 1.0), RECALL_LIFT: (-1.0, 1.0), REF_METRIC: (0.0, None)}

TIER_TITLES = {1: "Tier 1: topology", 2: "Tier 2: rollout length (ABA)", 3: "Tier 3: camera orientation",
               4: "Tier 4: multi-revisit", "sweep": "ABA sweep", "prompt": "Prompt loops (text-to-video)",
               "custom": "Custom trajectories"}
TIER_ORDER = (1, 2, 3, 4, "sweep", "prompt", "custom")


def metrics_of(rows: list[dict]) -> tuple[str, ...]:
    """The table's entries: each return-leg ground-truth metric (GT-PSNR, GT detail) that any run has
    (runs of a procedural world; GT detail since 2026-11-26), first, then recall attention and its lift
    when any run measured them (``--attention-stats``), then PAC / TempSSIM (PAC with the tiny CLIP tower does not
    track ground truth: README)."""
    return tuple(m for m in (*GT_METRICS, REF_METRIC, RECALL, RECALL_LIFT)
                 if any(r.get(m) is not None for r in rows)) + METRICS


def has_interval(stat: dict, metric: str | None) -> bool:
    """True when ``stat`` (``{"mean", "ci", ...}``) has a 95% interval that stays within the values
    ``metric`` can take (:data:`~worldtrace_cli.loopbench.names.METRIC_RANGE`: PAC and TempSSIM in
    [-1, 1], GT-PSNR and GT detail >= 0). One scene has none; two or three scenes often give one
    reaching past the range (PAC up to 1.47), and values piled at a bound (PAC 0.99) can too: there a
    symmetric t-interval is not valid, so none is given."""
    if stat.get("mean") is None or stat.get("ci") is None:
        return False
    low, high = METRIC_RANGE.get(metric, (None, None))
    mean, ci = stat["mean"], stat["ci"]
    return not ((low is not None and mean - ci < low) or (high is not None and mean + ci > high))


# The paper's Tab. "loopbench_full" (MG2, n = 100 scenes per condition), the rows ``loopbench report``
# sets beside a sweep's own: PAC mean and 95% half-width of sliding and WorldTrace-Landmark, by the
# configuration of ours that walks the same loop (ABA N=16, ABABA N=32, long ABA N=32, 360 pan N=8)
PAPER_PAC = {
    "aba": ("ABA", {"sliding": (0.723, 0.013), "landmark": (0.864, 0.009)}),
    "ababa": ("ABABA", {"sliding": (0.892, 0.004), "landmark": (0.941, 0.005)}),
    "aba_long": ("ABA long", {"sliding": (0.627, 0.013), "landmark": (0.825, 0.009)}),
    "pan_360": ("Pan 360°", {"sliding": (0.559, 0.015), "landmark": (0.577, 0.015)}),
}


def writers_of(rows: list[dict]) -> list[str]:
    """Writers in table order: free runs first (the baseline first, then by name), then each prefix mode's
    (``cache@prefix``: the same order)."""
    def order(w: str):
        base, _, prefix = w.partition("@")
        return (prefix, base != BASELINE, base)

    return sorted({r["cache"] for r in rows}, key=order)


__all__ = ["BASELINE", "REF_METRIC", "GT_DETAIL", "GT_METRIC", "GT_METRICS", "METRICS", "METRIC_NAMES", "METRIC_RANGE", "PAPER_PAC", "RECALL", "RECALL_LIFT",
           "TIER_ORDER", "has_interval", "metrics_of", "TIER_TITLES", "writers_of"]
