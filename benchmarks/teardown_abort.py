"""How often a sharded run that completed ends with a non-zero exit (gloo's teardown abort: "terminate
called without an active exception", exit 134 from a process, 1 from torchrun), measured over many runs
under load (docs/gpu-memory.md).

    python benchmarks/teardown_abort.py --runs 100 [--load 1] [--mode split-heads|fsdp] [--launch torchrun|nproc]

Each run is `worldtrace generate --preset tiny ... --chunks 2` in two processes on the CPU (gloo), launched
by torchrun or by `generate --nproc-per-node 2`, with `--load` busy processes beside it. Prints one line per
run and a summary: runs, complete, exit statuses, aborts seen.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _busy(stop):
    x = 0
    while not stop.is_set():
        x = (x * 31 + 7) % 1_000_003


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--load", type=int, default=1, help="busy processes beside the runs")
    parser.add_argument("--mode", choices=["split-heads", "fsdp"], default="split-heads")
    parser.add_argument("--launch", choices=["torchrun", "nproc"], default="torchrun")
    parser.add_argument("--json", type=Path, default=None, help="write the counts here")
    args = parser.parse_args()
    stop = multiprocessing.Event()
    load = [multiprocessing.Process(target=_busy, args=(stop,), daemon=True) for _ in range(args.load)]
    for p in load:
        p.start()
    statuses, aborts, complete = collections.Counter(), 0, 0
    started = time.time()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for i in range(args.runs):
                out = Path(scratch) / f"run{i}"
                generate = ["generate", str(ROOT / "trajectories" / "aba.yaml"), "--preset", "tiny", "--image",
                            str(ROOT / "assets" / "images" / "mg2_universal_0000.png"), "--chunks", "2",
                            "--metrics", "none", "--no-progress", f"--{args.mode}", "-o", str(out)]
                cmd = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "worldtrace_cli",
                        *generate] if args.launch == "torchrun" else
                       [sys.executable, "-m", "worldtrace_cli", *generate, "--nproc-per-node", "2"])
                run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
                done = (out / "summary.json").is_file() and json.loads((out / "summary.json").read_text())["status"] \
                    == "complete"
                abort = "terminate called" in run.stderr
                statuses[run.returncode] += 1
                aborts += abort
                complete += done
                print(f"run {i}: exit {run.returncode}, {'complete' if done else 'NOT complete'}"
                      f"{', teardown abort' if abort else ''}", flush=True)
    finally:
        stop.set()
    result = {"runs": args.runs, "complete": complete, "exit_statuses": dict(statuses), "teardown_aborts": aborts,
              "mode": args.mode, "launch": args.launch, "load_processes": args.load, "cpus": os.cpu_count(),
              "seconds": round(time.time() - started, 1)}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if statuses.get(0, 0) == args.runs else 1


if __name__ == "__main__":
    raise SystemExit(main())
