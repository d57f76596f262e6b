"""``worldtrace bench memory`` and ``generate``'s memory check: a run's GPU memory plan
(:func:`~worldtrace_cli.engine.memory_plan.plan_memory`) against a device's memory, and the options
that make it fit.
"""

from __future__ import annotations

import logging
import os

from ..errors import InputError

log = logging.getLogger("worldtrace")

# the plan leaves out cuBLAS / cuDNN workspaces, allocator rounding and the CUDA context: against the peaks
# torch.cuda.max_memory_allocated reported on an H200 (docs/gpu-memory.md) the plan of the code measured was
# 0.7 % under (MG2 sliding and field) to 4.7 % over (LingBot-World, eager); a run is taken to fit when
# plan * HEADROOM + RESERVE_GB is within the device's memory
HEADROOM = 1.05
RESERVE_GB = 1.0
# bench memory --offload auto's candidates and the options a refusal names, cheapest first: (offload, weights
# dtype); each later one trades speed for memory (generate's own --offload auto tries text, then blocks)
CANDIDATES = (("text", "auto"), ("text", "fp8"), ("blocks", "auto"), ("blocks", "fp8"))
SKIP_ENV = "WORLDTRACE_NO_MEMORY_CHECK"  # set to 1: generate runs without checking its plan


def fits(plan, device_gb: float) -> bool:
    """True when ``plan`` (a MemoryPlan) with the unplanned margin (:data:`HEADROOM`, :data:`RESERVE_GB`)
    is within ``device_gb`` GB (1e9 bytes)."""
    return plan.peak / 1e9 * HEADROOM + RESERVE_GB <= device_gb


def device_memory_gb(device: str = "auto") -> tuple[float, str] | None:
    """(total GB, name) of the CUDA device ``device`` resolves to, or None on a CPU run."""
    from ..engine.base import resolve_device

    dev = resolve_device(device)
    if dev.type != "cuda":
        return None
    import torch

    props = torch.cuda.get_device_properties(dev)
    return props.total_memory / 1e9, props.name


def memory_plans(preset, memory, offload: str, weights_dtype: str, dtype, chunks: int, checkpoint_text: bool | None,
                 device_gb: float | None) -> list:
    """The plans ``bench memory`` prints: the one asked for, or with ``offload`` ``auto`` the
    :data:`CANDIDATES` in order up to the first that fits ``device_gb`` (all of them without one)
    (``weights_dtype`` fp8 skips the candidates in the run's dtype)."""
    from ..engine.memory_plan import plan_memory

    if offload != "auto":
        return [plan_memory(preset, memory, offload, weights_dtype, dtype, chunks, checkpoint_text)]
    plans = []
    for off, wd in CANDIDATES:
        if weights_dtype == "fp8" and wd == "auto":
            continue
        plans.append(plan_memory(preset, memory, off, wd, dtype, chunks, checkpoint_text))
        if device_gb is not None and fits(plans[-1], device_gb):
            break
    return plans


def fit_run(cfg, chunks: int):
    """``cfg`` (a RunConfig, ``chunks`` long) with its ``offload`` resolved, after checking that a CUDA
    run's memory plan fits its device, before the weights load. ``offload`` ``auto``: ``text`` when
    that fits (and on a CPU, and with ``WORLDTRACE_NO_MEMORY_CHECK=1``), else ``blocks`` when that does
    (not with ``--compile``). Logs the plan's peak.

    Raises:
        InputError: nothing asked for fits (exit 2, one line naming the options that would).
    """
    from dataclasses import replace

    from ..engine import shard

    # a sharded run (--fsdp, --split-heads) holds ~1/N of the DiT per process: not what the plan counts, so not checked
    device = None if os.environ.get(SKIP_ENV) == "1" or shard.active() else device_memory_gb(cfg.device)
    if device is None:
        return replace(cfg, offload="text") if cfg.offload == "auto" else cfg
    import time

    from ..engine.base import resolve_dtype, resolve_device
    from ..engine.memory_plan import plan_memory

    total, name = device
    dtype = resolve_dtype(cfg.dtype, resolve_device(cfg.device))
    text = cfg.preset.weights == "checkpoint" and not cfg.random_weights

    def plan(offload, weights_dtype=cfg.weights_dtype):
        return plan_memory(cfg.preset, cfg.memory, offload, weights_dtype, dtype, chunks, text)

    log.info("planning GPU memory ...")
    start = time.perf_counter()
    offloads = [cfg.offload] if cfg.offload != "auto" else ["text"] + (["blocks"] if cfg.compile == "none" else [])
    for offload in offloads:
        got = plan(offload)
        log.info(f"planning GPU memory ... {time.perf_counter() - start:.1f} s: --offload {offload} peaks at "
                 f"{got.peak / 1e9:.1f} GB ({got.peak_phase}); {name} has {total:.1f} GB")
        if fits(got, total):
            return replace(cfg, offload=offload)
    tip = "a smaller --budget or cache, or a larger card"
    for offload, weights_dtype in CANDIDATES if cfg.compile == "none" else ():
        tried = offload in offloads and weights_dtype == cfg.weights_dtype
        if tried or (weights_dtype == "auto" and cfg.weights_dtype != "auto"):
            continue
        other = plan(offload, weights_dtype)
        if fits(other, total):
            tip = (f"this fits: --offload {offload}" + (f" --weights-dtype {weights_dtype}" if weights_dtype != "auto"
                                                        else "") + f" (plan {other.peak / 1e9:.1f} GB)")
            break
    raise InputError(f"GPU memory: the plan of {cfg.preset.name} with --cache {cfg.memory.cache} and --offload "
                     f"{offloads[-1]} peaks at "
                     f"{got.peak / 1e9:.1f} GB ({got.peak_phase}), {name} has {total:.1f} GB: {tip} "
                     f"(worldtrace bench memory --preset {cfg.preset.name} shows the phases; "
                     f"{SKIP_ENV}=1 runs anyway)")


def memory_markdown(plans: list, device_gb: float | None, device_name: str | None) -> str:
    """A Markdown table of ``plans``: one row per plan, GB per phase, the peak and whether it fits."""
    cols = ["offload", "weights", "load", "text", "denoise", "context", "decode", "peak", "fits"]
    lines = [f"device: {device_name or 'none'}" + (f", {device_gb:.1f} GB" if device_gb else ""), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for plan in plans:
        d = plan.to_dict()
        ph = d["phases_gb"]
        verdict = "-" if device_gb is None else ("yes" if fits(plan, device_gb) else "no")
        lines.append(f"| {d['options']['offload']} | {d['options']['weights_dtype']} | "
                     + " | ".join(f"{ph[p]:.2f}" for p in ("load", "text", "denoise", "context", "decode"))
                     + f" | **{d['peak_gb']:.2f}** ({d['peak_phase']}) | {verdict} |")
    return "\n".join(lines)


__all__ = ["CANDIDATES", "HEADROOM", "RESERVE_GB", "SKIP_ENV", "device_memory_gb", "fit_run", "fits",
           "memory_markdown", "memory_plans"]
