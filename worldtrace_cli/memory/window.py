"""Writers made of a verbatim recent window plus summary components (WorldTrace's cache, paper §3.1).

The cache holds ``N_r`` recent slots (the newest latent frames, verbatim) and ``N_s`` summary slots
filled by one or more :class:`SummaryMemory` components (field averages, landmarks, sink frames,
EMA streams). Every latent frame that leaves the recent window is handed, oldest first, to each
component's :meth:`SummaryMemory.evict` (paper Algorithm 1). Slots are ordered summary components
first (in the order given), then recent slots oldest to newest, which is the rank order of the
slot-rank positions (Def. 1).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import torch

from ..errors import InputError
from .base import CacheGeometry, CacheWriter, MemoryConfig, Slot

FrameKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (k, v) of one latent frame: [1, T, H, D] each


def split_frames(layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frames: Sequence[int],
                 tokens_per_frame: int) -> list[FrameKV]:
    """Per-frame copies of a chunk's committed K/V.

    Args:
        layers_kv: per layer (k, v) [1, F*T, H, D] of one chunk (canonical keys).
        frames: indices 0..F-1 of the frames wanted, in order.
        tokens_per_frame: T.
    Returns:
        one :data:`FrameKV` per wanted frame, each tensor [1, T, H, D] owning its memory: a stored
        frame never keeps its whole chunk alive (a view would, for as long as the frame is kept).
    """
    t = tokens_per_frame
    return [[(k[:, i * t:(i + 1) * t].clone(), v[:, i * t:(i + 1) * t].clone()) for k, v in layers_kv]
            for i in frames]


class SummaryMemory:
    """A component that owns some summary slots. State is created in :meth:`reset`."""

    def reset(self, geometry: CacheGeometry) -> None:
        self.geometry = geometry

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        """Receive a latent frame leaving the recent window: per layer canonical (k, v) [1, T, H, D]."""
        raise NotImplementedError

    def slots(self) -> list[Slot]:
        """This component's slots, oldest first."""
        raise NotImplementedError

    def kv(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per slot (canonical k, v) [1, T, H, D] of one layer, in :meth:`slots` order."""
        raise NotImplementedError

    def host_bytes(self) -> int:
        """Bytes kept off the compute device."""
        return 0

    def events(self) -> list[dict]:
        """Events since the last call (e.g. landmark detections), for chunks.jsonl."""
        return []

    def describe(self) -> dict:
        return {}


def resolve_slots(config: MemoryConfig, default_summary: int = 4, default_recent: int = 2) -> tuple[int, int]:
    """(N_s, N_r) from ``--summary-slots``, ``--recent-slots`` and ``--budget`` (budget = N_s + N_r).

    Defaults follow the paper's recall setting N_s = 4, N_r = 2 (design.md §3). With only
    ``--budget``, N_r keeps its default (at most budget - 1) and N_s takes the rest.

    Raises:
        InputError: negative counts, N_r < 1, or a budget that disagrees with both counts.
    """
    ns, nr, budget = config.summary_slots, config.recent_slots, config.budget
    if ns is not None and ns < 0:
        raise InputError(f"--summary-slots: must be >= 0, got {ns}")
    if nr is not None and nr < 1:
        raise InputError(f"--recent-slots: must be >= 1, got {nr}")
    if budget is not None:
        if ns is not None and nr is not None and ns + nr != budget:
            raise InputError(f"--budget {budget} != --summary-slots {ns} + --recent-slots {nr}")
        if ns is None and nr is None:
            nr = max(1, min(default_recent, budget - 1))
        if ns is None:
            ns = budget - nr
        if nr is None:
            nr = budget - ns
        if nr < 1 or ns < 0:
            raise InputError(f"--budget {budget}: too small for {ns} summary + {nr} recent slots")
    return (default_summary if ns is None else ns), (default_recent if nr is None else nr)


class RecentWindowWriter(CacheWriter):
    """Recent window of ``n_recent`` verbatim frames plus summary components (``_components``).

    Subclasses implement :meth:`make_components` (called by ``reset``) and may override
    ``default_positions`` (``slot_rank`` for WorldTrace writers).
    """

    default_positions = "slot_rank"

    def __init__(self, config: MemoryConfig, default_budget: int):
        super().__init__(config, default_budget)
        self.n_summary, self.n_recent = resolve_slots(config)
        self.budget = self.n_summary + self.n_recent

    def make_components(self) -> list[SummaryMemory]:
        raise NotImplementedError

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._components = self.make_components()
        for comp in self._components:
            comp.reset(geometry)
        self._recent_ids: deque[int] = deque()
        self._recent: deque[FrameKV] = deque()

    def slots(self) -> list[Slot]:
        out = [s for comp in self._components for s in comp.slots()]
        return out + [Slot("recent", (f,)) for f in self._recent_ids]

    def _read_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [kv for comp in self._components for kv in comp.kv(layer)]
        pairs += [frame[layer] for frame in self._recent]
        if not pairs:
            return self._empty()
        return torch.cat([k for k, _ in pairs], dim=1), torch.cat([v for _, v in pairs], dim=1)

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int]) -> None:
        frames = split_frames(layers_kv, range(len(frame_ids)), self.geometry.tokens_per_frame)
        for fid, frame_kv in zip(frame_ids, frames):
            self._recent_ids.append(fid)
            self._recent.append(frame_kv)  # owned per-frame copies: components may keep them as they are
            while len(self._recent) > self.n_recent:
                old_id, old_kv = self._recent_ids.popleft(), self._recent.popleft()
                for comp in self._components:
                    comp.evict(old_id, old_kv)

    def host_bytes(self) -> int:
        return sum(comp.host_bytes() for comp in self._components)

    def events(self) -> list[dict]:
        return [e for comp in self._components for e in comp.events()]

    def describe(self) -> dict:
        d = super().describe()
        d.update({"summary_slots": self.n_summary, "recent_slots": self.n_recent})
        for comp in self._components:
            d.update(comp.describe())
        return d
