"""Count the ATen calls of one loopworld DiT training step (``train dit --batched``), on the CPU.

On a GPU every ATen call that runs a kernel is a launch (microseconds each), so a step's call count
bounds how many steps a second the trainer can make there whatever the card. Usage::

    python benchmarks/gpu/train_step_ops.py DATA_DIR [--batch 1,8,64] [--preset loopworld] [--compile]
        [--warmup N]

DATA_DIR: a ``worldtrace train encode`` folder. Prints, per batch size: the groups of clips the step
ran (rollout start / late x target chunk), the seconds of its losses (forward) and of backward +
AdamW on this CPU, and the number of ATen calls (``torch.profiler``, CPU activity). ``--compile``:
the blocks' pure parts compiled as ``train dit --compile default`` does (the warm-up steps compile:
minutes; a step whose targets the warm-up did not meet compiles more, so warm up with several).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from worldtrace_cli.config import load_preset
from worldtrace_cli.model.sampler import FlowMatchSchedule
import worldtrace_cli.train.objective as objective
from worldtrace_cli.train.dit import build_dit
from worldtrace_cli.train.objective import ClipPool, grouped_loss


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data")
    ap.add_argument("--batch", default="1,8,64", help="comma-separated clips per step")
    ap.add_argument("--preset", default="loopworld")
    ap.add_argument("--compile", action="store_true", help="compile as train dit --compile default")
    ap.add_argument("--warmup", type=int, default=1, help="unprofiled steps before each profiled one")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    preset = load_preset(args.preset)
    dit = build_dit(preset, 0).train()
    if args.compile:
        from worldtrace_cli.model.speed import compile_blocks

        compile_blocks(dit, "default", dynamic=True)
    pool = ClipPool(args.data)
    schedule = FlowMatchSchedule(tuple(preset.denoising_steps), preset.timestep_shift, preset.sampler)
    opt = torch.optim.AdamW(dit.parameters(), lr=1e-4)

    def step(batch: int, seed: int) -> tuple[int, float, float]:
        rng = np.random.default_rng(seed)
        clips = [pool.draw(rng) for _ in range(batch)]
        groups = []
        context_state = objective.context_state  # one call per group of clips: count them
        objective.context_state = lambda *a, **k: groups.append(1) or context_state(*a, **k)
        t0 = time.perf_counter()
        try:
            loss = grouped_loss(dit, clips, pool.late_cond, rng, schedule, 0.75, 3.0, 0.5, 0.0)
        finally:
            objective.context_state = context_state
        t1 = time.perf_counter()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return len(groups), t1 - t0, time.perf_counter() - t1

    for batch in (int(b) for b in args.batch.split(",")):
        for w in range(args.warmup):
            step(batch, 100 + w)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            groups, fwd, bwd = step(batch, 1)
        calls = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
        print(f"batch {batch}: {groups} groups, losses {fwd:.2f} s, backward + AdamW {bwd:.2f} s, "
              f"{calls} ATen calls", flush=True)


if __name__ == "__main__":
    main()
