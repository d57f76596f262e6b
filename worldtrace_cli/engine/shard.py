"""The DiT's weights sharded across torchrun's processes with FSDP2 (issue 45 part 4): ``torchrun
--nproc-per-node N -m worldtrace_cli generate --fsdp ...``.

PyTorch's own distributed runtime does the work: ``torch.distributed.fsdp.fully_shard`` on every
block and on the DiT (each process keeps 1/N of every weight; a block's weights are gathered for its
forward and freed after), over a device mesh of all processes (``nccl`` on GPUs, ``gloo`` on a CPU).
Every process runs the same chunk loop on the same inputs (the same seeded noise, so the same
latents); process 0 also decodes and writes the run, the others only generate
(:func:`follow`). Process 0 says before each chunk whether another follows (:func:`lockstep`), so the
others stop when it stops (the last chunk, Ctrl-C, a failure: torchrun ends the others when a process
exits with an error). A block's weights are used only inside its own forward
(:class:`~worldtrace_cli.model.chunk.ContextKV`), which FSDP2 needs as diffusers' offloading does.

Not here: attention heads split across processes (tensor parallel: each process computing its heads'
slice of every cache slot), which would make a chunk faster; FSDP2 splits the memory of the weights only.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch

from ..errors import InputError

log = logging.getLogger("worldtrace")
_STATE: dict = {}  # the active sharding: rank, world, device (set by start)


def start(device: torch.device) -> tuple[int, int, torch.device]:
    """Join torchrun's process group (``nccl`` when the run is on CUDA, one GPU per process by
    LOCAL_RANK; ``gloo`` on a CPU) and make the sharding active for this process's pipelines.
    ``device``: the run's resolved device (``engine.base.resolve_device``); on CUDA each process takes
    the GPU of its LOCAL_RANK. Returns (rank, world size, this process's device). Processes other
    than 0 log warnings only.

    Raises:
        InputError: not under torchrun (WORLD_SIZE unset or 1).
    """
    import torch.distributed as dist

    try:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise InputError("RANK / WORLD_SIZE / LOCAL_RANK must be integers (torchrun sets them)") from None
    if world < 2:
        raise InputError("--fsdp shards the DiT across processes: run under torchrun --nproc-per-node N (N >= 2)")
    if device.type == "cuda":
        device = torch.device("cuda", local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=30))
    _STATE.update(rank=rank, world=world, device=device)
    if rank:
        logging.getLogger("worldtrace").setLevel(logging.WARNING)
    return rank, world, device


def active() -> bool:
    """True in a process that :func:`start` joined to a sharded run."""
    return bool(_STATE)


def rank() -> int:
    """This process's rank in the sharded run (0 without one)."""
    return _STATE.get("rank", 0)


def device() -> torch.device:
    """This process's device in the sharded run."""
    return _STATE["device"]


def shard_dit(dit, device: torch.device) -> int:
    """``fully_shard`` every block of ``dit`` and the DiT itself over a mesh of all processes on
    ``device``'s type: each process keeps 1/N of every weight (FSDP2). Returns the DiT parameters this
    process holds (elements)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (_STATE["world"],))
    for block in dit.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(dit, mesh=mesh)
    return sum(p.to_local().numel() for p in dit.parameters())


def _say(go: bool) -> bool:
    """Process 0 tells the others whether another chunk follows (``go``; the others' value is replaced
    by process 0's); every process returns the answer."""
    import torch.distributed as dist

    flag = torch.tensor([1 if go else 0], device=_STATE["device"])
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def lockstep(step):
    """Process 0's ``rollout.step`` that first tells the others to make the same chunk."""
    def stepped(*args, **kwargs):
        _say(True)
        return step(*args, **kwargs)
    return stepped


def finish(clean: bool = True) -> None:
    """On the way out of a sharded run: process 0 tells the others that no chunk follows; every process
    then waits for the others (``clean``: a process other than 0 that failed does not wait, it exits and
    torchrun ends the rest) and leaves the group. A peer already gone (killed) is logged, not raised:
    the run's own outcome (complete, stopped with its resume state, failed) is what is reported."""
    import torch.distributed as dist

    if _STATE and dist.is_initialized():
        try:
            if _STATE["rank"] == 0:
                _say(False)
            if clean or _STATE["rank"] == 0:
                dist.barrier()  # every process past the last broadcast before the group goes (gloo aborted a
                # process that tore its group down while another's last receive was in flight: 1 run in 7 here)
        except RuntimeError as exc:  # gloo / nccl: the other process is gone
            log.debug(f"--fsdp: leaving the process group without the others ({str(exc).splitlines()[0]})")
        dist.destroy_process_group()
    _STATE.clear()


def follow(rollout) -> int:
    """A process other than 0: make each chunk process 0 makes (the DiT's collectives pair up), until
    it says none follows. Ctrl-C and SIGTERM (torchrun sends them to every process) are left to process
    0, which stops after its current chunk, saves the run and then says so. Returns the chunks made."""
    import signal

    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        made = 0
        while _say(False):
            rollout.step()
            made += 1
        return made
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def check(cfg) -> None:
    """Refuse what a sharded run does not do yet (one line, before anything loads).

    Raises:
        InputError: ``--resume``, ``--compile``, ``--weights-dtype fp8`` or ``--offload blocks`` with ``--fsdp``.
    """
    for flag, value, default in (("--compile", cfg.compile, "none"), ("--weights-dtype", cfg.weights_dtype, "auto"),
                                 ("--offload", cfg.offload, "text")):
        if value not in (default, "auto"):
            raise InputError(f"--fsdp with {flag} {value}: not supported together yet")


__all__ = ["active", "check", "device", "finish", "follow", "lockstep", "rank", "shard_dit", "start"]
