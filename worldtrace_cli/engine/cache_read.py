"""What a chunk reads from its cache writer, taken once before the chunk's commit (:func:`begin_chunk`),
and the noise draws of a chunk (:func:`noise_draws`): shared by every backbone's rollout
(:mod:`worldtrace_cli.engine.rollout`, which re-exports them), training and its evaluation."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..memory import CacheWriter
from ..model.dit import LayerPast
from ..model.sampler import chunk_generator


@dataclass
class CacheRead:
    """What a chunk reads from its writer, taken once before the chunk's commit: ``slots``,
    ``positions`` [S] float64, ``tokens`` int64 [L, S] (:meth:`CacheWriter.slot_tokens`), ``kv_bytes``
    (bytes read on the compute device), ``past`` (per layer :class:`LayerPast`) and
    ``freq_scale`` (YaRN's temporal frequency multipliers or None)."""

    slots: list
    positions: torch.Tensor
    tokens: torch.Tensor
    kv_bytes: int
    past: "WriterPast | list[LayerPast]"
    freq_scale: torch.Tensor | None


class WriterPast:
    """Every layer's :class:`~worldtrace_cli.model.chunk.LayerPast` of the chunk a writer began, read
    from the writer when the DiT asks for that layer (``past[layer]``) and not held after: the writers
    that concatenate their slots per read (sliding, sink, full...) would otherwise hold a second copy
    of the whole cache for the chunk (LingBot-World's default cache: 17.3 GB; docs/gpu-memory.md). Valid until
    the writer's next commit. ``tokens(layer)``: past tokens of a layer without reading it.

    Args:
        writer: the :class:`~worldtrace_cli.memory.CacheWriter` after ``begin_chunk``.
        num_layers: self-attention layers of the DiT.
        slots: the writer's slot count this chunk.
    """

    def __init__(self, writer: CacheWriter, num_layers: int, slots: int):
        self.writer, self.num_layers, self.slots = writer, num_layers, slots
        self.counts = [writer.token_counts(layer) for layer in range(num_layers)]  # int64 [S] on the CPU, or None

    def __len__(self) -> int:
        return self.num_layers

    def __getitem__(self, layer: int) -> LayerPast:
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} of {self.num_layers}")
        return LayerPast(*self.writer.read(layer), self.counts[layer])

    def tokens(self, layer: int) -> int:
        """Past tokens of ``layer`` (the sum of its slots' token counts)."""
        c = self.counts[layer]
        return self.slots * self.writer.geometry.tokens_per_frame if c is None else int(c.sum())


def begin_chunk(writer: CacheWriter, frame_start: int, num_layers: int) -> CacheRead:
    """``writer.begin_chunk(frame_start)`` and everything the chunk reads from it (docs/architecture.md §1), for
    every backbone: each writer query once per chunk (token counts once per layer); the layers' K/V
    are read when the DiT reaches them (:class:`WriterPast`)."""
    writer.begin_chunk(frame_start)
    slots, positions = writer.slots(), writer.positions()
    kv_bytes = writer.kv_bytes()
    past = WriterPast(writer, num_layers, len(slots))
    t = writer.geometry.tokens_per_frame
    tokens = torch.stack([torch.full((len(slots),), t, dtype=torch.int64) if c is None else c.to(torch.int64)
                          for c in past.counts]) if num_layers else torch.zeros(0, len(slots), dtype=torch.int64)
    return CacheRead(slots, positions, tokens, kv_bytes, past, writer.temporal_frequency_scale())


def noise_draws(seed: int, chunk: int, shape: tuple[int, ...], noise=None):
    """``draw(i)``: chunk ``chunk``'s i-th Gaussian draw of ``shape`` (0 = initial noise, s = the
    re-noising before step s), float32 on the CPU from ``chunk_generator(seed, chunk)`` in order, or
    from ``noise(chunk, i, shape)`` when given (fixture replays). Shared by both rollouts, so a
    resumed run draws the same numbers."""
    if noise is not None:
        return lambda i: noise(chunk, i, shape)
    gen = chunk_generator(seed, chunk)
    return lambda i: torch.randn(shape, generator=gen)


def read_past(writer: CacheWriter, num_layers: int) -> list[LayerPast]:
    """Every layer's :class:`~worldtrace_cli.model.chunk.LayerPast` of the chunk ``writer`` began
    (canonical K, V, per-slot positions and, for compressed slots, per-slot token counts): what the
    DiT reads this chunk. Used by both rollouts, training and its evaluation (docs/architecture.md §1)."""
    return [LayerPast(*writer.read(layer), writer.token_counts(layer)) for layer in range(num_layers)]
