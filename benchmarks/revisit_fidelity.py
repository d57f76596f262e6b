"""WorldKV's own revisit protocol on a LoopBench sweep of a procedural-world preset (loopworld).

For every complete run under SWEEP_DIR (``<config>/<writer>/<scene>/seed<s>/``): the pixel frames
whose camera pose (the one motion model, :func:`~worldtrace_cli.world.motion.plan_frame_poses`) equals
an earlier frame's pose at least one chunk before (same x, y, yaw, pitch to 1e-6) are revisits; each
revisit frame is scored against the generated frame of the first visit (PSNR / SSIM, WorldKV's
self-consistency reference, worldkv.md A14) and against the true render (GT-PSNR). Means per
configuration and writer are printed as a markdown table and written as JSON.

    python benchmarks/revisit_fidelity.py SWEEP_DIR [-o OUT.json]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def same_pose_pairs(poses: np.ndarray, min_gap: int = 12) -> list[tuple[int, int]]:
    """(first visit, revisit) pixel-frame pairs: revisit r's pose equals the pose of the earliest
    frame f <= r - min_gap (12 pixel frames = one chunk)."""
    key = np.round(np.concatenate([poses[:, :2], np.mod(poses[:, 2:3], 360.0), poses[:, 3:4]], 1), 6)
    first: dict[tuple, int] = {}
    pairs = []
    for r, k in enumerate(map(tuple, key)):
        if k in first and r - first[k] >= min_gap:
            pairs.append((first[k], r))
        first.setdefault(k, r)
    return pairs


def score_run(run: Path) -> dict | None:
    from worldtrace_cli.metrics import gt_scores
    from worldtrace_cli.outputs import read_video_frames
    from worldtrace_cli.trajectory import load_trajectory, plan_actions
    from worldtrace_cli.world.motion import plan_frame_poses
    from worldtrace_cli.world.truth import GroundTruth

    summary = json.loads((run / "summary.json").read_text())
    if summary.get("status") != "complete" or summary["resolved"].get("world_seed") is None:
        return None
    plan = plan_actions(load_trajectory(summary["config"]["trajectory"]), summary["resolved"]["chunks"])
    frames = read_video_frames(run / "video.mp4")
    pairs = [(a, b) for a, b in same_pose_pairs(plan_frame_poses(plan).numpy()) if b < len(frames)]
    if not pairs:
        return None
    first, again = zip(*pairs)
    self_scores = gt_scores(frames[list(again)], frames[list(first)])
    truth = GroundTruth(summary["resolved"]["world_seed"], plan, frames.shape[1], frames.shape[2],
                        summary.get("config", {}).get("preset", {}).get("world"))
    true_frames = np.stack([truth.frames(b, b + 1)[0] for b in again])
    gt = gt_scores(frames[list(again)], true_frames)
    return {"pairs": len(pairs), "psnr": float(np.mean(self_scores["psnr"])), "ssim": float(np.mean(self_scores["ssim"])),
            "gt_psnr": float(np.mean(gt["psnr"]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for summary in sorted(args.sweep.glob("*/*/*/seed*/summary.json")):
        run = summary.parent
        scores = score_run(run)
        if scores is not None:
            config, writer = run.parts[-4], run.parts[-3]
            cells[(config, writer)].append(scores)
    rows = [{"config": c, "writer": w, "runs": len(v), "pairs": sum(s["pairs"] for s in v),
             **{k: float(np.mean([s[k] for s in v])) for k in ("psnr", "ssim", "gt_psnr")}}
            for (c, w), v in sorted(cells.items())]
    print("| config | writer | runs | pairs | revisit PSNR vs first visit (dB) | SSIM | revisit GT-PSNR (dB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['config']} | {r['writer']} | {r['runs']} | {r['pairs']} | {r['psnr']:.2f} | {r['ssim']:.3f} | "
              f"{r['gt_psnr']:.2f} |")
    if args.output:
        args.output.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
