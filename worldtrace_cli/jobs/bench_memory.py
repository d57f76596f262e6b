"""``worldtrace bench memory`` and ``generate``'s memory check: a run's GPU memory plan
(:func:`~worldtrace_cli.engine.memory_plan.plan_memory`) against a device's memory, and the options
that make it fit.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from contextvars import ContextVar

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
# generate's --weights-dtype: auto = the run's --dtype (what every summary.json so far records as auto and --resume
# reads back), fp8, or FIT = chosen by the plan: the run's dtype when that fits the card, else fp8 when that does
FIT = "fit"
WEIGHTS_CHOICES = ("auto", "fp8", FIT)
_PLANNED_CARD: ContextVar[float | None] = ContextVar("planned_card_gb", default=None)


def fits(plan, device_gb: float) -> bool:
    """True when ``plan`` (a MemoryPlan) with the unplanned margin (:data:`HEADROOM`, :data:`RESERVE_GB`)
    is within ``device_gb`` GB (1e9 bytes)."""
    return fits_peak(plan.peak / 1e9, device_gb)


def fits_peak(peak_gb: float, device_gb: float) -> bool:
    """:func:`fits` for a planned peak given in GB (1e9 bytes): ``peak_gb * HEADROOM + RESERVE_GB <= device_gb``."""
    return peak_gb * HEADROOM + RESERVE_GB <= device_gb


@contextmanager
def planned_card(device_gb: float | None):
    """Inside the block, :func:`fit_run` plans for a card of ``device_gb`` GB (1e9 bytes) instead of the GPU this
    machine has (``generate --device-gb``; on a CPU as if it had one: the choice a run would make there, applied
    here); None: this machine's GPU, if any. The card is set for this context only (a ``contextvars`` value)."""
    token = _PLANNED_CARD.set(device_gb)
    try:
        yield
    finally:
        _PLANNED_CARD.reset(token)


def planned_device(device: str = "auto") -> tuple[float, str, bool] | None:
    """(GB, name, given) of the card :func:`fit_run` plans for: the one :func:`planned_card` set (``given`` True),
    else the CUDA device ``device`` resolves to (:func:`device_memory_gb`), else None (a CPU run)."""
    card = _PLANNED_CARD.get()
    if card is not None:
        return card, f"a {card:g} GB card (--device-gb)", True
    found = device_memory_gb(device)
    return None if found is None else (*found, False)


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
    """``cfg`` (a RunConfig, ``chunks`` long) with its ``offload`` and ``weights_dtype`` resolved, after checking
    that a CUDA run's memory plan fits its device (or the card :func:`planned_card` names: ``generate
    --device-gb``), before the weights load. Tried in :data:`CANDIDATES` order (cheapest first), the first that
    fits is taken: ``offload`` ``auto`` tries ``text`` then ``blocks`` (not with ``--compile``), ``weights_dtype``
    :data:`FIT` tries ``auto`` (the run's dtype) then ``fp8`` (not with ``--compile``); a value given is kept.
    Without a card to plan for (a CPU run without ``--device-gb``, ``WORLDTRACE_NO_MEMORY_CHECK=1``, a sharded
    run) ``auto`` is ``text`` and ``fit`` is ``auto``. Logs each plan's peak and, when something was chosen, one
    line saying what and why; the choice is the returned config's (summary.json's ``config``).

    Raises:
        InputError: nothing asked for fits (exit 2, one line naming the options that would).
    """
    from dataclasses import replace

    from ..engine import shard

    # a sharded run (--fsdp, --split-heads) holds ~1/N of the DiT per process: not what the plan counts, so not checked
    card = None if os.environ.get(SKIP_ENV) == "1" or shard.active() else planned_device(cfg.device)
    if card is None:
        chosen = replace(cfg, offload="text" if cfg.offload == "auto" else cfg.offload,
                         weights_dtype="auto" if cfg.weights_dtype == FIT else cfg.weights_dtype)
        if cfg.weights_dtype == FIT:
            log.info("--weights-dtype fit: auto (the run's --dtype): no GPU to plan for (--device-gb N plans for "
                     "a card of N GB)")
        return chosen
    import time

    import torch

    from ..engine.base import resolve_dtype, resolve_device
    from ..engine.memory_plan import plan_memory

    total, name, given = card
    # a card named by --device-gb runs in a GPU's dtype (--dtype auto: bf16), wherever this process runs
    dtype = resolve_dtype(cfg.dtype, torch.device("cuda") if given else resolve_device(cfg.device))
    text = cfg.preset.weights == "checkpoint" and not cfg.random_weights
    eager = cfg.compile == "none"
    offloads = [cfg.offload] if cfg.offload != "auto" else ["text"] + (["blocks"] if eager else [])
    weights = [cfg.weights_dtype] if cfg.weights_dtype != FIT else ["auto"] + (["fp8"] if eager else [])
    tries = [(o, w) for o, w in CANDIDATES if o in offloads and w in weights]

    def plan(offload, weights_dtype):
        return plan_memory(cfg.preset, cfg.memory, offload, weights_dtype, dtype, chunks, text)

    log.info("planning GPU memory ...")
    start = time.perf_counter()
    missed = []
    for offload, weights_dtype in tries:
        got = plan(offload, weights_dtype)
        log.info(f"planning GPU memory ... {time.perf_counter() - start:.1f} s: {_flags(offload, weights_dtype)} "
                 f"peaks at {got.peak / 1e9:.1f} GB ({got.peak_phase}); {name} has {total:.1f} GB")
        if fits(got, total):
            if len(tries) > 1:
                why = "; ".join(missed) if missed else "the first tried"
                log.info(f"GPU memory: chose {_flags(offload, weights_dtype)} for {name}: plan {got.peak / 1e9:.1f} GB "
                         f"({got.peak_phase}) x {HEADROOM} + {RESERVE_GB:g} GB fits {total:.1f} GB ({why})")
            return replace(cfg, offload=offload, weights_dtype=weights_dtype)
        missed.append(f"{_flags(offload, weights_dtype)} {got.peak / 1e9:.1f} GB does not fit")
    tip = "a smaller --budget or cache, or a larger card"
    for offload, weights_dtype in CANDIDATES if eager else ():
        if (offload, weights_dtype) in tries or (weights_dtype == "auto" and cfg.weights_dtype == "fp8"):
            continue
        other = plan(offload, weights_dtype)
        if fits(other, total):
            tip = f"this fits: {_flags(offload, weights_dtype)} (plan {other.peak / 1e9:.1f} GB)"
            break
    asked = _flags(offloads[-1], cfg.weights_dtype if cfg.weights_dtype != FIT else weights[-1])
    raise InputError(f"GPU memory: the plan of {cfg.preset.name} with --cache {cfg.memory.cache} and {asked} peaks at "
                     f"{got.peak / 1e9:.1f} GB ({got.peak_phase}), {name} has {total:.1f} GB: {tip} "
                     f"(worldtrace bench memory --preset {cfg.preset.name} shows the phases; "
                     f"{SKIP_ENV}=1 runs anyway)")


def _flags(offload: str, weights_dtype: str) -> str:
    """The command-line flags of a mode: ``--offload text``, ``--offload blocks --weights-dtype fp8``."""
    return f"--offload {offload}" + (f" --weights-dtype {weights_dtype}" if weights_dtype != "auto" else "")


def model_summary(preset) -> dict:
    """What a plan of ``preset`` assumes about its model, for ``bench memory``'s output: the resolution, the
    DiT's sizes (``dim``, ``ffn_dim``, ``num_heads``, ``num_layers``, ``in_dim``) and parameter count (built on
    the meta device: no memory), and the preset's description (LingBot-World v2 1.3B: which size it assumes)."""
    import torch

    with torch.device("meta"):
        dit = preset.backbone.load("dit")(preset.dit)
    sizes = {k: getattr(preset.dit, k) for k in ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim")}
    return {"preset": preset.name, "resolution": f"{preset.height}x{preset.width}", "dit": sizes,
            "dit_parameters": sum(p.numel() for p in dit.parameters()), "description": preset.description}


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


__all__ = ["CANDIDATES", "FIT", "HEADROOM", "RESERVE_GB", "SKIP_ENV", "WEIGHTS_CHOICES", "device_memory_gb", "fit_run",
           "fits", "fits_peak", "memory_markdown", "memory_plans", "model_summary", "planned_card", "planned_device"]
