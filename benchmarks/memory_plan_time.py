"""Seconds the GPU memory plan takes (``worldtrace bench memory``, generate's check before a CUDA run)
at 1, 64 and 100,000 chunks: constant in --chunks (engine/plan_chunk.py: at most ``fill_limit``
fake commits, then the writer's own growth carried on).

    python benchmarks/memory_plan_time.py [--presets tiny,mg2-universal,lingbot-fast] [-o results.md]

Each figure is one ``plan_memory`` call in this process after one warm-up call of the same preset
(imports and the fake model's construction are paid once, as in ``bench memory``'s own process, which
builds its model once too); a Markdown table goes to stdout (and ``-o``). The machine's CPU is named
in the table's header: a plan runs on the CPU whatever card it plans for.
"""

from __future__ import annotations

import argparse
import platform
import time

CHUNKS = (1, 64, 100_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="tiny,mg2-universal,lingbot-fast")
    parser.add_argument("--caches", default="default,field,full")
    parser.add_argument("-o", "--output", default=None)
    args = parser.parse_args()

    import torch

    from worldtrace_cli.config import default_cache, load_preset, memory_config
    from worldtrace_cli.engine.memory_plan import plan_memory

    try:  # the CPU's model name (Linux); the architecture elsewhere
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    lines = [f"CPU: {cpu}, {torch.get_num_threads()} torch threads, torch {torch.__version__}", "",
             "| preset | cache | " + " | ".join(f"{n:,} chunks: s (peak GB)" for n in CHUNKS) + " |",
             "|---|---|" + "---|" * len(CHUNKS)]
    for name in args.presets.split(","):
        preset = load_preset(name)
        dtype = torch.float32 if name.endswith("tiny") or name == "tiny" else torch.bfloat16
        for cache in args.caches.split(","):
            options = default_cache(preset) if cache == "default" else {"cache": cache}
            extra = {"max_cache_gb": 1e12} if options["cache"] == "full" else {}
            memory = memory_config(preset=preset, **options, **extra)
            plan_memory(preset, memory, dtype=dtype, chunks=1, checkpoint_text=False)  # warm-up
            cells = []
            for n in CHUNKS:
                start = time.perf_counter()
                plan = plan_memory(preset, memory, dtype=dtype, chunks=n, checkpoint_text=False)
                cells.append(f"{time.perf_counter() - start:.1f} ({plan.peak / 1e9:,.2f})")
            lines.append(f"| {name} | {options['cache']} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
