"""Pinned host memory for the host stores of the writers (Field's evicted frames, the pose bank's
chunks) when the model runs on CUDA.

PyTorch's caching host allocator rounds every pinned allocation up to a power of two
(``c10::llvm::PowerOf2Ceil`` in ``CachingHostAllocator``), so one pinned tensor per evicted latent
frame of full-size MG2 (30 layers x K/V x 880 tokens x 1536 channels in bf16 = 162,201,600 bytes)
takes a 256 MiB block: 1.65 x what it holds, ~200 GB instead of ~125 GB after 256 chunks of the
recompute Field writer. :class:`PinnedArena` carves the tensors out of fewer, larger slabs whose
power-of-two size wastes at most 1/16 (2 GiB slabs of 13 such frames: 1.8 %), and pays the
allocator's page pinning once per slab instead of once per frame.
"""

from __future__ import annotations

import math

import torch

ALIGN = 512                 # bytes: every tensor starts at a multiple (any dtype's alignment, DMA-friendly)
SLAB_LIMIT = 1 << 31        # bytes: the largest slab chosen to cut waste (a single larger tensor gets its own)
MAX_WASTE = 1 / 16          # the first power of two at or under this waste is taken
RESERVE_FRACTION = 0.5      # of the host memory free at reset that a run's page-locked stores may take ahead


def affordable(count: int, nbytes: int, limit: int = SLAB_LIMIT, free: int | None = None) -> int:
    """How many of ``count`` tensors of ``nbytes`` bytes a writer may page-lock ahead: as many as fit
    in the whole slabs (:func:`slab_bytes`, what :meth:`PinnedArena.reserve` allocates) that
    :data:`RESERVE_FRACTION` of the host memory free now takes (``free`` bytes; default Linux's
    ``SC_AVPHYS_PAGES``), shared among the processes of a torchrun host (``LOCAL_WORLD_SIZE``). The
    rest, if any, is page-locked as it comes."""
    import os

    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    share = free * RESERVE_FRACTION / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    slab = slab_bytes(max(1, nbytes), limit)
    per_slab = 1 + (slab - nbytes) // _aligned(max(1, nbytes))
    return max(0, min(count, int(share // slab) * per_slab))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def slab_bytes(nbytes: int, limit: int = SLAB_LIMIT) -> int:
    """Size in bytes of a slab for tensors of ``nbytes`` bytes each: the smallest power of two P >=
    ``nbytes`` whose unused part after ``P // aligned(nbytes)`` tensors is at most :data:`MAX_WASTE`
    of P, among P <= max(``limit``, the power of two at or above ``nbytes``); if none is, the one that
    wastes least (the smaller on a tie).

    Raises:
        ValueError: ``nbytes`` < 1.
    """
    if nbytes < 1:
        raise ValueError(f"slab for tensors of {nbytes} bytes")
    step = _aligned(nbytes)
    p = 1 << (nbytes - 1).bit_length()
    top = max(limit, p)
    best = (2.0, p)
    while p <= top:
        count = 1 + (p - nbytes) // step  # the last tensor needs nbytes, not its aligned size
        waste = (p - count * nbytes) / p
        if waste <= MAX_WASTE:
            return p
        if waste < best[0]:
            best = (waste, p)
        p *= 2
    return best[1]


class PinnedArena:
    """Host tensors carved out of page-locked slabs (:func:`slab_bytes`), appended to and freed
    together: a slab goes back to PyTorch's pinned cache when no tensor taken from it is referenced
    any more (the writers only append until their reset).

    Args:
        pin: page-lock the slabs (``False`` gives ordinary host memory: the same layout, for tests and
            CPU runs).
        limit: :func:`slab_bytes`'s largest slab, in bytes.
    Raises (from :meth:`take`): RuntimeError, torch's, when ``pin`` and no CUDA device can pin memory.
    """

    def __init__(self, pin: bool = True, limit: int = SLAB_LIMIT):
        self.pin, self.limit = pin, limit
        self._slab: torch.Tensor | None = None
        self._offset = 0
        self._ready: list[torch.Tensor] = []  # slabs made ahead by reserve(), taken in order
        self.slabs_made = 0  # slabs allocated (and page-locked with ``pin``) so far, reserved ones included

    def _new_slab(self, nbytes: int) -> torch.Tensor:
        self.slabs_made += 1
        return torch.empty(slab_bytes(nbytes, self.limit), dtype=torch.uint8, pin_memory=self.pin)

    def reserve(self, nbytes: int, count: int) -> int:
        """Allocate (and with ``pin`` page-lock) now the slabs that ``count`` more tensors of ``nbytes``
        bytes each will take, so that :meth:`take` later only carves them (docs/gpu-memory.md: a writer's host
        store sized at reset from the run's length instead of page-locked on the generating thread,
        which cost field 2.09x sliding's time per chunk in a fresh process on an H200). Returns the
        bytes reserved.

        Raises:
            ValueError: ``nbytes`` < 1 or ``count`` < 0.
        """
        if nbytes < 1 or count < 0:
            raise ValueError(f"reserve {count} tensors of {nbytes} bytes")
        step = _aligned(nbytes)
        room = 0 if self._slab is None else max(0, (self._slab.numel() - self._offset + step - nbytes) // step)
        per_slab = 1 + (slab_bytes(nbytes, self.limit) - nbytes) // step
        made = []
        for _ in range(math.ceil(max(0, count - room - len(self._ready) * per_slab) / per_slab)):
            made.append(self._new_slab(nbytes))
        self._ready.extend(made)
        return sum(s.numel() for s in made)

    def take(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A new, uninitialised host tensor of ``shape`` and ``dtype`` (contiguous; pinned with
        ``pin``) in the current slab, or in a new slab when it does not fit."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if self._slab is None or self._offset + nbytes > self._slab.numel():
            fits = self._ready and self._ready[0].numel() >= nbytes
            self._slab = self._ready.pop(0) if fits else self._new_slab(nbytes)
            self._offset = 0
        view = self._slab[self._offset:self._offset + nbytes].view(dtype).view(shape)
        self._offset += _aligned(nbytes)
        return view

    def copy(self, x: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """A host copy of ``x`` (any device) in the arena; ``non_blocking``: asynchronous from CUDA
        into pinned memory (ordered on the current stream)."""
        return self.take(x.shape, x.dtype).copy_(x, non_blocking=non_blocking)


__all__ = ["ALIGN", "MAX_WASTE", "PinnedArena", "RESERVE_FRACTION", "SLAB_LIMIT", "affordable", "slab_bytes"]
