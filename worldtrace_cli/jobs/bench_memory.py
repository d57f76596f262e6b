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
# what --offload auto tries, cheapest first: (offload, weights dtype); each later one trades speed for memory
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
    (``weights_dtype`` fp8 skips the candidates in the run's dtype).

    Raises:
        InputError: ``auto`` without a device size (no ``--device-gb`` and no GPU here)."""
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


def check_run_fits(cfg, chunks: int) -> None:
    """Refuse a CUDA run of ``cfg`` (a RunConfig, ``chunks`` long) whose memory plan does not fit its
    device, before the weights load, naming the options that fit. CPU runs, and runs with
    ``WORLDTRACE_NO_MEMORY_CHECK=1``, are not checked. Logs the plan's peak at debug level.

    Raises:
        InputError: the plan exceeds the device (exit 2, one line).
    """
    if os.environ.get(SKIP_ENV) == "1":
        return
    device = device_memory_gb(cfg.device)
    if device is None:
        return
    from ..engine.base import resolve_dtype, resolve_device
    from ..engine.memory_plan import plan_memory

    import time

    total, name = device
    dtype = resolve_dtype(cfg.dtype, resolve_device(cfg.device))
    text = cfg.preset.weights == "checkpoint" and not cfg.random_weights
    log.info("planning GPU memory ...")
    start = time.perf_counter()
    plan = plan_memory(cfg.preset, cfg.memory, "text", cfg.weights_dtype, dtype, chunks, text)
    log.info(f"planning GPU memory ... {time.perf_counter() - start:.1f} s: peak {plan.peak / 1e9:.1f} GB "
             f"({plan.peak_phase}); {name} has {total:.1f} GB")
    if fits(plan, total):
        return
    helps = []
    if cfg.weights_dtype == "auto" and cfg.compile == "none":
        fp8 = plan_memory(cfg.preset, cfg.memory, "text", "fp8", dtype, chunks, text)
        if fits(fp8, total):
            helps.append(f"--weights-dtype fp8 (plan {fp8.peak / 1e9:.1f} GB)")
    tip = f"these fit: {'; '.join(helps)}" if helps else "a smaller --budget or cache, or a larger card"
    raise InputError(f"GPU memory: the plan of {cfg.preset.name} with --cache {cfg.memory.cache} peaks at "
                     f"{plan.peak / 1e9:.1f} GB ({plan.peak_phase}), {name} has {total:.1f} GB: {tip} "
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


__all__ = ["CANDIDATES", "HEADROOM", "RESERVE_GB", "SKIP_ENV", "check_run_fits", "device_memory_gb", "fits",
           "memory_markdown", "memory_plans"]
