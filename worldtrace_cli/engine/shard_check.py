"""What a sharded run (``generate --fsdp`` / ``--split-heads``, :mod:`~worldtrace_cli.engine.shard`)
refuses, checked without torch so that a refusal comes before torch and the model load (docs/gpu-memory.md)."""

from __future__ import annotations

import os

from ..errors import InputError

MODES = {"fsdp": "--fsdp", "heads": "--split-heads"}


def check_split(world: int, heads: int | None, ffn: int | None) -> None:
    """Refuse a head split the DiT cannot take: ``world`` processes must divide its ``heads`` and its
    FFN width ``ffn`` (None: not known yet, checked once the DiT is built).

    Raises:
        InputError: one of them does not divide by ``world``.
    """
    for what, count in (("attention heads", heads), ("FFN width", ffn)):
        if count is not None and count % world:
            hint = f"use a process count that divides {count}" if heads is None or ffn is None else \
                f"use a process count that divides both {heads} and {ffn}"
            raise InputError(f"--split-heads over {world} processes: the DiT's {what} ({count}) do not divide by "
                             f"{world}; {hint} (or --fsdp)")


def check(cfg, mode: str = "fsdp", world: int | None = None) -> None:
    """Refuse what a sharded run does not do yet (one line, before anything loads).

    Args:
        world: the process count (``generate --nproc-per-node``); None: torchrun's WORLD_SIZE.
    Raises:
        InputError: ``--compile``, ``--weights-dtype fp8`` or ``--offload blocks`` with ``--fsdp`` or
            ``--split-heads`` (``mode``); ``--split-heads`` over a process count that does not divide
            the preset's heads or FFN width (:func:`check_split`).
    """
    for flag, value, default in (("--compile", cfg.compile, "none"), ("--weights-dtype", cfg.weights_dtype, "auto"),
                                 ("--offload", cfg.offload, "text")):
        if value not in (default, "auto"):
            raise InputError(f"{MODES[mode]} with {flag} {value}: not supported together yet")
    if world is None:
        try:
            world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        except ValueError:
            raise InputError("WORLD_SIZE must be an integer (torchrun sets it)") from None
    dit = cfg.preset.dit
    if mode == "heads" and world > 1:  # before anything loads (a checkpoint's own config is checked after)
        check_split(world, getattr(dit, "num_heads", None), getattr(dit, "ffn_dim", None))


def check_gpus(processes: int, device_type: str, gpus: int) -> None:
    """``--nproc-per-node`` on CUDA takes one GPU per process (each its LOCAL_RANK's): refuse more
    ``processes`` than the machine's ``gpus`` (``torch.cuda.device_count()``). A CPU run (gloo) takes any count.

    Raises:
        InputError: more processes than GPUs.
    """
    if device_type == "cuda" and processes > gpus:
        raise InputError(f"--nproc-per-node {processes}: a sharded CUDA run takes one GPU per process and this "
                         f"machine has {gpus}; use --nproc-per-node {gpus} or fewer" if gpus else
                         f"--nproc-per-node {processes}: a sharded CUDA run takes one GPU per process and this "
                         f"machine has none (--device cpu runs the processes on the CPU)")


__all__ = ["MODES", "check", "check_gpus", "check_split"]
