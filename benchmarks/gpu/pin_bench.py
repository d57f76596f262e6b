"""How fast can host memory be page-locked on this GPU machine, and does doing it on a second thread
hold up the generating thread's CUDA work? (Field's host store, `worldtrace_cli/memory/pinned.py`.)

Two sessions measured what a fresh `generate --cache field` run pays for page-locking its growing
host store on an H200: ~1 s per 2 GiB slab (`cudaHostAlloc` through PyTorch's pinned allocator,
~2 GB/s), and allocating the next slab on a background thread made the run slower, not faster
(benchmarks/results/gpu-h200-2026-11-26-d/). Before another blind change, this measures the
alternatives in seconds:

  alloc        torch.empty(n, pin_memory=True): PyTorch's pinned allocator (what the arena does)
  register     torch.empty(n) (pageable), its pages touched by torch's CPU threads (fill_), then
               cudaHostRegister on the whole range (others report ~2 x faster than cudaHostAlloc)
  touch        the touch alone (the part a worker thread could do without the CUDA driver)
  alloc-register8
               torch.empty(n, pin_memory=True) in a child process whose PyTorch pinned allocator is
               configured to do malloc + touch on 8 threads + cudaHostRegister itself
               (PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8,
               PyTorch's option "to avoid large lock wait time with cudaHostAlloc", pytorch#108488):
               the fix that needs no code of ours, if it is faster and does not hold the driver

and, for each, how much a launch-bound GPU loop on the main thread (small matrix products, like a
DiT's per-layer kernels) slows while it runs on a second thread.

    python3 benchmarks/gpu/pin_bench.py [--gib 2] [--repeats 3] [-o pin.json]

The numbers also go to stdout as one JSON line (``pin_bench: {...}``), for a log.

Units: seconds, GB/s (1e9 bytes), loop iterations per second. Needs CUDA (exits 2 without it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch


def _alloc(n: int):
    """``n`` bytes (uint8 [n]) from PyTorch's pinned allocator; ``{"alloc_s": seconds}``."""
    t0 = time.perf_counter()
    x = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    return x, {"alloc_s": time.perf_counter() - t0}


def _touch(n: int):
    """``n`` pageable bytes (uint8 [n]), every page written once; ``{"alloc_s": seconds}``."""
    t0 = time.perf_counter()
    x = torch.empty(n, dtype=torch.uint8)
    x.fill_(0)  # fault the pages in on torch's CPU threads
    return x, {"alloc_s": time.perf_counter() - t0}


def _register(n: int):
    """:func:`_touch`, then ``cudaHostRegister`` on the range; seconds of each part and their sum.
    Raises RuntimeError: the driver refused, or the memory does not read as pinned."""
    x, touched = _touch(n)
    t1 = time.perf_counter()
    err = torch.cuda.cudart().cudaHostRegister(x.data_ptr(), n, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {err}")
    t2 = time.perf_counter()
    if not x.is_pinned():
        raise RuntimeError("registered memory does not read as pinned")
    return x, {"touch_s": touched["alloc_s"], "register_s": t2 - t1, "alloc_s": touched["alloc_s"] + t2 - t1}


METHODS = {"alloc": _alloc, "register": _register, "touch": _touch}
REGISTER_CONF = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"


def _release(method: str, x: torch.Tensor) -> None:
    if method == "register":
        torch.cuda.cudart().cudaHostUnregister(x.data_ptr())


def _loop_rate(seconds: float, stop: threading.Event | None = None) -> float:
    """Iterations per second of a launch-bound loop (8 small matmuls + a sync every 8 iterations)."""
    a = torch.randn(256, 256, device="cuda")
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds and not (stop is not None and stop.is_set()):
        for _ in range(8):
            a = torch.tanh(a @ a)
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    """Measure every method (see the module docstring), print the table and one JSON line, write
    ``-o``. Returns 0, or 2 without CUDA; a method that fails is reported in ``errors``, not raised."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="size of one allocation in GiB (a slab: 2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-o", "--output", help="JSON file for the numbers")
    parser.add_argument("--only", choices=sorted(METHODS), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("pin_bench: needs a CUDA device", file=sys.stderr)
        return 2
    n = int(args.gib * (1 << 30))
    torch.cuda.init()
    _loop_rate(1.0)  # warm up kernels
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bytes": n,
              "threads": torch.get_num_threads(), "alone": {}, "beside_loop": {}}
    base = _loop_rate(2.0)
    result["loop_alone_it_s"] = base
    for method, fn in METHODS.items():
        if args.only and method != args.only:
            continue
        kept = []
        try:
            runs = []
            for _ in range(args.repeats):  # kept alive: PyTorch's pinned cache would hand a freed block back
                x, t = fn(n)
                kept.append(x)
                runs.append(t)
            result["alone"][method] = runs
            # beside a launch-bound loop on this thread: the allocation on a second thread
            done, box = threading.Event(), {}

            def worker():
                try:
                    box["x"], box["t"] = fn(n)
                except Exception as err:  # reported, and the loop stops waiting
                    box["error"] = repr(err)
                finally:
                    done.set()

            th = threading.Thread(target=worker)
            t0 = time.perf_counter()
            th.start()
            rate = _loop_rate(20.0, stop=done)
            th.join()
            if "error" in box:
                raise RuntimeError(box["error"])
            result["beside_loop"][method] = {**box["t"], "loop_it_s": rate, "loop_vs_alone": rate / base,
                                             "wall_s": time.perf_counter() - t0}
            kept.append(box["x"])
        except Exception as err:  # one method failing (e.g. cudaHostRegister refused) leaves the others
            result.setdefault("errors", {})[method] = repr(err)
        for x in kept:
            _release(method, x)
        del kept
    if args.only:  # the child: its numbers to the parent
        print(json.dumps(result))
        return 0
    try:  # alloc through PyTorch's allocator configured to register (read once per process: a child)
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": REGISTER_CONF}
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--gib", str(args.gib), "--repeats",
                                str(args.repeats), "--only", "alloc"], env=env, capture_output=True, text=True,
                               timeout=45)
        if child.returncode != 0 or not child.stdout.strip():
            raise RuntimeError(f"child exited {child.returncode}: {child.stderr.strip()[-300:]}")
        sub = json.loads(child.stdout.strip().splitlines()[-1])  # loop_vs_alone: against the child's own loop
        for part in ("alone", "beside_loop"):
            if "alloc" in sub[part]:
                result[part]["alloc-register8"] = sub[part]["alloc"]
        if sub.get("errors"):
            result.setdefault("errors", {})["alloc-register8"] = sub["errors"]
    except Exception as err:  # noqa: BLE001 - reported, the rest stands
        result.setdefault("errors", {})["alloc-register8"] = repr(err)
    print(f"{result['device']}, torch {result['torch']}, {n / 1e9:.2f} GB per allocation, "
          f"loop alone {base:.0f} it/s")
    print("| method | alone: s (GB/s), each repeat | beside the loop: s | loop it/s vs alone |")
    print("| --- | --- | ---: | ---: |")
    for method in [*METHODS, "alloc-register8"]:
        if method not in result["beside_loop"]:
            print(f"| {method} | failed: {result.get('errors', {}).get(method)} | | |")
            continue
        alone = ", ".join(f"{t['alloc_s']:.3f} ({n / 1e9 / t['alloc_s']:.1f})" for t in result["alone"][method])
        b = result["beside_loop"][method]
        print(f"| {method} | {alone} | {b['alloc_s']:.3f} | {b['loop_vs_alone']:.2f} |")
    print("pin_bench:", json.dumps(result))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
