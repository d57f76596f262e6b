"""Seconds per shard of ``worldtrace train encode``, clip by clip or with render workers.

    python benchmarks/encode_rate.py --vae VAE [--workers 0] [--threads 1] [--world towers]
        [--shards 4] [--device cpu] [-o DIR]

Encodes ``--shards`` shards of 32 clips (the GPU runbook's mix: ``--late 0.7 --loop 0.57``, seed 7)
into a fresh folder through :func:`~worldtrace_cli.train.dataset.encode_clips`, notes when each shard
appears, and prints the mean seconds per shard after the first (worker start-up and the first
shard's pipeline fill left out) and clips per minute. Results:
``benchmarks/results/train-encode-workers-cpu.md``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    from worldtrace_cli.train.dataset import SHARD_CLIPS, ClipMix, encode_clips, shard_paths

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vae", required=True, help="a loopworld VAE's weights (train vae's vae.safetensors)")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--world", default="towers", choices=["procedural", "towers"])
    ap.add_argument("--shards", type=int, default=4, help="at least 2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-o", "--output", type=Path, default=None,
                    help="a new data folder, kept (default: a temporary one, removed)")
    a = ap.parse_args()
    if a.shards < 2:
        ap.error("--shards: at least 2 (the first is left out)")
    if a.output is not None and a.output.exists():
        ap.error(f"-o {a.output}: exists; give a new folder (the rate is of fresh shards)")
    out = a.output or Path(tempfile.mkdtemp(prefix="encode-rate-")) / "data"
    seen: dict[int, float] = {}

    def note():  # encode_clips asks between clips (or shards, with workers): note when each shard appeared
        seen.setdefault(len(shard_paths(out)) if out.exists() else 0, time.perf_counter())
        return False

    encode_clips(out, a.vae, a.shards, seed=7, mix=ClipMix(late=0.7, loop=0.57, world=a.world), progress=False,
                 stop=note, workers=a.workers, threads=a.threads, device=a.device)
    seen[a.shards] = time.perf_counter()
    per_shard = (seen[a.shards] - seen[1]) / (a.shards - 1)
    print(f"workers {a.workers}, threads {a.threads}, {a.device}: {per_shard:.1f} s per shard after the first, "
          f"{60 * SHARD_CLIPS / per_shard:.0f} clips per minute")
    if a.output is None:
        shutil.rmtree(out.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
