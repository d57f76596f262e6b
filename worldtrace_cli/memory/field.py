"""``field``: WorldTrace Field, canonical key averaging over uniform contiguous groups (paper §3.3).

The M latent frames that have left the recent window are split, oldest to newest, into N_s
contiguous groups (:func:`uniform_groups`); summary slot s holds the per-token mean of its group's
canonical keys and of its values (Def. 2, with the rotation R(omega t_v) left to read time).
By Prop. 1 (App. C) a query scores the slot at any virtual position exactly as it scores the mean
of its sources moved to that position.

This is the paper's *recompute* writer: every evicted frame's canonical K/V is kept off the compute
device (host RAM, pinned on CUDA; or one safetensors file per frame under ``--spill-dir``), so a
moving group boundary always acts on source frames, never on an averaged quantity. Boundaries
``floor(s*M/N_s)`` only move right, each by at most one frame per evicted frame, so the float32
per-slot sums on the compute device are updated incrementally (add the frames entering a group,
subtract those leaving): O(N_s) frame transfers per evicted frame, not O(M). Add/subtract rounding
would drift without bound over a long rollout, so a slot is recomputed exactly from its sources
once it has had ``REFRESH_EVERY`` (64) incremental updates: drift stays bounded at the cost of
an amortised O(M / (64 N_s)) transfers per slot per chunk.

Resume: :meth:`FieldSummary.state_dict` saves the host store (or, with ``--spill-dir``, the spill
folder and its file names), the float32 sums and their group ranges; a restored writer hard-links
(or copies, across file systems) the saved frame files into its own spill folder, so the saved
state stays valid for a second restore and neither writer deletes the other's files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import InputError, OutputError
from .base import CacheGeometry, Slot, register
from .pinned import PinnedArena, affordable
from .window import FrameKV, RecentWindowWriter, SummaryMemory

REFRESH_EVERY = 64  # incremental updates of a slot before it is recomputed exactly (drift bound)


def uniform_groups(num_frames: int, num_slots: int) -> list[tuple[int, int]]:
    """Half-open index ranges ``[floor(s*M/N_s), floor((s+1)*M/N_s))`` of the N_s groups, oldest first.

    Groups are empty when ``num_frames < num_slots`` (those slots are not read).
    """
    return [(s * num_frames // num_slots, (s + 1) * num_frames // num_slots) for s in range(num_slots)]


def stack_frame(frame_kv: FrameKV) -> torch.Tensor:
    """One latent frame's per-layer (k, v) [1, T, H, D] as one tensor [L, 2, T, H, D] (same dtype/device)."""
    return torch.stack([torch.stack([k[0], v[0]]) for k, v in frame_kv])


class FieldSummary(SummaryMemory):
    """N_s field slots: canonical means of uniform contiguous groups of evicted latent frames.

    Args:
        num_slots: N_s.
        spill_dir: keep evicted frames on disk under this folder (a fresh subfolder per rollout,
            removed on reset or when the component is garbage-collected) instead of host RAM.
    Raises:
        OutputError: ``spill_dir`` cannot be created or written (e.g. the disk is full).
    """

    kind = "field"

    def __init__(self, num_slots: int, spill_dir: str | None = None):
        self.num_slots = num_slots
        self.spill_dir = spill_dir
        self._cleanup = None

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        g = geometry
        self._device = torch.device(g.device)
        self._ids: list[int] = []                    # evicted latent-frame ids, oldest first
        self._store: list[torch.Tensor | Path] = []  # per evicted frame: host [L,2,T,H,D] or its file
        self._pending: dict[int, torch.Tensor] = {}  # evicted since the last sync, still on device
        self._host_bytes = 0
        self._arena = PinnedArena(pin=self._device.type == "cuda")  # pinned host store (see memory/pinned.py)
        self._copies: dict[int, torch.cuda.Event] = {}  # CUDA: frame index -> its copy to the host store, in flight
        shape = (self.num_slots, g.num_layers, 2, g.tokens_per_frame, g.heads, g.head_dim)
        self._sum = torch.zeros(shape, dtype=torch.float32, device=self._device)
        self._ranges = [(0, 0)] * self.num_slots     # groups the sums currently hold
        self._updates = [0] * self.num_slots         # incremental updates since the last exact recompute
        if self._cleanup is not None:
            self._cleanup()
        self._dir = None
        if self.spill_dir is not None:
            try:
                os.makedirs(self.spill_dir, exist_ok=True)
                self._dir = Path(tempfile.mkdtemp(prefix="field-", dir=self.spill_dir)).resolve()
            except OSError as err:
                raise OutputError(f"--spill-dir {self.spill_dir}: {err.strerror or err}") from err
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
            self._cleanup.atexit = False  # an interrupted run keeps its spilled frames for --resume

    def reserve_host(self, evictions: int) -> int:
        """The pinned slabs of ``evictions`` more frames [L, 2, T, H, D] (CUDA runs without a spill
        folder: the only ones whose host store is page-locked), within
        :func:`~worldtrace_cli.memory.pinned.affordable`."""
        if self.num_slots == 0 or self._dir is not None or self._device.type != "cuda" or evictions < 1:
            return 0
        g = self.geometry
        frame = g.num_layers * 2 * g.tokens_per_frame * g.heads * g.head_dim * g.dtype.itemsize
        return self._arena.reserve(frame, affordable(evictions, frame, self._arena.limit))

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        if self.num_slots == 0:
            return
        x = stack_frame(frame_kv)
        index = len(self._ids)
        if self._dir is not None:
            path = self._dir / f"frame_{frame_id:07d}.safetensors"
            try:
                save_file({"kv": x.cpu().contiguous()}, str(path))
            except (OSError, SafetensorError) as err:  # disk full, folder removed under us
                raise OutputError(f"--spill-dir {self.spill_dir}: cannot write {path.name}: {err}") from err
            self._store.append(path)
            self._host_bytes += path.stat().st_size
        elif self._device.type == "cuda":
            host = self._copy_to_host(x, index)
            self._store.append(host)
            self._host_bytes += host.numel() * host.element_size()
        else:  # already a fresh host tensor (stack_frame copies); nothing ever writes into it
            self._store.append(x)
            self._host_bytes += x.numel() * x.element_size()
        self._ids.append(frame_id)
        self._pending[index] = x  # it enters the newest group at the next sync: no round trip
        if len(self._pending) > self.geometry.frames_per_chunk:  # nobody read: bound device memory
            del self._pending[min(self._pending)]

    def _copy_to_host(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Frame ``index`` [L, 2, T, H, D] on CUDA copied into the pinned store on a side stream (issue
        45): the DiT's stream goes on while the copy engine works. The side stream first waits for what
        made ``x``; ``x`` is not reused before the copy ends (``record_stream``, and ``_pending`` holds
        it); whoever reads the host copy waits for its event (:meth:`_fetch` on the GPU,
        :meth:`state_dict` on the host)."""
        if not hasattr(self, "_side"):
            self._side = torch.cuda.Stream(self._device)
        self._copies = {i: e for i, e in self._copies.items() if not e.query()}  # landed ones need no wait
        self._side.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self._side):
            host = self._arena.copy(x, non_blocking=True)
            self._copies[index] = torch.cuda.Event()
            self._copies[index].record(self._side)
        x.record_stream(self._side)
        return host

    def _fetch(self, index: int) -> torch.Tensor:
        """Evicted frame ``index`` on the compute device, [L, 2, T, H, D] in the cache dtype."""
        if index in self._pending:
            return self._pending[index]
        src = self._store[index]
        if isinstance(src, Path):
            return load_file(str(src), device=str(self._device))["kv"]
        copy = self._copies.get(index)
        if copy is not None:  # the host copy may still be in flight: the stream waits for it, the host does not
            torch.cuda.current_stream(self._device).wait_event(copy)
        return src.to(self._device, non_blocking=True)

    def contribution(self, index: int) -> torch.Tensor:
        """What evicted frame ``index`` adds to its slot's sum: float32 [L, 2, T, H, D] (canonical K, V)."""
        return self._fetch(index).float()

    def finish_key(self, k_mean: torch.Tensor, frames: tuple[int, ...]) -> torch.Tensor:
        """Turn a slot's float32 mean of contributions [L', T, H, D] into its canonical key (identity)."""
        return k_mean

    def _sync(self) -> None:
        """Bring the per-slot sums to the current groups, fetching each needed frame once."""
        ops: dict[int, list[tuple[int, int]]] = defaultdict(list)  # frame index -> [(slot, +1/-1)]
        for s, (lo, hi) in enumerate(uniform_groups(len(self._ids), self.num_slots)):
            olo, ohi = self._ranges[s]
            if (lo, hi) == (olo, ohi):
                continue
            leave, enter = range(olo, min(ohi, lo)), range(max(ohi, lo), hi)
            if self._updates[s] >= REFRESH_EVERY or len(leave) + len(enter) >= hi - lo:
                self._sum[s].zero_()  # exact recompute: drift bound, or cheaper than the update
                self._updates[s] = 0
                for i in range(lo, hi):
                    ops[i].append((s, 1))
            else:
                self._updates[s] += 1
                for i in enter:
                    ops[i].append((s, 1))
                for i in leave:
                    ops[i].append((s, -1))
            self._ranges[s] = (lo, hi)
        for i in sorted(ops):  # one frame on the device at a time: frames can be hundreds of MB
            x = self.contribution(i)
            for s, sign in ops[i]:
                self._sum[s].add_(x, alpha=sign)
        self._pending.clear()

    def slots(self) -> list[Slot]:
        return [Slot(self.kind, tuple(self._ids[lo:hi]), "summary")
                for lo, hi in uniform_groups(len(self._ids), self.num_slots) if hi > lo]

    def kv(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        self._sync()
        dtype = self.geometry.dtype
        out = []
        for s, (lo, hi) in enumerate(self._ranges):
            if hi > lo:
                mean = self._sum[s, layer] / (hi - lo)  # [2, T, H, D] float32
                k = self.finish_key(mean[0][None], tuple(self._ids[lo:hi]))
                out.append((k.to(dtype), mean[1][None].to(dtype)))
        return out

    def host_bytes(self) -> int:
        """Bytes of evicted frames held in host RAM or, with ``spill_dir``, on disk."""
        return self._host_bytes

    def state_dict(self) -> dict:
        """Evicted ids [M]; ``store``: per frame a host tensor [L, 2, T, H, D] or, with a spill folder,
        its file name (``spill_folder`` names the folder); float32 ``sum`` [N_s, L, 2, T, H, D] with
        the group ``ranges`` it holds and the incremental ``updates`` per slot (bit-exact restore)."""
        spill = self._dir is not None
        for copy in self._copies.values():  # the host store is read on the host: every copy landed
            copy.synchronize()
        self._copies.clear()
        return {"ids": list(self._ids), "spill_folder": str(self._dir) if spill else None,
                "store": [p.name if spill else p for p in self._store], "host_bytes": self._host_bytes,
                "sum": self._sum, "ranges": [[lo, hi] for lo, hi in self._ranges], "updates": list(self._updates)}

    def load_state_dict(self, state: dict) -> None:
        """Raises InputError: the state was saved with ``--spill-dir`` and this writer has none, or
        the reverse, or a saved frame file is missing; OutputError: the spill folder is not writable."""
        if (state["spill_folder"] is None) != (self._dir is None):
            raise InputError("resume state: saved " + ("without" if state["spill_folder"] is None else "with")
                             + " --spill-dir; resume with the same --spill-dir setting")
        self._ids = [int(f) for f in state["ids"]]
        if self._dir is None:
            self._store = [self._arena.copy(t) for t in state["store"]]  # the arena reset() made
        else:
            self._store = [self._adopt(Path(state["spill_folder"]) / name) for name in state["store"]]
        self._host_bytes = int(state["host_bytes"])
        self._sum = state["sum"].to(self._device, dtype=torch.float32, copy=True)
        self._ranges = [(int(lo), int(hi)) for lo, hi in state["ranges"]]
        self._updates = [int(u) for u in state["updates"]]
        self._pending, self._copies = {}, {}

    def _adopt(self, src: Path) -> Path:
        """Hard-link a saved frame file into this writer's spill folder (copy across file systems)."""
        dst = self._dir / src.name
        if not src.is_file():
            raise InputError(f"resume state: spilled frame {src} is missing (was the --spill-dir folder removed?)")
        try:
            try:
                os.link(src, dst)
            except OSError:  # another file system (a different --spill-dir): copy instead
                shutil.copyfile(src, dst)
        except OSError as err:
            raise OutputError(f"--spill-dir {self.spill_dir}: cannot restore {src.name}: {err.strerror or err}") from err
        return dst

    def describe(self) -> dict:
        return {"field": {"groups": "uniform contiguous", "keys": "canonical mean",
                          "store": "disk" if self.spill_dir else "host", "refresh_every": REFRESH_EVERY}}


@register
class FieldWriter(RecentWindowWriter):
    """WorldTrace Field (recompute writer): N_r recent frames + N_s canonical group means, slot-rank positions."""

    name = "field"
    default_positions = "slot_rank"

    def make_components(self) -> list[SummaryMemory]:
        return [FieldSummary(self.n_summary, self.settings.spill_dir)]
