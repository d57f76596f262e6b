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
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in taken}
    assert len(storages) == slabs and sum(storages.values()) == slabs * size


def test_copy_keeps_the_values_and_mixes_dtypes_in_one_arena():
    arena = PinnedArena(pin=False)
    a, b = torch.randn(4, 6), torch.arange(10, dtype=torch.int64)
    ca, cb = arena.copy(a), arena.copy(b)
    assert torch.equal(ca, a) and torch.equal(cb, b) and ca.data_ptr() != a.data_ptr()
    assert arena.copy(torch.empty(0, 3)).shape == (0, 3)


def test_views_of_one_storage_are_saved_without_copies_and_overlapping_ones_are_copied(tmp_path):
    """A resume state of a slab-backed host store: non-overlapping views are packed as they are (no
    clone: a clone per frame would double a store the size of host RAM at every save); an
    overlapping view is cloned (safetensors refuses overlap); all come back bit-identical."""
    from worldtrace_cli.runs.state import load_state, pack, save_state, unpack

    arena = PinnedArena(pin=False)
    frames = [arena.copy(torch.randn(3, 4, 128).to(torch.bfloat16)) for _ in range(7)]
    tensors = {}
    pack(frames, tensors)
    stored = [v for k, v in tensors.items() if isinstance(k, str)]
    assert len({t.untyped_storage().data_ptr() for t in stored}) == 2  # 7 frames in two 16 KiB slabs
    overlap = frames[0].view(-1)[100:300]
    tensors = {}
    pack([frames[0], overlap], tensors)
    a, b = (v for k, v in tensors.items() if isinstance(k, str))
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()

    save_state(tmp_path / "s", {}, {"store": frames + [overlap]})
    _, parts, loaded = load_state(tmp_path / "s")
    back = unpack(parts["store"], loaded)
    assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(back, frames + [overlap]))


def test_field_host_store_restored_into_slabs_saves_and_resumes_again_bit_identically(tmp_path):
    """Field without --spill-dir: save, restore (the store goes into arena slabs), save that writer
    again and restore it: every later read equals the uninterrupted writer's."""
    from worldtrace_cli.memory import CacheGeometry, MemoryConfig, build_writer
    from worldtrace_cli.runs.state import load_state, save_state, unpack

    geometry = CacheGeometry(num_layers=2, heads=2, head_dim=16, tokens_per_frame=4, frames_per_chunk=3,
                             trained_offset=5)
    gen = torch.Generator().manual_seed(0)

    def kv():
        return [(torch.randn(1, 3 * 4, 2, 16, generator=gen), torch.randn(1, 3 * 4, 2, 16, generator=gen))
                for _ in range(2)]

    def new():
        w = build_writer(MemoryConfig.of(cache="field"), 3)
        w.reset(geometry)
        return w

    chunks = [kv() for _ in range(14)]
    ref, w = new(), new()
    for c in range(8):
        for x in (ref, w):
            x.begin_chunk(3 * c)
            x.commit(chunks[c], [3 * c, 3 * c + 1, 3 * c + 2])
    for hop in ("first", "second"):
        save_state(tmp_path / hop, {}, {"writer": w.state_dict()})
        _, parts, tensors = load_state(tmp_path / hop)
        w = new()
        w.load_state_dict(unpack(parts["writer"], tensors))
    for c in range(8, 14):
        for x in (ref, w):
            x.begin_chunk(3 * c)
        for layer in range(2):
            assert all(torch.equal(a, b) for a, b in zip(ref.read(layer), w.read(layer)))
        for x in (ref, w):
            x.commit(chunks[c], [3 * c, 3 * c + 1, 3 * c + 2])


def test_a_reserved_arena_carves_without_allocating():
    """issue 45: reserve() makes the slabs of a run's host store at reset; take() then only carves them
    (on a CPU machine unpinned, the same layout); past the reservation it allocates as before."""
    nbytes = 162_201_600  # full-size MG2: one latent frame of K+V over 30 layers in bf16
    arena = PinnedArena(pin=False)
    per_slab = 1 + (slab_bytes(nbytes) - nbytes) // (-(-nbytes // ALIGN) * ALIGN)
    assert per_slab >= 2
    reserved = arena.reserve(nbytes, 2 * per_slab)
    assert arena.slabs_made == 2 and reserved == 2 * slab_bytes(nbytes)
    taken = [arena.take((nbytes // 2,), torch.bfloat16) for _ in range(2 * per_slab)]
    assert arena.slabs_made == 2 and len({t.data_ptr() for t in taken}) == len(taken)
    assert arena.reserve(nbytes, 0) == 0 and arena.slabs_made == 2
    arena.take((nbytes // 2,), torch.bfloat16)
    assert arena.slabs_made == 3


def test_what_may_be_page_locked_ahead_is_counted_in_whole_slabs(monkeypatch):
    """issue 45 review: a 1.28 GB frame takes a 2 GiB slab, so half of 10 GiB free holds 2 of them,
    not 3 (counting the tensors' own bytes let the reservation reach ~80 % of free memory); the
    processes of a torchrun host share the half."""
    from worldtrace_cli.memory.pinned import affordable

    frame, free = 1_280_000_000, 10 * 2**30
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert slab_bytes(frame) == 2**31
    assert affordable(100, frame, free=free) == 2
    assert affordable(1, frame, free=free) == 1
    small = 162_201_600  # MG2's frame: 13 to a 2 GiB slab
    assert affordable(1000, small, free=free) == 2 * 13
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert affordable(1000, small, free=free) == 13
