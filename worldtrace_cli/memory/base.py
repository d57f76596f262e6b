"""The cache contract (design.md §3): what a KV-cache writer keeps and where each slot is read.

A writer holds, for every self-attention layer, up to ``budget`` past *slots*, each one latent
frame of T tokens: canonical keys (spatial RoPE applied, temporal RoPE not) and values. Writers
decide **content** (which frames, averaged or verbatim); position schemes
(:mod:`worldtrace_cli.memory.positions`) decide **where** each slot is read.

Per chunk the rollout calls ``begin_chunk(frame_start)``, then ``read(layer)`` for every layer
(the DiT rotates each slot once and reuses it for all denoising steps and the context pass), then
after the context pass ``commit(layers_kv, frame_ids)`` once with every layer's canonical K/V of
the chunk. Positions are offsets in latent frames from the first frame of the current chunk, so
any horizon works.

Adding a writer: one file with a :class:`CacheWriter` subclass decorated with :func:`register`,
imported in ``memory/__init__.py``; the contract tests pick it up from :data:`WRITERS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch

WRITERS: dict[str, type["CacheWriter"]] = {}


def register(cls: type["CacheWriter"]) -> type["CacheWriter"]:
    """Class decorator adding a writer to :data:`WRITERS` under its ``name``."""
    WRITERS[cls.name] = cls
    return cls


@dataclass(frozen=True)
class MemoryConfig:
    """User-facing memory settings (``--cache``, ``--positions``, ``--budget``, slot counts).

    ``None`` means "the writer's default" (see :meth:`CacheWriter.resolve`).
    """

    cache: str = "sliding"
    positions: str | None = None
    budget: int | None = None
    summary_slots: int | None = None
    recent_slots: int | None = None
    landmark_threshold: float = 0.1   # tau: cosine distance of consecutive frame descriptors
    sink_frames: int = 1              # sink: first k latent frames kept
    max_cache_gb: float = 16.0        # full / yarn: refuse before the cache exceeds this
    spill_dir: str | None = None      # field: keep evicted frames on disk here instead of host RAM

    @property
    def writer_name(self) -> str:
        """``mixed:2`` -> ``mixed``."""
        return self.cache.split(":", 1)[0]

    @property
    def writer_arg(self) -> str | None:
        """``mixed:2`` -> ``"2"``; None without a ``:``."""
        return self.cache.split(":", 1)[1] if ":" in self.cache else None


@dataclass(frozen=True)
class CacheGeometry:
    """Shapes of what a writer stores: per layer, slots of ``tokens_per_frame`` tokens x heads x head_dim."""

    num_layers: int
    heads: int
    head_dim: int
    tokens_per_frame: int
    frames_per_chunk: int = 3
    trained_offset: int = 5  # largest temporal offset seen in training: local_attn_size - 1
    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class Slot:
    """One past slot as the model reads it this chunk.

    Attributes:
        kind: ``recent`` (verbatim recent frame), ``field`` (canonical mean of a group),
            ``landmark``, ``sink``, ``ema`` or ``past`` (verbatim frame of a baseline writer).
        frames: source latent-frame ids (absolute indices), oldest first.
        time: the slot's own timestamp in latent frames when it is not the mean of ``frames``
            (e.g. an EMA's weighted time); None otherwise.
    """

    kind: str
    frames: tuple[int, ...]
    time: float | None = None

    @property
    def centroid(self) -> float:
        """The slot's timestamp: ``time`` if set, else the mean source latent-frame index."""
        if self.time is not None:
            return self.time
        return sum(self.frames) / len(self.frames)

    @property
    def is_recent(self) -> bool:
        """Verbatim frames of the recent window (``recent``, and ``past`` of the sliding baseline)."""
        return self.kind in ("recent", "past")


class CacheWriter:
    """Base class of KV-cache writers. Subclasses set ``name``/``default_positions`` and implement
    :meth:`slots`, :meth:`_read_kv` and :meth:`commit`; state is created in :meth:`reset`."""

    name: ClassVar[str] = ""
    default_positions: ClassVar[str] = "actual"

    def __init__(self, config: MemoryConfig, default_budget: int):
        self.config = config
        self.budget = config.budget if config.budget is not None else default_budget
        self.positions_scheme = config.positions or self.default_positions
        self.frame_start = 0
        self.geometry: CacheGeometry | None = None

    def reset(self, geometry: CacheGeometry) -> None:
        """Empty the cache for a new rollout with the given geometry."""
        self.geometry = geometry
        self.frame_start = 0
        self._positions: torch.Tensor | None = None

    def begin_chunk(self, frame_start: int) -> None:
        """Start a chunk whose first latent frame has absolute index ``frame_start``."""
        self.frame_start = frame_start
        self._positions = None

    def slots(self) -> list[Slot]:
        """The past slots read this chunk, oldest first (same for every layer)."""
        raise NotImplementedError

    def _read_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Canonical K and V of :meth:`slots` for one layer: [1, S*T, H, D] each."""
        raise NotImplementedError

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int]) -> None:
        """Store a finished chunk: per layer canonical K and V [1, F*T, H, D]; ``frame_ids`` [F] absolute.

        The tensors are the DiT's own outputs of this call (under CUDA graphs they live in the graph
        pool and are overwritten by the next call): a writer copies what it keeps, per frame
        (:func:`~worldtrace_cli.memory.window.split_frames`), and keeps no view of them.
        """
        raise NotImplementedError

    def positions(self) -> torch.Tensor:
        """Virtual temporal positions [S] (float64 latent-frame offsets from ``frame_start``)."""
        if self._positions is None:
            from .positions import SCHEMES

            self._positions = SCHEMES[self.positions_scheme](self.slots(), self.frame_start, self.geometry)
        return self._positions

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K_canon [1, S*T, H, D], V [1, S*T, H, D], positions [S]) of one layer for this chunk."""
        k, v = self._read_kv(layer)
        return k, v, self.positions()

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.geometry
        k = torch.zeros(1, 0, g.heads, g.head_dim, device=g.device, dtype=g.dtype)
        return k, k.clone()

    def kv_bytes(self) -> int:
        """Bytes of K/V the cache holds on the compute device, all layers."""
        g = self.geometry
        per_slot = 2 * g.tokens_per_frame * g.heads * g.head_dim * torch.finfo(g.dtype).bits // 8
        return len(self.slots()) * per_slot * g.num_layers

    def host_bytes(self) -> int:
        """Bytes kept off the compute device (e.g. the field writer's evicted frames); 0 by default."""
        return 0

    def temporal_frequency_scale(self) -> torch.Tensor | None:
        """Multipliers [t_ch/2] of the temporal RoPE frequencies for this chunk (YaRN); None = unchanged."""
        return None

    def events(self) -> list[dict]:
        """Events since the last call (e.g. landmark detections) for chunks.jsonl."""
        return []

    def describe(self) -> dict:
        """Resolved settings for summary.json."""
        return {"cache": self.name, "positions": self.positions_scheme, "budget": self.budget}
