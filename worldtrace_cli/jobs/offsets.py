"""The note a run leaves when it read its cache at query-key temporal offsets past the model's trained
window, with advice that is computed, not guessed: each candidate change of the command line is run
through the writer's own code (its slots and position scheme over the run's chunks, on a one-token
cache), and only a change that keeps every offset within the trained window is suggested.
"""

from __future__ import annotations

import logging
from dataclasses import replace

log = logging.getLogger("worldtrace")

SIMULATED_CHUNKS = 64  # a run's offsets are simulated over at most this many chunks (fixed-size caches settle long before)


def simulated_max_offset(memory, preset, chunks: int) -> float | None:
    """The largest query-key temporal offset (latent frames, from a chunk's last frame) at which a run
    of ``chunks`` chunks with writer ``memory`` (a MemoryConfig) reads its cache: the writer's own
    ``slots()`` and ``positions()`` after committing one-token frames through its own ``commit``
    (at most :data:`SIMULATED_CHUNKS` chunks; poses standing still for the pose writers). None when the
    writer cannot be built with these settings (an invalid suggestion) or reads nothing.
    """
    import torch

    from ..errors import InputError
    from ..memory import CacheGeometry, build_writer
    from ..writer_options import check_memory

    try:
        check_memory(memory, preset.window, preset.default_budget)
        writer = build_writer(memory, preset.default_budget, preset.window)
    except InputError:
        return None
    f = preset.frames_per_chunk
    n = max(1, min(chunks, SIMULATED_CHUNKS))
    writer.reset(CacheGeometry(1, 1, 64, 1, f, preset.window - 1, torch.device("cpu"), torch.float32))
    writer.set_poses(torch.eye(4, dtype=torch.float64).expand(n * f, 4, 4).clone())
    gen = torch.Generator().manual_seed(0)
    worst = None
    for c in range(n):
        writer.begin_chunk(c * f)
        if writer.slots():
            worst = max(worst or -1e9, float((f - 1 - writer.positions()).max()))
        kv = [(torch.randn(1, f, 1, 64, generator=gen), torch.randn(1, f, 1, 64, generator=gen))]
        writer.commit(kv, list(range(c * f, c * f + f)))
        writer.events()
    return worst


def offset_advice(memory, preset, chunks: int) -> str | None:
    """A change of the command line that keeps every offset of the run within the trained window
    (``preset.window - 1`` latent frames), checked by :func:`simulated_max_offset`, as advice text; None
    when no such change exists. Tried in order: the largest ``--budget`` below the run's own that fits
    (fewer memory slots, the writer's own positions kept), then another ``--positions`` scheme with the
    same slots (``slot_rank``, ``rank``, ``block_relative``)."""
    trained = preset.window - 1
    budget = memory.budget if memory.budget is not None else _resolved_budget(memory, preset)
    if budget is not None:
        for b in range(int(budget) - 1, -1, -1):
            got = simulated_max_offset(replace(memory, budget=b, summary_slots=None), preset, chunks)
            if got is not None and got <= trained:
                return f"--budget {b} keeps every offset within the trained window, with fewer memory slots"
    for scheme in ("slot_rank", "rank", "block_relative"):
        if scheme == memory.positions:
            continue
        got = simulated_max_offset(replace(memory, positions=scheme), preset, chunks)
        if got is not None and got <= trained:
            return (f"--positions {scheme} reads the same slots within the trained window (positions change "
                    f"what the model sees: docs/memory.md, 'Position schemes')")
    return None


def _resolved_budget(memory, preset) -> int | None:
    """The writer's own past-slot count for ``preset`` (None for a writer without one: full, yarn)."""
    from ..errors import InputError
    from ..writer_options import check_memory

    try:
        sizes = check_memory(memory, preset.window, preset.default_budget)
    except InputError:
        return None
    if sizes is None:
        return None
    return int(sum(sizes)) if isinstance(sizes, tuple) else int(sizes)


def offset_warning(memory, max_offset, preset, chunks: int, trained: int) -> list[str]:
    """``[note]`` when the run read its cache at query-key temporal offsets (latent frames) past the
    model's trained ``trained`` (the rollout's geometry: ``preset.window - 1``; WorldTrace writers'
    default 6 past slots reach 8 on MG2, trained to 5), with the computed advice (:func:`offset_advice`)
    or none; logged once per command (:func:`~worldtrace_cli.jobs.inputs.warn_once`); ``[]`` otherwise.
    ``memory``: the run's MemoryConfig; ``chunks``: its length."""
    from .inputs import warn_once

    if max_offset is None or max_offset <= trained:
        return []
    advice = offset_advice(memory, preset, chunks)
    text = (f"the cache was read at query-key offsets up to {max_offset:g} latent frames; the model was trained "
            f"to {trained}: expected with this writer's slots at its positions (README: 'Memory writers')"
            + (f"; {advice}" if advice else "; no --budget or --positions keeps this writer within it"))
    warn_once(text, text)  # a compare's or sweep's writers share it: said once per command
    return [text]


__all__ = ["SIMULATED_CHUNKS", "offset_advice", "offset_warning", "simulated_max_offset"]
