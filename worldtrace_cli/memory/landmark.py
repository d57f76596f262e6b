"""``landmark``: WorldTrace-Landmark (paper §3.4), N_r recent frames + N_s frozen scene-entry frames.

**Selection.** Every latent frame leaving the recent window is tested against the previous one that
left it: if the cosine distance of their *descriptors* exceeds tau (``--landmark-threshold``,
:attr:`~worldtrace_cli.writer_options.LandmarkOptions.landmark_threshold`) the frame is a scene entry and becomes a landmark. The
first frame ever evicted (latent frame 0, the conditioning image's frame) is always the first
landmark. The newest N_s landmarks are kept (oldest evicted first). While fewer than N_s exist, the
paper fills the empty slots with the oldest landmark (§3.4, Algorithm 1: ``--landmark-padding
repeat``); by default only the landmarks held are read (``none``). Why: the oldest landmark is latent
frame 0, and repeated it is read up to four times at slot-rank positions -6 .. -3, offsets of 6 to 8
latent frames from the chunk's queries where the model was trained to 5. On loopworld those copies
took 0.54 of chunk 1's attention (sliding gives frame 0 0.06, at -3), chunk 1 came out grey with
horizontal stripes one token row apart, and the detector froze those frames as the next landmarks,
so the stripes lasted the run (world 8, look_back: return leg 14.77 dB against sliding's 14.85; read
without padding 15.78 dB, no stripes; docs/memory.md).

**Descriptor.** Per layer, the token mean of the canonical key's *temporal* channels
``[0, t_ch)`` (44 of 128 for MG2's head dim), all heads concatenated: [L, H * t_ch] float32. Why:
in a canonical key the temporal channels carry no rotation at all, so their token mean is a
position-free summary of what the frame shows; the spatial channels are rotated by each token's
(h, w) position and partly cancel in a mean, and a token-by-token comparison would call a camera
pan a scene change. Each layer's descriptor is L2-normalised before the layers are joined, so the
distance is ``1 - mean over layers of cos(d_l(prev), d_l(frame))`` and no layer dominates through a
larger key scale. Cost per evicted frame: one O(T * L * H * t_ch) mean; state: the previous
descriptor only (O(L * H * t_ch)), not a history.

**Frozen keys (Eq. 7).** A landmark's canonical K (and V) is copied once, when it is selected, and
never re-derived from a rotated key: every chunk the model applies one fresh rotation
R(omega * t_s) to the same stored canonical key, so moving a landmark from slot s to s-1 adds no
rounding error (an unrotate/re-rotate chain in bfloat16 drifts; tests/test_landmark.py measures it).

Memory: N_s frames of K/V per layer, constant in rollout length.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.nn.functional as F

from ..model.rope import axis_channels
from .base import CacheGeometry, MemoryConfig, Slot, frames_state, load_frames, register
from .slots import head_sum
from .window import FrameKV, RecentWindowWriter, SummaryMemory

DESCRIPTOR = "per-layer token mean of canonical-key temporal channels [0, t_ch), heads concatenated, " \
             "L2-normalised per layer; distance = 1 - mean over layers of cosine similarity"


def frame_descriptor(frame_kv: FrameKV, t_ch: int, geometry: CacheGeometry | None = None) -> torch.Tensor:
    """Position-free appearance descriptor of one latent frame (see the module docstring).

    Args:
        frame_kv: per layer (canonical k, v), k [1, T, H, D] in any float dtype.
        t_ch: number of temporal RoPE channels (leading channels of D; 44 for D = 128).
        geometry: the writer's geometry; under ``--split-heads`` (``geometry.head_group``) H is this
            process's heads and each row is normalised by the norm over every process's heads.
    Returns:
        float32 [L, H * t_ch], each row unit-norm over all heads (or zero if the layer's mean is zero).
    """
    rows = torch.stack([k[0, :, :, :t_ch].float().mean(dim=0).flatten() for k, _ in frame_kv])
    if geometry is None or geometry.head_group is None:
        return F.normalize(rows, dim=1)
    norms = head_sum(geometry, rows.pow(2).sum(dim=1)).sqrt()
    return rows / norms.clamp_min(1e-12)[:, None]  # F.normalize's eps


def descriptor_distance(a: torch.Tensor, b: torch.Tensor, geometry: CacheGeometry | None = None) -> float:
    """Cosine distance ``1 - mean_l <a_l, b_l>`` of two :func:`frame_descriptor` results, in [0, 2]
    (the dot products summed over every process's heads under ``--split-heads``)."""
    dots = (a * b).sum(dim=1)
    if geometry is not None:
        dots = head_sum(geometry, dots)
    return 1.0 - dots.mean().item()


class LandmarkSummary(SummaryMemory):
    """N_s slots of verbatim scene-entry frames with frozen canonical keys.

    Args:
        n_slots: N_s, landmark slots (0 disables the component).
        config: memory settings; reads ``landmark_threshold`` (tau, a cosine distance in [0, 2]).
    """

    def __init__(self, n_slots: int, config: MemoryConfig):
        self.n_slots = n_slots
        settings = config.settings()
        self.threshold = settings.landmark_threshold
        self.padding = getattr(settings, "landmark_padding", "none")  # "none" | "repeat" (the paper's)

    def reset(self, geometry: CacheGeometry) -> None:
        super().reset(geometry)
        self.t_ch = axis_channels(geometry.head_dim)[0]
        self._ids: deque[int] = deque()
        self._kv: deque[FrameKV] = deque()
        self._prev: torch.Tensor | None = None  # descriptor of the previous evicted frame
        self._events: list[dict] = []

    def evict(self, frame_id: int, frame_kv: FrameKV) -> None:
        """Test a frame leaving the recent window; store it (frozen) if it is a scene entry."""
        if self.n_slots == 0:
            return
        desc = frame_descriptor(frame_kv, self.t_ch, self.geometry)
        distance = None if self._prev is None else descriptor_distance(self._prev, desc, self.geometry)
        self._prev = desc
        is_landmark = distance is None or distance > self.threshold
        self._events.append({"type": "landmark_test", "frame": frame_id,
                             "distance": None if distance is None else round(distance, 6),
                             "landmark": is_landmark})
        if not is_landmark:
            return
        # frame_kv is the recent window's per-frame copy (split_frames), which nothing writes to again:
        # the landmark keeps exactly that frame, its key frozen, so its memory is N_s frames.
        self._ids.append(frame_id)
        self._kv.append(frame_kv)
        if len(self._ids) > self.n_slots:
            self._ids.popleft()
            self._kv.popleft()

    def _padding(self) -> int:
        """Empty slots filled by repeating the oldest landmark: with ``landmark_padding`` ``repeat`` (the
        paper's Algorithm 1) every empty slot once landmarks exist, with ``none`` (the default) 0."""
        if self.padding != "repeat":
            return 0
        return self.n_slots - len(self._ids) if self._ids else 0

    def slots(self) -> list[Slot]:
        """``Slot("landmark", (frame,))`` oldest first (with ``repeat`` padding, the oldest repeated into
        empty slots): at most N_s."""
        ids = list(self._ids)
        ids = ids[:1] * self._padding() + ids
        return [Slot("landmark", (f,), "summary") for f in ids]

    def kv(self, layer: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Stored canonical (k, v) [1, T, H, D] per slot, in :meth:`slots` order (verbatim)."""
        frames = list(self._kv)
        frames = frames[:1] * self._padding() + frames
        return [frame[layer] for frame in frames]

    def state_dict(self) -> dict:
        """Landmark ids [<= N_s] and frames (per layer (k, v) [1, T, H, D], frozen), the detector's
        previous descriptor (float32 [L, H * t_ch], None before the first test) and unread events."""
        return {"ids": list(self._ids), "kv": frames_state(self._kv), "prev": self._prev,
                "events": list(self._events)}

    def load_state_dict(self, state: dict) -> None:
        dev = self.geometry.device
        self._ids = deque(int(f) for f in state["ids"])
        self._kv = deque(load_frames(state["kv"], dev))
        self._prev = None if state["prev"] is None else state["prev"].to(dev, copy=True)
        self._events = [dict(e) for e in state["events"]]

    def stored_bytes(self) -> int:
        """Bytes of the storages this component keeps alive: landmark K/V (all layers) and the
        detector's previous descriptor. Counted per storage, so a view would show what it pins."""
        tensors = [t for frame in self._kv for kv in frame for t in kv]
        if self._prev is not None:
            tensors.append(self._prev)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    def events(self) -> list[dict]:
        """``landmark_test`` events since the last call: frame, detector distance (None for the
        first frame), whether it became a landmark. For chunks.jsonl, so users can tune tau."""
        out, self._events = self._events, []
        return out

    def describe(self) -> dict:
        return {"landmark": {"threshold": self.threshold, "descriptor": DESCRIPTOR, "padding": self.padding}}


@register
class LandmarkWriter(RecentWindowWriter):
    """WorldTrace Landmark: N_r recent + N_s frozen scene-entry frames (cosine distance > tau), slot-rank positions.

    Slots: N_s landmark slots (oldest first) then N_r recent slots, read at slot-rank positions
    (paper Def. 1). Defaults N_s = 4, N_r = 2 for MG2's window (the recall setting).
    """

    name = "landmark"
    default_positions = "slot_rank"

    def make_components(self) -> list[SummaryMemory]:
        return [LandmarkSummary(self.n_summary, self.config)]
