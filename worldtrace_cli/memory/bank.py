"""The pose-indexed K/V bank shared by the retrieval writers ``worldkv`` and ``retrieval``.

Spec: ``docs/reference/worldkv.md`` (WorldKV, Yi et al. 2026). Three pieces:

* **Pose distance** (§2.2): a chunk's pose is the mean translation and the *element-wise* mean of its
  latent frames' 3x3 rotations (no re-projection onto SO(3), A9); a candidate's distance to the
  query is ``0.5 * d_t / max d_t + 0.5 * d_R / max d_R`` over the current candidate set, with
  ``d_t`` the squared L2 translation distance and ``d_R`` the geodesic angle
  ``arccos(clamp((tr(R_m^T R_q) - 1) / 2, -1, 1))`` (a term whose maximum is 0 is left as is: a
  yaw-only loop is ranked by rotation alone). :func:`nearest` takes the k smallest, ascending; ties
  go to the older candidate (stable sort), so runs are reproducible.
* **Store-time compression** (§3): per layer, the chunk's keys are rotated to their original
  temporal positions (A15), the anchor frame (frame 0) is kept whole, and of the other frames the
  ``(C - 1) * ceil(r * T)`` tokens least cosine-similar (all heads flattened, float32, eps 1e-8) to
  the anchor frame's mean key are kept, pooled over those frames, in their original order
  (:func:`keep_indices`). The bank stores the *canonical* keys of the kept tokens and their values.
* **The bank** (:class:`ChunkBank`): one entry per committed chunk (all layers: K, V [L, N, H, D],
  the kept tokens of each frame [L, C], the mean pose), on the host (pinned when the model runs on
  CUDA) or on a GPU (``--bank-device``). It grows by one entry per chunk and never on the compute
  device unless asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..model.rope import MainRope
from .base import CacheGeometry
from .slots import head_sum
from .pinned import PinnedArena, affordable

EPS = 1e-8  # cosine-similarity guard (WorldKV release)


def mean_pose(poses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean translation [3] and element-wise mean rotation [3, 3] (float64) of c2w poses [F, 4, 4]."""
    p = poses.to(torch.float64)
    return p[:, :3, 3].mean(0), p[:, :3, :3].mean(0)


def pose_distances(cand_t: torch.Tensor, cand_r: torch.Tensor, query_t: torch.Tensor, query_r: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """WorldKV's pose distance of M candidates to a query (spec §2.2).

    Args:
        cand_t: float64 [M, 3] candidate translations; cand_r: [M, 3, 3] (mean) rotations.
        query_t: [3]; query_r: [3, 3].
    Returns:
        (d [M], d_t [M] squared translation distance in world units^2, d_R [M] geodesic angle in
        radians), float64; ``d = 0.5 d_t / max d_t + 0.5 d_R / max d_R`` (a term with max 0 unscaled).
    """
    d_t = ((cand_t - query_t) ** 2).sum(-1)
    trace = torch.einsum("mij,ij->m", cand_r, query_r)  # tr(R_m^T R_q)
    d_r = torch.arccos(((trace - 1) / 2).clamp(-1.0, 1.0))

    def scaled(x):
        top = x.max() if x.numel() else x.new_zeros(())
        return x / top if top > 0 else x

    return 0.5 * scaled(d_t) + 0.5 * scaled(d_r), d_t, d_r


def nearest(distances: torch.Tensor, k: int) -> list[int]:
    """Indices of the ``k`` smallest distances, ascending; ties keep the lower (older) index."""
    order = torch.sort(distances, stable=True).indices
    return order[:k].tolist()


def kept_per_frame(keep_ratio: float, tokens_per_frame: int) -> int:
    """``ceil(r * T)``: tokens kept per non-anchor frame (pooled over frames). ``r * T`` is rounded to
    9 decimals first, so that e.g. 0.1 * 30 keeps 3 tokens, not 4 (float noise)."""
    return math.ceil(round(keep_ratio * tokens_per_frame, 9))


def keep_indices(k_rot: torch.Tensor, frames: int, tokens_per_frame: int, keep_ratio: float,
                 geometry: CacheGeometry | None = None) -> torch.Tensor:
    """Tokens a chunk keeps in one layer (WorldKV §3, pooled selection).

    Args:
        k_rot: keys of one chunk and layer [C*T, H, D], rotated to their temporal positions (the
            release scores post-RoPE keys), tokens in (frame, token) order.
        frames: C; tokens_per_frame: T; keep_ratio: r in (0, 1].
        geometry: the writer's geometry; under ``--split-heads`` (``geometry.head_group``) H is this
            process's heads, and the dot products and norms are summed over every process's heads
            (:func:`~worldtrace_cli.memory.slots.head_sum`), so every process keeps the same tokens.
    Returns:
        int64 [T + (C-1)*ceil(r*T)] sorted token indices: the anchor frame's T tokens, then the
        ``(C-1)*ceil(r*T)`` non-anchor tokens whose cosine similarity (over all heads, float32) to
        the anchor frame's mean key is lowest (ties: the earlier token), in original order.
    """
    t = tokens_per_frame
    flat = k_rot.reshape(frames * t, -1).float()
    centroid = flat[:t].mean(0)
    rest = flat[t:]
    if geometry is None or geometry.head_group is None:
        sim = (rest @ centroid) / (rest.norm(dim=1) * centroid.norm() + EPS)
    else:
        n = rest.shape[0]
        sums = head_sum(geometry, torch.cat([rest @ centroid, rest.pow(2).sum(1), centroid.pow(2).sum()[None]]))
        sim = sums[:n] / (sums[n:2 * n].sqrt() * sums[2 * n].sqrt() + EPS)
    n_keep = min(rest.shape[0], (frames - 1) * kept_per_frame(keep_ratio, t))
    chosen = torch.sort(sim, stable=True).indices[:n_keep].sort().values + t
    return torch.cat([torch.arange(t, device=chosen.device), chosen])


def _to(x: torch.Tensor, device) -> torch.Tensor:
    """``x`` on ``device``: asynchronous only towards CUDA (ordered on the stream that reads it); towards
    the CPU (a bank on CUDA, the model on the CPU) synchronous, since the CPU reads it at once and an
    asynchronous device-to-host copy returns before its data has arrived."""
    return x.to(device, non_blocking=torch.device(device).type == "cuda")


@dataclass
class BankEntry:
    """One committed chunk in the bank.

    Attributes:
        frames: its latent-frame ids (absolute), oldest first (C of them).
        k, v: canonical keys and values of the kept tokens, [L, N, H, D] on the bank device, tokens
            grouped by frame in original order (anchor frame first, whole).
        counts: int64 [L, C] (CPU): tokens each frame keeps in each layer (sums to N per layer).
        t, r: float64 mean translation [3] and element-wise mean rotation [3, 3] of its frames.
    """

    frames: tuple[int, ...]
    k: torch.Tensor
    v: torch.Tensor
    counts: torch.Tensor
    t: torch.Tensor
    r: torch.Tensor

    def frame_kv(self, layer: int, index: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Kept tokens of frame ``index`` (0..C-1) in ``layer``: (k, v) [1, n, H, D] on ``device``."""
        row = self.counts[layer].tolist()
        start = sum(row[:index])
        sl = slice(start, start + row[index])
        return _to(self.k[layer, sl], device)[None], _to(self.v[layer, sl], device)[None]

    def chunk_kv(self, layer: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """All kept tokens of ``layer``: (k, v) [1, N, H, D] on ``device``."""
        return _to(self.k[layer], device)[None], _to(self.v[layer], device)[None]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class ChunkBank:
    """Every committed chunk's (optionally compressed) canonical K/V with its mean pose.

    Args:
        geometry: the cache geometry (compute device, dtype, T, layers).
        keep_ratio: r in (0, 1]; 1 keeps every token (no compression, no scoring).
        device: where the entries live (``cpu``: pinned host memory when the model runs on CUDA).
    """

    def __init__(self, geometry: CacheGeometry, keep_ratio: float, device: torch.device):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # "cuda" = the current device, as tensors name it
            device = torch.device("cuda", torch.cuda.current_device())
        self.geometry, self.keep_ratio, self.device = geometry, keep_ratio, device
        self._pin = self.device.type == "cpu" and torch.device(geometry.device).type == "cuda"
        self._arena = PinnedArena(pin=self._pin)  # pinned host memory in slabs (see memory/pinned.py)
        self._rope = MainRope(geometry.head_dim, precision=torch.float32)  # the runs' default RoPE arithmetic
        self.entries: list[BankEntry] = []
        self._bytes = 0
        self._t = torch.zeros(0, 3, dtype=torch.float64)     # mean poses of the entries (capacity doubles)
        self._r = torch.zeros(0, 3, 3, dtype=torch.float64)

    @property
    def on_host(self) -> bool:
        """True when the entries live in host memory (``--bank-device cpu``)."""
        return self.device.type == "cpu"

    def entry_tokens(self) -> int:
        """Tokens per layer of a full chunk's entry: C*T, or compressed ``T + (C-1)*ceil(r*T)``
        (:func:`keep_indices`)."""
        c, t = self.geometry.frames_per_chunk, self.geometry.tokens_per_frame
        if self.keep_ratio < 1 and c > 1:
            return t + min((c - 1) * t, (c - 1) * kept_per_frame(self.keep_ratio, t))
        return c * t

    def reserve(self, chunks: int) -> int:
        """Page-lock now the host memory that ``chunks`` more entries' K and V [L, N, H, D] will take
        (a pinned bank only: a CUDA model with the bank in host memory), within
        :func:`~worldtrace_cli.memory.pinned.affordable`; :meth:`store` then only carves it (docs/gpu-memory.md).
        Returns the bytes reserved."""
        if not self._pin or chunks < 1:
            return 0
        g = self.geometry
        nbytes = g.num_layers * self.entry_tokens() * g.heads * g.head_dim * g.dtype.itemsize
        return self._arena.reserve(nbytes, affordable(2 * chunks, nbytes, self._arena.limit))

    def _place(self, x: torch.Tensor, owned: bool = False) -> torch.Tensor:
        """``x`` on the bank device (pinned host memory when pinning); a copy unless ``owned`` and
        already there."""
        if self._pin:
            return self._arena.copy(x)
        return x.to(self.device, copy=not (owned and x.device == self.device))

    def store(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int],
              poses: torch.Tensor) -> BankEntry:
        """Compress (if r < 1) and bank one chunk.

        Args:
            layers_kv: per layer canonical (k, v) [1, C*T, H, D] of the chunk (the DiT's own tensors:
                copied, never kept).
            frame_ids: its C absolute latent-frame ids; poses: float64 [C, 4, 4] c2w of those frames.
        Returns:
            the new :class:`BankEntry` (also appended to :attr:`entries`).
        """
        c, t = len(frame_ids), self.geometry.tokens_per_frame
        ks, vs, counts = [], [], []
        compress = self.keep_ratio < 1 and c > 1
        if compress:  # the chunk's temporal angles once, on the DiT's device (not a host-to-device copy per layer)
            positions = torch.tensor(frame_ids, dtype=torch.float64).repeat_interleave(t)
            device = layers_kv[0][0].device
            angles = tuple(a.to(device, self._rope.precision) for a in self._rope.temporal_angles(positions))
        for k, v in layers_kv:
            k, v = k[0], v[0]
            if compress:
                rotated = self._rope.apply_temporal(k[None], None, angles=angles)[0]  # original positions (A15)
                idx = keep_indices(rotated, c, t, self.keep_ratio, self.geometry)
                k, v = k.index_select(0, idx), v.index_select(0, idx)
                counts.append(torch.bincount(idx // t, minlength=c))  # on the DiT's device: no sync per layer
            else:
                counts.append(torch.full((c,), t, dtype=torch.int64))
            ks.append(k)
            vs.append(v)
        mt, mr = mean_pose(poses)
        entry = BankEntry(tuple(int(f) for f in frame_ids), self._place(torch.stack(ks), True),
                          self._place(torch.stack(vs), True),
                          torch.stack(counts).cpu(), mt, mr)
        self._append(entry)
        return entry

    def _append(self, entry: BankEntry) -> None:
        m = len(self.entries)
        if m == len(self._t):  # grow the pose tables geometrically: O(1) amortised per chunk
            self._t = torch.cat([self._t, torch.zeros(max(16, m), 3, dtype=torch.float64)])
            self._r = torch.cat([self._r, torch.zeros(max(16, m), 3, 3, dtype=torch.float64)])
        self._t[m], self._r[m] = entry.t, entry.r
        self.entries.append(entry)
        self._bytes += entry.nbytes()

    def mean_poses(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean translations [count, 3] and rotations [count, 3, 3] (float64) of the first ``count`` entries."""
        return self._t[:count], self._r[:count]

    def nbytes(self) -> int:
        """Bytes of K/V held by the bank, all entries and layers."""
        return self._bytes

    def state_dict(self) -> dict:
        """Per entry: frames, K, V [L, N, H, D] (live tensors), counts [L, C], mean pose t [3], r [3, 3]."""
        return {"entries": [{"frames": list(e.frames), "k": e.k, "v": e.v, "counts": e.counts, "t": e.t, "r": e.r}
                            for e in self.entries]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`: K/V copied onto this bank's device (pinned host memory as made)."""
        self.entries, self._bytes = [], 0
        self._arena = PinnedArena(pin=self._pin)
        self._t, self._r = self._t[:0], self._r[:0]
        for e in state["entries"]:
            self._append(BankEntry(tuple(int(f) for f in e["frames"]), self._place(e["k"]), self._place(e["v"]),
                                   e["counts"].to("cpu", torch.int64, copy=True),
                                   e["t"].to("cpu", torch.float64, copy=True), e["r"].to("cpu", torch.float64, copy=True)))


class PoseRetrieval:
    """Mixin of the retrieval writers: camera poses of latent frames, from
    :meth:`~worldtrace_cli.memory.base.CacheWriter.set_poses` only (no writer derives poses)."""

    def frame_pose(self, frames: Sequence[int]) -> torch.Tensor:
        """float64 [n, 4, 4] camera-to-world poses of the latent frames ``frames``.

        Raises:
            RuntimeError: no poses were given (the rollout calls set_poses after reset), or a frame
                lies past them.
        """
        frames = list(frames)
        if self.frame_poses is None:
            raise RuntimeError(f"--cache {self.name} retrieves by camera pose: call set_poses after reset")
        if frames and max(frames) >= len(self.frame_poses):
            raise RuntimeError(f"--cache {self.name}: no camera pose for latent frame {max(frames)} "
                               f"(set_poses gave {len(self.frame_poses)})")
        return self.frame_poses[frames]


def retrieval_event(window: str, query_frame: int, candidates: int, picked: list[dict], bank: ChunkBank) -> dict:
    """The per-chunk ``retrieval`` event of chunks.jsonl: the window kind (``plain`` before any
    candidate exists, else ``retrieved``), the current chunk's first latent frame, the number of
    candidates, what was retrieved (with pose distances) and the bank's size and device."""
    return {"type": "retrieval", "query_frame": query_frame, "window": window, "candidates": candidates,
            "retrieved": picked, "bank_entries": len(bank.entries), "bank_bytes": bank.nbytes(),
            "bank_device": str(bank.device)}
