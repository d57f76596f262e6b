"""What both trainers share: a resumable, time-budgeted optimisation loop with a loss log.

A training folder holds ``train_state.pt`` (model, optimiser, step, RNG states; written atomically
every ``save_every`` steps and at the end, read back with ``torch.load(weights_only=True)``),
``loss.jsonl`` (one line per logged step: step, loss terms, learning rate, elapsed seconds) and
``settings.json`` (the trainer's arguments). Running the same command again continues from the
saved step; a folder made with other settings is refused.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import InputError, Interrupted

log = logging.getLogger("worldtrace")
STATE_FILE = "train_state.pt"
LOSS_FILE = "loss.jsonl"
SETTINGS_FILE = "settings.json"


@dataclass(frozen=True)
class LoopSettings:
    """Budget and schedule of a training run.

    Attributes:
        steps: optimiser steps in all (the run may stop earlier at ``minutes``).
        minutes: wall-clock budget of this invocation in minutes (0: no limit).
        lr: peak learning rate (AdamW), reached after ``warmup`` steps, then cosine to ``lr / 10``
            at ``steps``.
        save_every: steps between train-state saves; log_every: steps between loss-log lines.
        seed: seeds data and noise; threads: torch CPU threads (1 is fastest on a loaded 2-core machine).
        ema: decay of an exponential moving average of the weights kept beside them (0: none), e.g.
            0.999 (a horizon of ~1,000 steps); see :class:`WeightAverage`.
    """

    steps: int = 10000
    minutes: float = 0.0
    lr: float = 1e-3
    warmup: int = 200
    save_every: int = 250
    log_every: int = 25
    seed: int = 0
    threads: int = 1
    ema: float = 0.0


# LoopSettings fields added after training folders existed, with the value older runs were trained with
LOOP_IMPLIED = {"ema": 0.0}


class WeightAverage:
    """An exponential moving average of a model's floating-point parameters (the usual companion of
    diffusion training: the average of noisy small-batch updates samples better than the last
    weights). After update n (counted from 0) the average moves by ``1 - d_n`` towards the weights,
    ``d_n = min(decay, (1 + n) / (10 + n))`` (the warm-up keeps early averages from clinging to the
    initial weights). Tensors are float32 copies on the CPU, keyed like ``model.state_dict()``.
    """

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay, self.updates = decay, 0
        self.params = {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in model.state_dict().items()
                       if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """Move the average towards ``model``'s current weights (call after each optimiser step)."""
        d = min(self.decay, (1 + self.updates) / (10 + self.updates))
        current = model.state_dict()
        for k, avg in self.params.items():
            avg.mul_(d).add_(current[k].detach().to("cpu", torch.float32), alpha=1 - d)
        self.updates += 1

    def state_dict(self) -> dict:
        """The average and its update count (saved in the training state)."""
        return {"params": self.params, "updates": torch.tensor(self.updates)}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`. Raises KeyError when a parameter is missing."""
        self.params = {k: state["params"][k].float().clone() for k in self.params}
        self.updates = int(state["updates"])


def learning_rate(step: int, s: LoopSettings) -> float:
    """Linear warm-up to ``s.lr`` over ``s.warmup`` steps, then cosine decay to ``s.lr / 10`` at ``s.steps``."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, s.steps - s.warmup))
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _differing(old: dict, new: dict, implied: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two settings dicts (nested dicts compared per key; a
    key absent on one side equals its ``implied`` value, keyed by dotted path, on the other)."""
    out = []
    for k in sorted(set(old) | set(new)):
        name = prefix + k
        a, b = old.get(k, implied.get(name)), new.get(k, implied.get(name))
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differing(a, b, implied, name + ".")
        elif a != b:
            out.append(name)
    return out


def prepare_folder(folder: Path, settings: dict, implied: dict | None = None) -> bool:
    """Create ``folder`` or check that it belongs to a run with the same ``settings``.

    ``implied``: settings keys added after training folders already existed (dotted paths, e.g.
    ``preset.architecture``) with the value a folder written before the key existed was trained
    with; an older settings.json lacking such a key is the same run.
    :data:`LOOP_IMPLIED` (keys of :class:`LoopSettings`) is always implied.
    Returns True when a saved state exists (the run continues).
    Raises:
        InputError: the folder holds a run made with other settings (names the differing keys,
            dotted for nested ones, e.g. ``preset.dit.dim``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / SETTINGS_FILE
    ignored = {"minutes", "threads", "steps", "log_every"}  # may change between invocations (more steps: train longer)
    if path.exists():
        old = json.loads(path.read_text())
        diff = _differing({k: v for k, v in old.items() if k not in ignored},
                          {k: v for k, v in settings.items() if k not in ignored}, {**LOOP_IMPLIED, **(implied or {})})
        if diff:
            raise InputError(f"{folder}: holds a training run with other settings ({', '.join(diff)}); "
                             f"use another folder")
    path.write_text(json.dumps(settings, indent=2, default=str) + "\n")
    return (folder / STATE_FILE).exists()


def save_safetensors_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict | None = None) -> None:
    """Write ``tensors`` (contiguous copies are made) to the safetensors file ``path`` through a
    temporary file and ``os.replace``, so a kill mid-write never leaves a corrupt file behind."""
    import os

    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)
    os.replace(tmp, path)


def run_loop(folder: Path, model: torch.nn.Module, step_fn: Callable[[int, np.random.Generator], dict],
             s: LoopSettings, progress: bool = True, extra_state: dict | None = None,
             stop=lambda: False, on_save=None) -> dict:
    """Optimise ``model`` with AdamW, calling ``step_fn(step, rng) -> {"loss": tensor, ...}`` per step.

    ``step_fn`` returns a dict whose ``loss`` is backpropagated (other entries are floats logged as
    they are). Gradients are clipped to norm 1. Resumes from ``folder/train_state.pt`` if present
    (model, optimiser, step, data RNG, torch RNG, and ``extra_state`` entries that are tensors).
    With ``s.ema`` a :class:`WeightAverage` of the weights is kept (and saved in the state). The state
    is saved every ``s.save_every`` steps, on ``stop()`` and at the end; ``on_save(average)`` is
    called after each save with the averaged weights (a state dict) or None without ``s.ema`` (e.g.
    to write the current weights files).

    Returns:
        ``{"step": last step, "steps_this_run", "minutes": wall-clock minutes of this invocation (loop
        only: the model is built before), "loss": mean loss of
        the steps since the last logged window, else of that window; None when no step ran}``.
    Raises:
        Interrupted: ``stop()`` became true (Ctrl-C / SIGTERM); the state was saved first.
    """
    from tqdm import tqdm

    torch.set_num_threads(s.threads)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=s.lr, betas=(0.9, 0.99),
                            weight_decay=0.01)
    rng = np.random.default_rng([s.seed, 1])
    step = 0
    average = WeightAverage(model, s.ema) if s.ema else None
    state_path = folder / STATE_FILE
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        rng.bit_generator.state = json.loads(state["numpy_rng"])
        torch.set_rng_state(state["torch_rng"])
        if average is not None:
            average.load_state_dict(state["ema"])
        if extra_state is not None:
            extra_state.update(state.get("extra", {}))
        log.info(f"resuming {folder} at step {step}")

    def save():
        _atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                      "numpy_rng": json.dumps(rng.bit_generator.state), "torch_rng": torch.get_rng_state(),
                      "extra": extra_state or {}, **({"ema": average.state_dict()} if average else {})}, state_path)
        if on_save is not None:
            on_save(None if average is None else average.params)

    start, first_step = time.perf_counter(), step
    window: dict[str, list[float]] = {}
    last: dict = {}
    bar = tqdm(total=s.steps, initial=step, disable=not progress, unit="step", dynamic_ncols=True)
    with open(folder / LOSS_FILE, "a") as log_fh:
        while step < s.steps:
            if s.minutes and time.perf_counter() - start > 60 * s.minutes:
                break
            if stop():
                save()
                raise Interrupted(f"training stopped at step {step}; run the same command to continue")
            lr = learning_rate(step, s)
            for group in opt.param_groups:
                group["lr"] = lr
            out = step_fn(step, rng)
            loss = out["loss"]
            if not torch.isfinite(loss):
                save()
                raise RuntimeError(f"non-finite loss at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if average is not None:
                average.update(model)
            step += 1
            for k, v in out.items():
                window.setdefault(k, []).append(float(v.detach()) if isinstance(v, torch.Tensor) else float(v))
            bar.update(1)
            if step % s.log_every == 0 or step == s.steps:
                last = {k: float(np.mean(v)) for k, v in window.items()}
                window.clear()
                bar.set_postfix(loss=f"{last['loss']:.4f}")
                log_fh.write(json.dumps({"step": step, **{k: round(v, 6) for k, v in last.items()},
                                         "lr": lr, "seconds": round(time.perf_counter() - start, 2)}) + "\n")
                log_fh.flush()
            if step % s.save_every == 0:
                save()
    bar.close()
    save()
    if window.get("loss"):  # steps since the last logged window (a run shorter than --log-every)
        last = {"loss": float(np.mean(window["loss"]))}
    return {"step": step, "steps_this_run": step - first_step, "minutes": (time.perf_counter() - start) / 60,
            "loss": last.get("loss")}


def settings_dict(s: LoopSettings, **more) -> dict:
    """JSON-able settings of a run (LoopSettings fields plus trainer-specific ones)."""
    return {**asdict(s), **more}


__all__ = ["LOOP_IMPLIED", "LoopSettings", "WeightAverage", "learning_rate", "prepare_folder", "run_loop", "save_safetensors_atomic", "settings_dict"]
