"""The writers' pinned host store (memory/pinned.py): slabs whose power-of-two size wastes little,
tensors carved out of them without overlap. Run with pin=False here (page-locking needs CUDA; the GPU
tests run the writers' pinned path)."""

import pytest
import torch

from worldtrace_cli.memory.pinned import ALIGN, MAX_WASTE, PinnedArena, slab_bytes

MG2_FRAME = 30 * 2 * 880 * 1536 * 2  # one evicted latent frame of full-size MG2 in bf16: K and V, 30 layers


def _fits(p, n):
    return 1 + (p - n) // (-(-n // ALIGN) * ALIGN)


def test_a_full_size_mg2_frame_gets_a_slab_of_thirteen():
    """PyTorch would pin 256 MiB for each 162 MB frame (1.65 x); a 2 GiB slab holds 13 (1.8 % unused)."""
    p = slab_bytes(MG2_FRAME)
    assert p == 1 << 31 and _fits(p, MG2_FRAME) == 13
    assert (p - 13 * MG2_FRAME) / p <= MAX_WASTE


@pytest.mark.parametrize("n", [1, 100, 4096, 10_000, 1 << 20, 3 * (1 << 20) + 7, 200_000_000])
def test_slabs_are_the_first_power_of_two_within_a_sixteenth_or_the_least_wasteful(n):
    def waste(q):
        return (q - _fits(q, n) * n) / q

    candidates = [1 << k for k in range(max(n - 1, 1).bit_length() if n > 1 else 0, 32)]
    p = slab_bytes(n)
    assert p in candidates
    good = [q for q in candidates if waste(q) <= MAX_WASTE]
    assert p == (good[0] if good else min(candidates, key=lambda q: (waste(q), q)))
    assert p <= max(64 * n, 1 << 16)  # small tensors do not get huge slabs


def test_a_tensor_over_the_limit_gets_its_own_power_of_two_and_bad_sizes_are_refused():
    assert slab_bytes(3 << 30) == 4 << 30
    with pytest.raises(ValueError):
        slab_bytes(0)


def test_tensors_do_not_overlap_are_aligned_and_slabs_are_counted():
    arena = PinnedArena(pin=False)
    shape = (3, 4, 128)  # 3,072 bytes in bfloat16: 5 to a 16 KiB slab
    taken = [arena.take(shape, torch.bfloat16) for _ in range(40)]
    for i, t in enumerate(taken):
        assert t.shape == shape and t.dtype == torch.bfloat16 and t.is_contiguous()
        assert t.storage_offset() * t.element_size() % ALIGN == 0  # slab offsets (slabs are page-aligned pinned)
        t.fill_(i)
    assert all((t == i).all() for i, t in enumerate(taken))  # no tensor wrote into another
    size = slab_bytes(3072)
    assert (size, _fits(size, 3072)) == (16384, 5)
    slabs = 8
    assert arena.reserved == slabs * size
    assert len({t.untyped_storage().data_ptr() for t in taken}) == slabs


def test_copy_keeps_the_values_and_mixes_dtypes_in_one_arena():
    arena = PinnedArena(pin=False)
    a, b = torch.randn(4, 6), torch.arange(10, dtype=torch.int64)
    ca, cb = arena.copy(a), arena.copy(b)
    assert torch.equal(ca, a) and torch.equal(cb, b) and ca.data_ptr() != a.data_ptr()
    assert arena.copy(torch.empty(0, 3)).shape == (0, 3)
