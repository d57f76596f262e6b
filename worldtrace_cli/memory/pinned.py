"""Pinned host memory for the host stores of the writers (Field's evicted frames, the pose bank's
chunks) when the model runs on CUDA.

PyTorch's caching host allocator rounds every pinned allocation up to a power of two
(``c10::llvm::PowerOf2Ceil`` in ``CachingHostAllocator``), so one pinned tensor per evicted latent
frame of full-size MG2 (30 layers x K/V x 880 tokens x 1536 channels in bf16 = 162,201,600 bytes)
takes a 256 MiB block: 1.65 x what it holds, ~200 GB instead of ~125 GB after 256 chunks of the
recompute Field writer. :class:`PinnedArena` carves the tensors out of fewer, larger slabs whose
power-of-two size wastes at most 1/16 (2 GiB slabs of 13 such frames: 1.8 %), and pays the
allocator's page pinning once per slab instead of once per frame.

Page-locking costs ~1 s per 2 GiB slab (``cudaHostAlloc``, ~2 GB/s, measured on an H200: the
recompute Field writer's host store grows ~486 MB per chunk at full size, a slab every ~4.3 chunks,
0.24 s per chunk of a fresh run; PyTorch caches freed pinned blocks, so only a new process pays it).
With ``ahead`` the arena page-locks the NEXT slab on a background thread as soon as it starts one,
so the generating thread finds it ready (it waits only if the background allocation has not ended).
"""

from __future__ import annotations

import math
import threading

import torch

ALIGN = 512                 # bytes: every tensor starts at a multiple (any dtype's alignment, DMA-friendly)
SLAB_LIMIT = 1 << 31        # bytes: the largest slab chosen to cut waste (a single larger tensor gets its own)
MAX_WASTE = 1 / 16          # the first power of two at or under this waste is taken


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


class _Ahead:
    """One slab of ``size`` bytes allocated on a background thread (pinned on ``device``'s context)."""

    def __init__(self, size: int, pin: bool, device: int | None):
        self.size, self.slab, self.error = size, None, None
        self._thread = threading.Thread(target=self._run, args=(pin, device), daemon=True,
                                        name="worldtrace-pin-ahead")
        self._thread.start()

    def _run(self, pin: bool, device: int | None) -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)  # a new thread starts on device 0
            self.slab = torch.empty(self.size, dtype=torch.uint8, pin_memory=pin)
        except BaseException as err:  # re-raised by result() on the generating thread
            self.error = err

    def result(self) -> torch.Tensor:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.slab


class PinnedArena:
    """Host tensors carved out of page-locked slabs (:func:`slab_bytes`), appended to and freed
    together: a slab goes back to PyTorch's pinned cache when no tensor taken from it is referenced
    any more (the writers only append until their reset).

    Args:
        pin: page-lock the slabs (``False`` gives ordinary host memory: the same layout, for tests and
            CPU runs).
        limit: :func:`slab_bytes`'s largest slab, in bytes.
        ahead: allocate the next slab on a background thread as soon as one is started (default:
            ``pin``), so the page-locking (~1 s per 2 GiB) overlaps generation instead of stalling it;
            costs one slab of host memory held ahead of need. A tensor larger than ``limit`` gets its
            own slab and is not allocated ahead.
    Raises (from :meth:`take`): RuntimeError, torch's, when ``pin`` and no CUDA device can pin memory
    (an error on the background thread is raised by the :meth:`take` that needs its slab).
    """

    def __init__(self, pin: bool = True, limit: int = SLAB_LIMIT, ahead: bool | None = None):
        self.pin, self.limit = pin, limit
        self.ahead = pin if ahead is None else ahead
        self._slab: torch.Tensor | None = None
        self._offset = 0
        self._next: _Ahead | None = None
        self.slabs_ready = 0  # slabs found allocated ahead when needed (for tests and benchmarks)

    def _new_slab(self, size: int) -> torch.Tensor:
        ahead, self._next = self._next, None
        if ahead is not None and ahead.size == size:
            slab = ahead.result()
            self.slabs_ready += 1
        else:
            slab = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
        if self.ahead and size <= self.limit:
            device = torch.cuda.current_device() if self.pin and torch.cuda.is_available() else None
            self._next = _Ahead(size, self.pin, device)
        return slab

    def take(self, shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A new, uninitialised host tensor of ``shape`` and ``dtype`` (contiguous; pinned with
        ``pin``) in the current slab, or in a new slab when it does not fit."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if self._slab is None or self._offset + nbytes > self._slab.numel():
            self._slab = self._new_slab(slab_bytes(nbytes, self.limit))
            self._offset = 0
        view = self._slab[self._offset:self._offset + nbytes].view(dtype).view(shape)
        self._offset += _aligned(nbytes)
        return view

    def copy(self, x: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """A host copy of ``x`` (any device) in the arena; ``non_blocking``: asynchronous from CUDA
        into pinned memory (ordered on the current stream)."""
        return self.take(x.shape, x.dtype).copy_(x, non_blocking=non_blocking)


__all__ = ["ALIGN", "MAX_WASTE", "PinnedArena", "SLAB_LIMIT", "slab_bytes"]
