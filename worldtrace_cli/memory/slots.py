"""What a cache slot is and the geometry writers store (docs/architecture.md §2): the leaf of the memory package,
imported by the writers' base (:mod:`.base`) and the position schemes (:mod:`.positions`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheGeometry:
    """Shapes of what a writer stores: per layer, slots of ``tokens_per_frame`` tokens x heads x head_dim.

    ``head_group``: under ``generate --split-heads`` the process group the DiT's heads are split over
    (``heads`` is then this process's share); None when every head is here. Writers that reduce over
    heads sum through :func:`head_sum`.
    """

    num_layers: int
    heads: int
    head_dim: int
    tokens_per_frame: int
    frames_per_chunk: int = 3
    trained_offset: int = 5  # largest temporal offset seen in training: local_attn_size - 1
    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32
    head_group: object = None


def head_sum(geometry: CacheGeometry, values: torch.Tensor) -> torch.Tensor:
    """``values`` (a float tensor of partial sums over this process's heads) summed over every head:
    all-reduced in place over ``geometry.head_group`` under ``--split-heads``, else returned as is."""
    if geometry.head_group is not None:
        import torch.distributed as dist

        dist.all_reduce(values, group=geometry.head_group)
    return values


ROLES = ("summary", "recent")


@dataclass(frozen=True)
class Slot:
    """One past slot as the model reads it this chunk.

    Attributes:
        kind: what the slot holds: ``recent`` (verbatim recent frame of a WorldTrace writer),
            ``past`` (verbatim frame of the sliding/full/yarn baselines), ``field`` (canonical mean
            of a group), ``naive`` (mean of rotated keys), ``landmark``, ``sink`` or ``ema``.
        frames: source latent-frame ids (absolute indices), oldest first.
        role: ``summary`` (stands for history outside the recent window: averages, landmarks,
            sinks, EMA streams) or ``recent`` (a verbatim frame of the newest window). Position
            schemes use the role, never the kind (Def. 1: summary slots rank before recent ones).
        time: the slot's own timestamp in latent frames when it is not the mean of ``frames``
            (e.g. an EMA's weighted time); None otherwise.
    Raises:
        ValueError: ``role`` is not one of :data:`ROLES`.
    """

    kind: str
    frames: tuple[int, ...]
    role: str
    time: float | None = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"Slot role must be one of {ROLES}, got {self.role!r}")

    @property
    def centroid(self) -> float:
        """The slot's timestamp: ``time`` if set, else the mean source latent-frame index."""
        if self.time is not None:
            return self.time
        return sum(self.frames) / len(self.frames)

    @property
    def is_recent(self) -> bool:
        """``role == "recent"`` (kept for callers written before roles existed)."""
        return self.role == "recent"


__all__ = ["ROLES", "CacheGeometry", "Slot", "head_sum"]
