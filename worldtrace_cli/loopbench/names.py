"""LoopBench's names shared by the report tables and figures: the baseline writer, the metrics, the
paper's tiers and their titles (leaf module)."""

from __future__ import annotations

BASELINE = "sliding"
METRICS = ("pac", "temp_ssim")  # the table's entries: PAC / TempSSIM (+ the return-leg GT metrics for world scenes)
GT_METRIC = "gt_return_psnr"
GT_DETAIL = "gt_return_detail"  # generated over true neighbouring-pixel differences (scores.detail_ratio)
GT_METRICS = (GT_METRIC, GT_DETAIL)
METRIC_NAMES = {"pac": "PAC", "temp_ssim": "TempSSIM", GT_METRIC: "GT-PSNR on return legs (dB)",
                GT_DETAIL: "GT detail on return legs"}
# the values each metric can take (None: unbounded): PAC and TempSSIM are cosine / SSIM in [-1, 1],
# PSNR and the detail ratio are >= 0; a confidence interval reaching past them says too little data
METRIC_RANGE = {"pac": (-1.0, 1.0), "temp_ssim": (-1.0, 1.0), GT_METRIC: (0.0, None), GT_DETAIL: (0.0, None)}

TIER_TITLES = {1: "Tier 1: topology", 2: "Tier 2: rollout length (ABA)", 3: "Tier 3: camera orientation",
               4: "Tier 4: multi-revisit", "sweep": "ABA sweep", "custom": "Custom trajectories"}
TIER_ORDER = (1, 2, 3, 4, "sweep", "custom")


def writers_of(rows: list[dict]) -> list[str]:
    """Writers in table order: the baseline first, then by name."""
    return sorted({r["cache"] for r in rows}, key=lambda w: (w != BASELINE, w))


__all__ = ["BASELINE", "GT_DETAIL", "GT_METRIC", "GT_METRICS", "METRICS", "METRIC_NAMES", "METRIC_RANGE", "TIER_ORDER", "TIER_TITLES", "writers_of"]
