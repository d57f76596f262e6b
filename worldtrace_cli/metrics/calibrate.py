"""Calibrating the landmark detector's tau from logged detector distances (``worldtrace bench tau``).

A ``landmark`` run logs, for every latent frame leaving the recent window, the cosine distance of
its canonical-key descriptor to the previous one (``landmark_test`` events in ``chunks.jsonl``).
tau decides which of those distances make a scene entry. The procedure, for any model:

1. generate landmark runs on loops of the model's own kind (any tau: every distance is logged);
2. pool the distances and look at their distribution (quantiles below);
3. pick tau so that landmarks are the frames where the view really changes: with ground truth
   (the procedural world: ``loopworld`` runs) tau is the threshold that best separates frames whose
   camera turned or moved a lot since the previous latent frame (``view change >= min_change``)
   from the others (largest balanced accuracy); without it (MG2), the quantile at a target
   landmark rate.

The view change of latent frame f is measured between the last pixel frames of latent frames f-1
and f: ``|wrapped delta yaw| + |delta pitch|`` in degrees plus 45 degrees per unit walked (so a
chunk of walking counts like a chunk of panning at MG2's camera step).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DEG_PER_UNIT = 45.0


def detector_events(run_dir: Path) -> list[dict]:
    """``landmark_test`` events of a run folder's ``chunks.jsonl``: ``{"frame", "distance", "landmark"}``
    (the first frame, which has no distance, is left out)."""
    from ..outputs import read_jsonl

    out = []
    for rec in read_jsonl(Path(run_dir) / "chunks.jsonl"):
        for ev in rec.get("cache", {}).get("events", []):
            if ev.get("type") == "landmark_test" and ev.get("distance") is not None:
                out.append({"frame": ev["frame"], "distance": ev["distance"], "landmark": ev["landmark"]})
    return out


def view_changes(run_dir: Path) -> dict[int, float] | None:
    """True view change (degrees, module docstring) of every latent frame f >= 1 of a procedural-world
    run, from its trajectory and the one motion model; None for other runs."""
    from ..trajectory import load_trajectory, plan_actions
    from .revisit import _wrap_deg
    from ..world.motion import plan_frame_poses

    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return None
    summary = json.loads(path.read_text())
    if summary.get("resolved", {}).get("world_seed") is None:
        return None
    plan = plan_actions(load_trajectory(summary["config"]["trajectory"]), summary["resolved"]["chunks"])
    poses = plan_frame_poses(plan).numpy()
    last = lambda f: min(4 * f, len(poses) - 1)  # noqa: E731  (latent frame f ends at pixel frame 4f)
    out = {}
    for f in range(1, 3 * plan.num_chunks):
        a, b = poses[last(f - 1)], poses[last(f)]
        dyaw = _wrap_deg(b[2] - a[2])
        out[f] = abs(dyaw) + abs(b[3] - a[3]) + DEG_PER_UNIT * float(np.hypot(b[0] - a[0], b[1] - a[1]))
    return out


def calibrate(run_dirs: list[Path], min_change: float = 10.0, target_rate: float = 0.1) -> dict:
    """Pool the detector distances of landmark runs and suggest tau (module docstring).

    Args:
        run_dirs: landmark run folders.
        min_change: view change in degrees (per latent frame) that counts as a scene entry.
        target_rate: landmark share of frames for the ground-truth-free suggestion.
    Returns:
        JSON-able dict: ``frames``, ``quantiles`` of the distance, ``by_rate`` (tau at that share),
        and with ground truth ``spearman`` (distance vs view change), ``tau`` (best balanced accuracy),
        ``curve`` (tau, landmark rate, recall of scene entries, false-positive rate).
    Raises:
        ValueError: no landmark events in the folders.
    """
    from scipy import stats

    dist, change = [], []
    for run in run_dirs:
        events = detector_events(run)
        truth = view_changes(run)
        for ev in events:
            dist.append(ev["distance"])
            change.append(None if truth is None else truth.get(ev["frame"]))
    if not dist:
        raise ValueError("no landmark_test events in the given run folders (generate with --cache landmark)")
    d = np.asarray(dist)
    qs = (0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
    out = {"runs": [str(r) for r in run_dirs], "frames": len(d), "min_change_deg": min_change,
           "quantiles": {str(q): float(np.quantile(d, q)) for q in qs},
           "by_rate": {"rate": target_rate, "tau": float(np.quantile(d, 1 - target_rate))}}
    known = [(x, c) for x, c in zip(dist, change) if c is not None]
    if len(known) >= 4:
        x = np.asarray([k[0] for k in known])
        c = np.asarray([k[1] for k in known])
        entry = c >= min_change
        out["spearman"] = float(stats.spearmanr(x, c).statistic)
        out["scene_entries"] = int(entry.sum())
        curve = []
        for tau in np.unique(np.quantile(x, np.linspace(0.0, 0.99, 100))):
            sel = x > tau
            recall = float(sel[entry].mean()) if entry.any() else None
            fpr = float(sel[~entry].mean()) if (~entry).any() else None
            curve.append({"tau": float(tau), "rate": float(sel.mean()), "recall": recall, "false_positive_rate": fpr})
        scored = [p for p in curve if p["recall"] is not None and p["false_positive_rate"] is not None]
        if scored:
            best = max(scored, key=lambda p: (p["recall"] + 1 - p["false_positive_rate"]) / 2)
            out["tau"] = best["tau"]
            out["at_tau"] = best
        out["curve"] = curve
    return out


def calibration_markdown(result: dict) -> str:
    """A short Markdown report of :func:`calibrate`."""
    lines = ["# Landmark tau calibration", "", f"{result['frames']} detector distances from {len(result['runs'])} runs.",
             "", "| quantile | distance |", "|---|---|"]
    lines += [f"| {q} | {v:.4f} |" for q, v in result["quantiles"].items()]
    lines += ["", f"tau for a landmark rate of {result['by_rate']['rate']:.0%}: **{result['by_rate']['tau']:.4f}**"]
    if "tau" in result:
        a = result["at_tau"]
        lines += ["", f"With ground truth ({result['scene_entries']} scene entries: view change >= "
                  f"{result['min_change_deg']:g} degrees per latent frame; Spearman correlation of distance and "
                  f"view change {result['spearman']:.3f}): best tau **{result['tau']:.4f}** "
                  f"(landmark rate {a['rate']:.1%}, recall {a['recall']:.1%}, false positives "
                  f"{a['false_positive_rate']:.1%})."]
    return "\n".join(lines) + "\n"


__all__ = ["calibrate", "calibration_markdown", "detector_events", "view_changes"]
