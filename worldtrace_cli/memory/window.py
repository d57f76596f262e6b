"""Writers made of a verbatim recent window plus summary components (WorldTrace's cache, paper §3.1).

The cache holds ``N_r`` recent slots (the newest latent frames, verbatim) and ``N_s`` summary slots
filled by one or more :class:`SummaryMemory` components (field averages, landmarks, sink frames,
EMA streams). Every latent frame that leaves the recent window is handed, oldest first, to each
component's :meth:`SummaryMemory.evict` (paper Algorithm 1). Slots are ordered summary components
first (in the order given), then recent slots oldest to newest, which is the rank order of the
slot-rank positions (Def. 1).

Default sizes follow the model's window L = ``trained_offset + 1`` (known at ``reset``):
N_s + N_r = L, so the oldest slot-rank offset is -L = Eq. 2's t_min (q = a - 1, t_min = q - Delta):
N_r = 2, N_s = 4 for MG2's window 6; N_r = 2, N_s = 2 for gta_drive's window 4.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import torch

from ..errors import InputError
from ..writer_options import DEFAULT_WINDOW, writer_sizes
from .base import CacheGeometry, CacheWriter, MemoryConfig, Slot, frames_state, load_frames


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


def rewrite_held(ids, ks: list, vs: list, layers_kv, frame_ids, tokens_per_frame: int) -> list[int]:
    """Replace in place the held frames among ``frame_ids`` of a per-layer frame store (``ids``: the
    held frame ids in order; ``ks[layer][j]`` / ``vs[layer][j]``: frame j's K / V [1, T, H, D]) by
    their re-computation ``layers_kv`` (per layer [1, F*T, H, D] of ``frame_ids``); returns the ids
    replaced (:meth:`~worldtrace_cli.memory.base.CacheWriter.rewrite` of ``sliding`` and ``full``)."""
    index = {f: i for i, f in enumerate(frame_ids)}
    done = [f for f in ids if f in index]
    for j, f in enumerate(ids):
        if f in index:
            for layer, (k, v) in enumerate(split_frames(layers_kv, [index[f]], tokens_per_frame)[0]):
                ks[layer][j], vs[layer][j] = k, v
    return done


class SummaryMemory:
    """A component that owns some summary slots. State is created in :meth:`reset` and saved by
    :meth:`state_dict` (plain data and tensors, see :meth:`CacheWriter.state_dict`)."""

    def reset(self, geometry: CacheGeometry) -> None:
        self.geometry = geometry

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        """Receive a latent frame leaving the recent window: per layer canonical (k, v) [1, T, H, D]."""
        raise NotImplementedError

    def end_chunk(self) -> None:
        """Called once per commit, after the chunk's evictions (per-chunk updates, e.g. MemRoPE's EMA)."""

    def rewrite(self, frames: dict) -> list[int]:
        """Replace verbatim frames this component keeps (``frames``: id -> :data:`FrameKV`); returns
        the ids replaced. Default none: a summary keeps the K/V it was made with (as LongLive's sink
        keeps the first prompt's); only the sink is rewritten, on LongLive's early switch."""
        return []

    def state_dict(self) -> dict:
        """This component's rollout state (see :meth:`CacheWriter.state_dict`)."""
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` after :meth:`reset`; tensors are copied to this component's device."""
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

    def reserve_host(self, evictions: int) -> int:
        """Make ahead the host store of ``evictions`` more evicted latent frames (bytes returned); default
        nothing: only a component with a page-locked host store (Field's) has work here."""
        return 0

    def events(self) -> list[dict]:
        """Events since the last call (e.g. landmark detections), for chunks.jsonl."""
        return []

    def describe(self) -> dict:
        return {}


class RecentWindowWriter(CacheWriter):
    """Recent window of ``n_recent`` verbatim frames plus summary components (``_components``).

    Subclasses implement :meth:`make_components` (called by ``reset``) and may override
    ``default_positions`` (``slot_rank`` for WorldTrace writers) and :meth:`resolve_sizes`.
    ``n_summary``, ``n_recent`` and ``budget`` are final after :meth:`reset` (they may follow the
    model's window); the constructor resolves them for MG2's window to validate the flags early.
    """

    default_positions = "slot_rank"

    def __init__(self, config: MemoryConfig, default_budget: int, window: int = DEFAULT_WINDOW):
        super().__init__(config, default_budget, window)
        self.default_budget = default_budget
        self.n_summary, self.n_recent = self.resolve_sizes(window)
        self.budget = self.n_summary + self.n_recent

    def resolve_sizes(self, window: int) -> tuple[int, int]:
        """(N_s, N_r) for a model window of ``window`` latent frames: the writer's rule in
        :func:`~worldtrace_cli.writer_options.writer_sizes`. Raises InputError on bad flags."""
        return writer_sizes(self.config, window, self.default_budget)

    def make_components(self) -> list[SummaryMemory]:
        raise NotImplementedError

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self.n_summary, self.n_recent = self.resolve_sizes(geometry.trained_offset + 1)
        self.budget = self.n_summary + self.n_recent
        self._components = self.make_components()
        for comp in self._components:
            comp.reset(geometry)
        self._recent_ids: deque[int] = deque()
        self._recent: deque[FrameKV] = deque()

    def slots(self) -> list[Slot]:
        out = [s for comp in self._components for s in comp.slots()]
        return out + [Slot("recent", (f,), "recent") for f in self._recent_ids]

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
        for comp in self._components:
            comp.end_chunk()

    def rewrite(self, layers_kv, frame_ids, summary: bool = False) -> list[int]:
        """:meth:`CacheWriter.rewrite`: the recent window's frames among ``frame_ids`` and, with
        ``summary``, sink frames (the only summary slots that are one verbatim frame)."""
        frames = dict(zip(frame_ids, split_frames(layers_kv, range(len(frame_ids)), self.geometry.tokens_per_frame)))
        done = []
        for i, fid in enumerate(self._recent_ids):
            if fid in frames:
                self._recent[i] = frames[fid]
                done.append(fid)
        if summary:
            done += [f for comp in self._components for f in comp.rewrite(frames)]
        return sorted(done)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "recent_ids": list(self._recent_ids), "recent": frames_state(self._recent),
                "components": [comp.state_dict() for comp in self._components]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if len(state["components"]) != len(self._components):
            raise InputError(f"resume state: {len(state['components'])} summary components saved, "
                             f"--cache {self.config.cache} has {len(self._components)}")
        self._recent_ids = deque(int(f) for f in state["recent_ids"])
        self._recent = deque(load_frames(state["recent"], self.geometry.device))
        for comp, comp_state in zip(self._components, state["components"]):
            comp.load_state_dict(comp_state)

    def host_bytes(self) -> int:
        return sum(comp.host_bytes() for comp in self._components)

    def reserve_host(self, latent_frames: int) -> int:
        """:meth:`CacheWriter.reserve_host`: the frames that will leave the recent window go to the
        summary components' host stores."""
        evictions = max(0, latent_frames - self.n_recent)
        return sum(comp.reserve_host(evictions) for comp in self._components)

    def events(self) -> list[dict]:
        return [e for comp in self._components for e in comp.events()]

    def describe(self) -> dict:
        d = super().describe()
        d.update({"summary_slots": self.n_summary, "recent_slots": self.n_recent})
        for comp in self._components:
            d.update(comp.describe())
        return d
