"""``retrieval``: WorldTrace Retrieval, pose-retrieved past frames in addressable slots (docs/memory.md).

WorldTrace's cache layout (paper §3.1): N_r recent slots hold the newest latent frames verbatim;
the N_s summary slots hold, every chunk, the N_s *evicted* latent frames whose camera pose is
nearest the current chunk's (WorldKV's pose distance, :func:`~.bank.pose_distances`, per frame
against the chunk's mean pose; ties to the older frame). They are read at slot-rank virtual
positions (Def. 1: summary slot s at ``-(N_s + N_r) + s``, oldest retrieved frame first), so
every query-key offset stays within the trained window however long ago the frame was made;
WorldKV instead reads retrieved chunks at their original positions (``worldkv``).

Every committed chunk is banked (:class:`~.bank.ChunkBank`: host memory by default, or
``--bank-device``), optionally compressed at store time as in WorldKV (``--keep-ratio`` r or the
spec ``retrieval:r``: anchor
frame whole, ``(C-1)*ceil(r*T)`` least anchor-similar other tokens; default 1 = no compression);
a frame becomes a candidate once it has left the recent window. A retrieved frame's slot holds
its kept tokens (all T, or fewer for a compressed chunk's non-anchor frames, per layer).
Before N_s frames have been evicted, every evicted frame is read.
"""

from __future__ import annotations

import bisect
from typing import Sequence

import torch

from ..writer_options import DEFAULT_WINDOW
from .bank import ChunkBank, PoseRetrieval, mean_pose, nearest, pose_distances, retrieval_event
from .base import CacheGeometry, MemoryConfig, Slot, check_bank_device, register
from .window import FrameKV, RecentWindowWriter, SummaryMemory


class RetrievalSummary(SummaryMemory):
    """N_s slots of banked, evicted latent frames nearest in camera pose to the current chunk.

    Args:
        n_slots: N_s. keep_ratio: store-time compression r in (0, 1]. bank_device: where the bank lives.
    """

    def __init__(self, n_slots: int, keep_ratio: float, bank_device: torch.device):
        self.n_slots, self.keep_ratio, self.bank_device = n_slots, keep_ratio, bank_device

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self.bank = ChunkBank(geometry, self.keep_ratio, self.bank_device)
        self._where: dict[int, tuple[int, int]] = {}  # latent frame -> (bank entry, index in its chunk)
        self._frames: list[int] = []                    # banked latent frames, ascending
        self._evicted_end = 0                           # frames < this have left the recent window
        self._selected: list[int] = []                  # retrieved frames, oldest first
        self._events: list[dict] = []

    def store(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int],
              poses: torch.Tensor) -> None:
        """Bank a committed chunk (per layer canonical (k, v) [1, C*T, H, D], poses [C, 4, 4])."""
        self.bank.store(layers_kv, frame_ids, poses)
        for j, f in enumerate(frame_ids):
            self._where[int(f)] = (len(self.bank.entries) - 1, j)
            self._frames.append(int(f))

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        """The frame is a candidate from now on (the bank already holds it; the verbatim copy goes)."""
        self._evicted_end = max(self._evicted_end, frame_id + 1)

    def select(self, frame_start: int, frames: int, poses) -> dict:
        """Retrieve for the chunk starting at ``frame_start``; ``poses(ids) -> [n, 4, 4]``. Returns its event."""
        cands = self._frames[:bisect.bisect_left(self._frames, self._evicted_end)]
        picked = []
        if cands and self.n_slots:
            qt, qr = mean_pose(poses(range(frame_start, frame_start + frames)))
            p = poses(cands)
            d, d_t, d_r = pose_distances(p[:, :3, 3], p[:, :3, :3], qt, qr)
            best = nearest(d, self.n_slots)
            picked = [{"frame": cands[j], "distance": round(d[j].item(), 6), "translation_sq": round(d_t[j].item(), 6),
                       "rotation_rad": round(d_r[j].item(), 6), "tokens_per_layer": self._tokens(cands[j], 0)}
                      for j in best]
            self._selected = sorted(cands[j] for j in best)
        else:
            self._selected = []
        return retrieval_event("retrieved" if picked else "plain", frame_start, len(cands), picked, self.bank)

    def record(self, event: dict) -> None:
        """Keep ``event`` for :meth:`events`, replacing an earlier one of the same chunk."""
        if self._events and self._events[-1]["query_frame"] == event["query_frame"]:
            self._events.pop()
        self._events.append(event)

    def _tokens(self, frame: int, layer: int) -> int:
        entry, j = self._where[frame]
        return int(self.bank.entries[entry].counts[layer, j])

    def slots(self) -> list[Slot]:
        return [Slot("retrieved", (f,), "summary") for f in self._selected]

    def kv(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for f in self._selected:
            entry, j = self._where[f]
            out.append(self.bank.entries[entry].frame_kv(layer, j, self.geometry.device))
        return out

    def counts(self, layer: int) -> list[int]:
        """Tokens of each slot in ``layer``, in :meth:`slots` order."""
        return [self._tokens(f, layer) for f in self._selected]

    def host_bytes(self) -> int:
        return self.bank.nbytes() if self.bank.on_host else 0

    def events(self) -> list[dict]:
        out, self._events = self._events, []
        return out

    def state_dict(self) -> dict:
        """The bank, the first frame still in the recent window and unread events (the retrieved set
        is recomputed by the next ``begin_chunk``)."""
        return {"bank": self.bank.state_dict(), "evicted_end": self._evicted_end, "events": list(self._events)}

    def load_state_dict(self, state: dict) -> None:
        self.bank.load_state_dict(state["bank"])
        self._where = {f: (i, j) for i, e in enumerate(self.bank.entries) for j, f in enumerate(e.frames)}
        self._frames = sorted(self._where)
        self._evicted_end = int(state["evicted_end"])
        self._selected, self._events = [], [dict(e) for e in state["events"]]

    def describe(self) -> dict:
        n = len(self.bank.entries) if hasattr(self, "bank") else 0
        size = self.bank.nbytes() if n else 0
        return {"keep_ratio": self.keep_ratio,
                "bank": {"device": str(self.bank_device), "entries": n, "bytes": size,
                         "bytes_per_chunk": size // n if n else None}}


@register
class RetrievalWriter(PoseRetrieval, RecentWindowWriter):
    """WorldTrace Retrieval: N_r recent + N_s evicted frames nearest in camera pose, slot-rank positions."""

    name = "retrieval"
    default_positions = "slot_rank"
    needs_poses = True

    def __init__(self, config: MemoryConfig, default_budget: int, window: int = DEFAULT_WINDOW):
        """Raises InputError: ``--spill-dir``, ``--top-k``, ``--retrieval-budget`` (its retrieved frames
        are the N_s summary slots), bad slot flags, ``--keep-ratio`` or ``--bank-device``."""
        super().__init__(config, default_budget, window)
        self.keep_ratio = self.settings.keep_ratio  # RetrievalOptions: spec :r or --keep-ratio
        self.bank_device = check_bank_device(self.settings.bank_device)

    def make_components(self) -> list[SummaryMemory]:
        return [RetrievalSummary(self.n_summary, self.keep_ratio, self.bank_device)]

    @property
    def _summary(self) -> RetrievalSummary:
        return self._components[0]

    def begin_chunk(self, frame_start: int) -> None:
        super().begin_chunk(frame_start)
        self._summary.record(self._summary.select(frame_start, self.geometry.frames_per_chunk, self.frame_pose))

    def reserve_host(self, latent_frames: int) -> int:
        """:meth:`CacheWriter.reserve_host`: every committed chunk goes to the bank
        (:meth:`ChunkBank.reserve`)."""
        return self._summary.bank.reserve(-(-latent_frames // self.geometry.frames_per_chunk))

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int]) -> None:
        """Bank the chunk first (it needs every frame of the chunk), then run the recent window."""
        self._summary.store(layers_kv, frame_ids, self.frame_pose(frame_ids))
        super().commit(layers_kv, frame_ids)

    def token_counts(self, layer: int) -> torch.Tensor | None:
        t = self.geometry.tokens_per_frame
        counts = self._summary.counts(layer) + [t] * len(self._recent_ids)
        return None if all(n == t for n in counts) else torch.tensor(counts, dtype=torch.int64)

    def kv_bytes(self) -> int:
        """K/V of the slots read this chunk, plus the bank when it lives on a GPU."""
        bank = self._summary.bank
        return super().kv_bytes() + (0 if bank.on_host else bank.nbytes())

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.frame_poses is not None:
            self._summary.select(self.frame_start, self.geometry.frames_per_chunk, self.frame_pose)
