"""The memory plan beside the measured peak: reads ``plan-*.json`` (``worldtrace bench memory --json``)
and ``speed-*.json`` (``worldtrace bench speed``) in a results folder and prints one Markdown row per
pair (``plan-lingbot-fp8.json`` goes with ``speed-lingbot-fp8.json``; ``plan-mg2-field.json`` with the
field row of ``speed-*-writers-b6.json``). A measured peak is ``torch.cuda.max_memory_allocated`` from
the rollout's start (the conditioning before it is not in it): it is set beside the plan's largest
chunk phase (denoise, context, decode).

Usage: python benchmarks/gpu/plan_vs_measured.py RESULTS_DIR
"""

import json
import sys
from pathlib import Path


def chunk_peak(plan: dict) -> float:
    """The plan's largest chunk phase, GB."""
    return max(plan["phases_gb"][p] for p in ("denoise", "context", "decode"))


def rows(folder: Path) -> list[str]:
    out = ["| plan file | measured run | cache | measured GB | plan GB | plan / measured |", "|---|---|---|---|---|---|"]
    speeds = {p.stem: json.loads(p.read_text()) for p in folder.glob("speed-*.json")}
    for path in sorted(folder.glob("plan-*.json")):
        plan = json.loads(path.read_text())["plans"][0]
        cache = plan["options"]["cache"]
        suffix = path.stem.removeprefix("plan-")
        match = [(name, s) for name, s in speeds.items() if name.endswith(suffix)] or \
            [(name, s) for name, s in speeds.items() if name.endswith("writers-b6")]
        for name, speed in match:
            peaks = [r["gpu_peak_bytes"] for r in speed["rows"] if r["cache"] == cache and r.get("gpu_peak_bytes")]
            if not peaks:
                continue
            measured = max(peaks) / 1e9
            out.append(f"| {path.name} | {name} ({speed['meta'].get('device_name')}) | {cache} | {measured:.2f} | "
                       f"{chunk_peak(plan):.2f} | {chunk_peak(plan) / measured:.3f} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1]))))
