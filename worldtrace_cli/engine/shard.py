"""The DiT across torchrun's processes (docs/gpu-memory.md): ``torchrun --nproc-per-node N -m worldtrace_cli
generate --fsdp ...`` or ``... --split-heads ...``.

PyTorch's own distributed runtime does the work, over a device mesh of all processes (``nccl`` on
GPUs, ``gloo`` on a CPU):

- ``--fsdp`` (:func:`shard_dit`): ``torch.distributed.fsdp.fully_shard`` on every block and on the DiT.
  Each process keeps 1/N of every weight; a block's weights are gathered for its forward and freed
  after. Every process computes the whole chunk: memory is split, time is not.
- ``--split-heads`` (:func:`split_heads`, tensor parallel): ``torch.distributed.tensor.parallel``'s
  ``ColwiseParallel`` on the q/k/v projections and the FFN's first Linear and ``RowwiseParallel`` on
  the output projections and the FFN's second (Megatron's split). Each process computes its H/N heads
  of the self- and cross-attention and 1/N of the FFN, and holds its heads' slice of every cache slot
  (the writer's geometry has H/N heads); per block and DiT call, three all-reduces join the row-wise
  outputs (self-attention ``o``, cross-attention ``o``, ``ffn.2``) and three more join the sums of
  squares of Wan's q/k RMSNorms, which normalise over all heads
  (:class:`~worldtrace_cli.model.dit.RMSNorm`). Writers whose choices read keys across heads
  (landmark's scene-entry test, the compression of WorldKV and retrieval) all-reduce their sums over
  the same group (:func:`~worldtrace_cli.memory.slots.head_sum`), so every process keeps the same
  slots (all-reduced values are the same on every process). Against a single process the frames
  match within float rounding (sums in another order), not bit for bit, and a writer's choice that
  sits exactly at its threshold (a landmark distance at tau, a tie among WorldKV's tokens) could
  fall the other way. What stays whole on every process: the embeddings, the head, the modulation,
  MG2's action modules and LingBot-World's camera layers (14 % of MG2's weights, 24 % of
  LingBot-World's: with N = 4 a process holds 35 % / 43 %). Weights are sliced where every process
  already holds them (no scatter from process 0: ``src_data_rank=None``), so the split is not a
  collective, and process 0 may fail before it (an occupied output folder) without the others
  hanging in one. No resume state is saved: each process holds only its heads' share of the cache.

Every process runs the same chunk loop on the same inputs (the same seeded noise, so the same
latents); process 0 also decodes and writes the run, the others only generate
(:func:`follow`). Process 0 says before each chunk whether another follows (:func:`announcer`, the chunk loop's gate), so the
others stop when it stops (the last chunk, Ctrl-C, a failure: torchrun ends the others when a process
exits with an error). A block's weights are used only inside its own forward
(:class:`~worldtrace_cli.model.chunk.ContextKV`), which FSDP2 needs as diffusers' offloading does.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch

from ..errors import InputError
from .shard_check import MODES, check_split  # torch-free: the CLI refuses before torch loads (engine/shard_check.py)

log = logging.getLogger("worldtrace")
_STATE: dict = {}  # the active sharding: rank, world, device, mode (set by start)
_JOINED = False  # this process joined a process group (start), even after finish() left it


def start(device: torch.device, mode: str = "fsdp") -> tuple[int, int, torch.device]:
    """Join torchrun's process group (``nccl`` when the run is on CUDA, one GPU per process by
    LOCAL_RANK; ``gloo`` on a CPU) and make the sharding active for this process's pipelines.
    ``device``: the run's resolved device (``engine.base.resolve_device``); on CUDA each process takes
    the GPU of its LOCAL_RANK. ``mode``: ``fsdp`` or ``heads`` (:data:`MODES`). Returns (rank, world
    size, this process's device). Processes other than 0 log warnings only.

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
        raise InputError(f"{MODES[mode]} splits the DiT across processes: "
                         f"run under torchrun --nproc-per-node N (N >= 2)")
    if device.type == "cuda":
        device = torch.device("cuda", local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    global _JOINED
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(minutes=30))
    _JOINED = True
    _STATE.update(rank=rank, world=world, device=device, mode=mode)
    if rank:
        logging.getLogger("worldtrace").setLevel(logging.WARNING)
    return rank, world, device


def active() -> bool:
    """True in a process that :func:`start` joined to a sharded run."""
    return bool(_STATE)


def joined() -> bool:
    """True in a process that joined torch.distributed's process group (until its end): such a process
    ends with ``os._exit`` after its output is flushed, since gloo's threads can abort Python's own teardown
    at interpreter exit (``terminate called without an active exception``, exit 134; docs/gpu-memory.md)."""
    return _JOINED


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


def split_heads(dit, device: torch.device) -> int:
    """Tensor parallel over a mesh of all N processes on ``device``'s type (see the module docstring):
    in every block the self- and cross-attention's q/k/v and ``ffn.0`` column-wise, their ``o`` and
    ``ffn.2`` row-wise (``parallelize_module``), the q/k RMSNorms' gains sliced to this process's heads
    and joined over the mesh's group; ``heads`` of both attentions becomes H/N. The rest of the DiT moves
    to ``device`` whole. Returns the DiT parameters this process holds (elements).

    Raises:
        InputError: the DiT's heads or FFN width not divisible by N.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world, cfg = _STATE["world"], dit.cfg
    check_split(world, cfg.num_heads, cfg.ffn_dim)
    mesh = init_device_mesh(device.type, (world,))
    group, here = mesh.get_group(), _STATE["rank"]
    _STATE["group"] = group
    dit.head_split = (world, group)  # the split travels with the model: a rollout's writers hold H / world heads
    plan = {"ffn.0": ColwiseParallel(), "ffn.2": RowwiseParallel()}
    for attn in ("self_attn", "cross_attn"):
        plan.update({f"{attn}.{p}": ColwiseParallel() for p in "qkv"}, **{f"{attn}.o": RowwiseParallel()})
    for block in dit.blocks:
        # every process holds the full weights: each slices its own, nothing is scattered (not a collective)
        parallelize_module(block, mesh, plan, src_data_rank=None)
        for attn in (block.self_attn, block.cross_attn):
            attn.heads = cfg.num_heads // world
            for norm in (attn.norm_q, attn.norm_k):
                width = norm.full_dim // world
                norm.weight = torch.nn.Parameter(norm.weight.detach()[here * width:(here + 1) * width].clone(),
                                                 requires_grad=False)
                norm.group = group
    dit.to(device)
    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in dit.parameters())


def head_split() -> tuple[int, object]:
    """(processes the heads are split over, their process group) under ``--split-heads``; (1, None)
    otherwise. The writers' geometry holds H / the first of them."""
    if _STATE.get("mode") != "heads":
        return 1, None
    return _STATE["world"], _STATE["group"]


def place_dit(dit, device: torch.device) -> str:
    """Split the loaded DiT over the processes by the active mode (:func:`shard_dit` or
    :func:`split_heads`); returns the log line that says what this process holds."""
    if _STATE["mode"] == "heads":
        held = split_heads(dit, device)
        return f"--split-heads: this process holds {held / 1e6:.1f} M of the DiT's parameters " \
               f"(its {dit.cfg.num_heads // _STATE['world']} of {dit.cfg.num_heads} heads in every block)"
    held = shard_dit(dit, device)
    return f"--fsdp: this process holds {held / 1e6:.1f} M of the DiT's parameters (FSDP2)"


def _say(go: bool, device: torch.device | None = None) -> bool:
    """Process 0 tells the others whether another chunk follows (``go``; the others' value is replaced
    by process 0's); every process returns the answer. ``device``: the process's (default: the run's)."""
    import torch.distributed as dist

    flag = torch.tensor([1 if go else 0], device=_STATE["device"] if device is None else device)
    dist.broadcast(flag, src=0)
    return bool(flag.item())


def announcer():
    """Process 0's gate of the chunk loop (:class:`~worldtrace_cli.engine.loop.ChunkLoop`): before each chunk
    it tells the others to make the same one. The process's device travels with it (no module state is
    read per chunk)."""
    import functools

    return functools.partial(_say, True, _STATE["device"])


def end_run() -> None:
    """Process 0: tell the others that no chunk of this run follows (their :func:`follow` returns); the
    group stays joined, so a process may go on to another run over the same processes (:func:`finish`
    says it after the last)."""
    _say(False)


def finish(clean: bool = True) -> None:
    """On the way out of a sharded run: process 0 tells the others that no chunk follows; every process
    then waits for the others (``clean``: a process other than 0 that failed does not wait, it exits and
    torchrun ends the rest) and leaves the group. A peer already gone (killed) is logged, not raised:
    the run's own outcome (complete, stopped with its resume state, failed) is what is reported."""
    import torch.distributed as dist

    if _STATE and dist.is_initialized():
        try:
            if _STATE["rank"] == 0:
                end_run()
            if clean or _STATE["rank"] == 0:
                # every process past the last broadcast before the group goes (gloo aborted a process that tore
                # its group down while another's last receive was in flight: 1 run in 7 here), then past that
                # barrier's own messages too (--split-heads under load: 1 run in 6 aborted after one barrier)
                dist.barrier()
                dist.barrier()
        except RuntimeError as exc:  # gloo / nccl: the other process is gone
            log.debug(f"{MODES[_STATE['mode']]}: leaving the process group without the others "
                      f"({str(exc).splitlines()[0]})")
        dist.destroy_process_group()
    _STATE.clear()


def follow(rollout, feed=None) -> int:
    """A process other than 0: make each chunk process 0 makes (the DiT's collectives pair up), fed by
    ``feed`` (the run's :class:`~worldtrace_cli.engine.feed.ConditioningFeed`; None: the rollout feeds
    itself), until it says none follows. Ctrl-C and SIGTERM (torchrun sends them to every process) are
    left to process 0, which stops after its current chunk, saves the run and then says so. Returns the
    chunks made."""
    import signal

    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    device = _STATE["device"]
    try:
        made = 0
        while _say(False, device):
            rollout.step(None if feed is None else feed.request(rollout.chunk))
            made += 1
        return made
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


__all__ = ["MODES", "active", "announcer", "check_split", "device", "end_run", "finish", "follow",
           "head_split", "joined", "place_dit", "rank", "shard_dit", "split_heads", "start"]
