"""A live session's step time as it grows: does chunk 500 cost what chunk 10 does?

    python benchmarks/session_step_time.py --chunks 500 --at 10,100,500 --json out.json

Opens a session of the tiny preset (random weights, CPU) with the sliding cache (a constant-size
cache, so the model's work per chunk is the same at every chunk), steps it ``--chunks`` times with
a walk that turns, and reports, around each chunk of ``--at`` (the mean over the ``--window`` steps
ending there): the wall time of ``step`` (seconds), the time the chunk's record gives the model
(denoise, context, cache, decode) and the rest, which is the session's own bookkeeping: parsing the
actions, growing the action log, the feed's request (rows and camera poses so far), the record.
A session that re-derived its inputs from the whole history would show that rest growing with the
chunk index.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--chunks", type=int, default=500)
    ap.add_argument("--at", default="10,100,500", help="chunk indices (1-based counts) to report around")
    ap.add_argument("--window", type=int, default=5, help="steps averaged, ending at each --at")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    at = [int(x) for x in args.at.split(",")]
    if max(at) > args.chunks or min(at) < args.window:
        ap.error(f"--at must lie in [{args.window}, {args.chunks}]")

    import torch

    import worldtrace_cli as wt

    torch.set_num_threads(max(1, torch.get_num_threads()))
    image = ROOT / "assets" / "images" / "mg2_universal_0000.png"
    walk = ["forward", "forward+camera_l", "forward", "camera_r", "forward+camera_r", "back"]
    wall, model = [], []
    with wt.open(args.preset, cache="sliding", device="cpu", image=image) as s:
        for c in range(args.chunks):
            t0 = time.perf_counter()
            out = s.step(walk[c % len(walk)])
            wall.append(time.perf_counter() - t0)
            model.append(sum(out.record["timings_s"].values()))
            if (c + 1) % 50 == 0:
                print(f"chunk {c + 1}: step {wall[-1]:.3f} s", file=sys.stderr, flush=True)
    rows = []
    for n in at:
        w, m = wall[n - args.window:n], model[n - args.window:n]
        rows.append({"chunk": n, "step_s": round(statistics.mean(w), 4), "model_s": round(statistics.mean(m), 4),
                     "session_s": round(statistics.mean(a - b for a, b in zip(w, m)), 4)})
    result = {"preset": args.preset, "cache": "sliding", "chunks": args.chunks, "window": args.window,
              "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, CPU",
              "torch": torch.__version__, "rows": rows}
    print("| chunk | step (s) | model (s) | session's own (s) |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['chunk']} | {r['step_s']:.3f} | {r['model_s']:.3f} | {r['session_s']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
