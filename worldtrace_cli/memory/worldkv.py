"""``worldkv``: WorldKV (Yi et al. 2026) as released, a faithful baseline (spec: docs/reference/worldkv.md).

**Bank** (§2.1): after its context pass every chunk's canonical K/V (all layers) is banked with its
mean camera pose, compressed at store time (:mod:`.bank`: anchor frame whole, the ``(C-1)*ceil(r*T)``
least anchor-similar other tokens, pooled, in order; ``--keep-ratio`` r or the spec ``worldkv:r``,
default 0.5 as released, 0.25 the paper's). The bank lives in host memory (``--bank-device cuda``
moves it to a GPU) and grows by one entry per chunk; the compute device holds only the window.

**Window** (§2.4) for chunk n, C latent frames per chunk: ``[retrieved | recent]`` (no sink: MG2's
native cache has none, A11). *recent* = the current chunk and the chunk before it (the release's
fixed 6 latent frames; ``ceil(6 / C)`` chunks, so 2 chunks for LingBot's C = 4 too, spec §2.4);
the cache holds the past part, chunk n-1, verbatim. *retrieved* = the top-k banked chunks by the
pose distance of §2.2 between their mean pose and the current chunk's (known before it is
generated), ascending distance. Candidates are chunks m < n - 2 (the release's quirk, kept: chunk
n-2 is neither recent nor retrievable for one step, §2.3). Retrieval runs every chunk (A5) and
its set is reused by every denoising step and the context pass. Before any candidate exists the
window is the plain newest ``R + recent - C`` past latent frames, verbatim (§2.3).

**k** (A3): ``--top-k`` chunks, default ``18 // C`` = 6 (the release: k stays 6 whatever r), or
``--retrieval-budget FRAMES``: the largest k whose compressed chunks fit FRAMES latent frames of
tokens (the paper's "2x more history": 18 -> k = 12 at r = 0.25).

**Positions** (§2.5, A1): each latent frame of a retrieved chunk is one slot (its kept tokens share
the frame's position), so every scheme applies per frame. ``actual`` (default) = the release's
*original* positions (the chunk's own frame indices, far beyond MG2's trained window); ``rank`` =
the release's *contiguous* option (retrieved chunks packed before the recent block, the closest
pose furthest back: ``recent_start - (k - i) C + j``).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import Sequence

import torch

from ..writer_options import DEFAULT_WINDOW
from .bank import ChunkBank, PoseRetrieval, kept_per_frame, mean_pose, nearest, pose_distances, retrieval_event
from .base import CacheGeometry, CacheWriter, MemoryConfig, Slot, check_bank_device, register

RECENT_FRAMES = 6       # the release's fixed recent window, current chunk included (= MG2's window)
RETRIEVAL_FRAMES = 18   # the release's retrieval budget in latent frames (6 chunks of 3)
# the released keep ratio (0.5) is WorldKVOptions.keep_ratio's default (writer_options/flags.py)


@register
class WorldKVWriter(PoseRetrieval, CacheWriter):
    """WorldKV as released: top-k banked chunks by camera pose + the previous chunk, original positions, compressed bank."""

    name = "worldkv"
    default_positions = "actual"
    needs_poses = True

    def __init__(self, config: MemoryConfig, default_budget: int, window: int = DEFAULT_WINDOW):
        """Raises InputError: slot-count, budget or spill flags; both --top-k and --retrieval-budget;
        a bad --top-k, --retrieval-budget, --keep-ratio or --bank-device
        (:func:`~worldtrace_cli.writer_options.check_flags`)."""
        super().__init__(config, default_budget, window)
        self.keep_ratio = self.settings.keep_ratio
        self.bank_device = check_bank_device(self.settings.bank_device)
        self._resolve(3, 880)  # provisional (MG2 universal: C = 3, T = 880) until reset knows the model

    def _resolve(self, frames: int, tokens: int) -> None:
        """k, the recent chunks and the plain window for C = ``frames``, T = ``tokens``."""
        self.recent_chunks = max(1, math.ceil(RECENT_FRAMES / frames))
        if self.settings.retrieval_budget is not None:
            self.retrieval_frames = self.settings.retrieval_budget
            kept = min(tokens, kept_per_frame(self.keep_ratio, tokens))
            self.k = self.retrieval_frames * tokens // (tokens + (frames - 1) * kept)
        else:
            self.k = RETRIEVAL_FRAMES // frames if self.settings.top_k is None else self.settings.top_k
            self.retrieval_frames = self.k * frames
        recent_past = (self.recent_chunks - 1) * frames
        self.plain_frames = self.retrieval_frames + recent_past  # past frames before any candidate exists
        self.budget = max(self.k * frames + recent_past, self.plain_frames)

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self._resolve(geometry.frames_per_chunk, geometry.tokens_per_frame)
        self._bank = ChunkBank(geometry, self.keep_ratio, self.bank_device)
        # verbatim chunks on the compute device: (chunk index, frame ids, [L, 2, C*T, H, D])
        self._window: deque[tuple[int, tuple[int, ...], torch.Tensor]] = deque()
        self._plain, self._selected, self._events = True, [], []
        self._chunk_ids: list[int] = []  # chunk index of each bank entry, ascending

    # --- retrieval (once per chunk, reused by every step and the context pass) ---

    def _chunk_index(self) -> int:
        return self.frame_start // self.geometry.frames_per_chunk

    def _select(self) -> dict:
        """Pick this chunk's window; returns its ``retrieval`` event."""
        n, c = self._chunk_index(), self.geometry.frames_per_chunk
        entries = self._bank.entries
        # entries are in chunk order: the candidates (chunks m < n - recent_chunks) are a prefix
        cands = bisect.bisect_left(self._chunk_ids, n - self.recent_chunks)
        self._plain = cands == 0
        self._selected, picked = [], []
        if cands:
            qt, qr = mean_pose(self.frame_pose(range(self.frame_start, self.frame_start + c)))
            d, d_t, d_r = pose_distances(*self._bank.mean_poses(cands), qt, qr)
            for j in nearest(d, self.k):
                e = entries[j]
                self._selected.append(j)
                picked.append({"chunk": e.frames[0] // c, "frames": list(e.frames), "distance": round(d[j].item(), 6),
                               "translation_sq": round(d_t[j].item(), 6), "rotation_rad": round(d_r[j].item(), 6),
                               "tokens_per_layer": int(e.counts[0].sum())})
        return retrieval_event("plain" if self._plain else "retrieved", self.frame_start, cands, picked, self._bank)

    def begin_chunk(self, frame_start: int) -> None:
        super().begin_chunk(frame_start)
        if self._events and self._events[-1]["query_frame"] == frame_start:  # begun again: one event per chunk
            self._events.pop()
        self._events.append(self._select())

    def _recent(self) -> list[tuple[int, tuple[int, ...], torch.Tensor]]:
        """The verbatim chunks read this chunk: the plain window's, or the recent block's past part."""
        if self._plain:
            return list(self._window)
        first = self._chunk_index() - (self.recent_chunks - 1)
        return [w for w in self._window if w[0] >= first]

    def _recent_frames(self) -> list[int]:
        frames = [f for _, ids, _ in self._recent() for f in ids]
        return frames[len(frames) - min(len(frames), self.plain_frames):] if self._plain else frames

    def slots(self) -> list[Slot]:
        """Retrieved chunks' frames (``retrieved``, summary; ascending pose distance, each chunk's
        frames in order), then the verbatim recent frames (``recent``)."""
        out = [Slot("retrieved", (f,), "summary") for i in self._selected for f in self._bank.entries[i].frames]
        return out + [Slot("recent", (f,), "recent") for f in self._recent_frames()]

    def _read_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        device = self.geometry.device
        pairs = [self._bank.entries[i].chunk_kv(layer, device) for i in self._selected]
        recent = self._recent()
        if recent:
            kv = torch.cat([w[2][layer] for w in recent], dim=1)  # [2, frames*T, H, D]
            tokens = len(self._recent_frames()) * self.geometry.tokens_per_frame
            pairs.append((kv[0, kv.shape[1] - tokens:][None], kv[1, kv.shape[1] - tokens:][None]))
        if not pairs:
            return self._empty()
        return torch.cat([k for k, _ in pairs], dim=1), torch.cat([v for _, v in pairs], dim=1)

    def token_counts(self, layer: int) -> torch.Tensor | None:
        """Kept tokens of each retrieved frame in this layer, T for recent frames; None when all are T."""
        t = self.geometry.tokens_per_frame
        counts = [self._bank.entries[i].counts[layer] for i in self._selected]
        counts.append(torch.full((len(self._recent_frames()),), t, dtype=torch.int64))
        out = torch.cat(counts)
        return None if bool((out == t).all()) else out

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int]) -> None:
        """Bank the chunk (compressed, with its mean pose) and keep it verbatim while it can be read."""
        c = self.geometry.frames_per_chunk
        self._bank.store(layers_kv, frame_ids, self.frame_pose(frame_ids))
        chunk = frame_ids[0] // c
        self._chunk_ids.append(chunk)
        self._window.append((chunk, tuple(int(f) for f in frame_ids),
                             torch.stack([torch.stack([k[0], v[0]]) for k, v in layers_kv])))
        plain_next = chunk + 1 <= self.recent_chunks  # no candidate yet for the next chunk
        keep = max(self.recent_chunks - 1, math.ceil(self.plain_frames / c)) if plain_next else self.recent_chunks - 1
        while len(self._window) > keep:
            self._window.popleft()

    # --- memory, reporting, state ---

    def kv_bytes(self) -> int:
        """K/V of the window read this chunk, plus the bank when it lives on a GPU."""
        return super().kv_bytes() + (0 if self._bank.on_host else self._bank.nbytes())

    def reserve_host(self, latent_frames: int) -> int:
        """:meth:`CacheWriter.reserve_host`: every committed chunk goes to the bank
        (:meth:`~worldtrace_cli.memory.bank.ChunkBank.reserve`)."""
        return self._bank.reserve(-(-latent_frames // self.geometry.frames_per_chunk))

    def host_bytes(self) -> int:
        """The bank's K/V when it lives in host memory (``--bank-device cpu``, the default)."""
        return self._bank.nbytes() if self._bank.on_host else 0

    def events(self) -> list[dict]:
        """``retrieval`` events since the last call: per chunk the retrieved chunks (ids, frames, pose
        distance and its two terms, tokens kept per layer), candidates, bank entries/bytes/device."""
        out, self._events = self._events, []
        return out

    def describe(self) -> dict:
        entries = len(self._bank.entries) if self.geometry is not None else 0
        bank = self._bank.nbytes() if entries else 0
        return {**super().describe(), "top_k": self.k,
                "k_from": "token budget" if self.settings.retrieval_budget is not None else "top-k",
                "retrieval_frames": self.retrieval_frames, "recent_frames": self.recent_chunks * (
                    self.geometry.frames_per_chunk if self.geometry else 3),
                "keep_ratio": self.keep_ratio, "sink_frames": 0,
                "bank": {"device": str(self.bank_device), "entries": entries, "bytes": bank,
                         "bytes_per_chunk": bank // entries if entries else None}}

    def state_dict(self) -> dict:
        """The bank (:meth:`ChunkBank.state_dict`) and the verbatim chunks (index, frame ids,
        [L, 2, C*T, H, D]) and unread events; the retrieved set is recomputed from them."""
        return {**super().state_dict(), "bank": self._bank.state_dict(),
                "window": [{"chunk": n, "frames": list(ids), "kv": kv} for n, ids, kv in self._window],
                "events": list(self._events)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._bank.load_state_dict(state["bank"])
        self._chunk_ids = [e.frames[0] // self.geometry.frames_per_chunk for e in self._bank.entries]
        self._window = deque((int(w["chunk"]), tuple(int(f) for f in w["frames"]), self._device_copy(w["kv"]))
                             for w in state["window"])
        self._events = [dict(e) for e in state["events"]]
        if self.frame_poses is not None:
            self._select()
