"""WorldTrace's KV-cache memory as a library: any writer, driven from your own chunk loop, no backbone.

A :class:`KVMemory` wraps one writer of the registry (:func:`worldtrace_cli.memory.build_writer`, the
``--cache`` specs of docs/memory.md) with its :class:`~worldtrace_cli.memory.CacheGeometry`, and drives
it through the cache contract exactly as the product's chunk loop does
(:func:`worldtrace_cli.engine.rollout.begin_chunk`, :meth:`~worldtrace_cli.engine.rollout.ChunkRollout.step`;
docs/architecture.md §1-2): per chunk :meth:`KVMemory.begin_chunk`, then :meth:`KVMemory.read` of each
layer (canonical keys, values and the slots' virtual positions), then, once the chunk is final,
:meth:`KVMemory.commit` of every layer's canonical K/V.

*Canonical* keys are keys without their temporal RoPE (spatial RoPE, if the model has any, applied):
the memory stores them so, and :class:`TemporalRope` rotates them to whatever virtual position the
writer's position scheme gives each slot (offsets in latent frames from the chunk's first frame:
the newest past frame of a sliding window is at -1, the current chunk at 0..F-1). Wan's RoPE splits a
head dim of 128 into 44 temporal channels (22 interleaved pairs), 42 height and 42 width channels
(:func:`worldtrace_cli.model.rope.axis_channels`); :meth:`TemporalRope.wan` is that temporal part.

The user-facing page is docs/diffusers.md, "Use the memory in your own loop".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import InputError
from ..memory import CacheGeometry, CacheWriter, MemoryConfig, Slot, build_writer
from ..model.rope import ROPE_THETA, axis_channels, frequencies, rotate_channels

MEMORY_STATE_FORMAT = "worldtrace-kv-memory/1"


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


class TemporalRope:
    """The temporal part of a 3-axis video RoPE (Wan 2.1's; MG2 spec §6.1): the first ``channels``
    channels of each head rotate as interleaved pairs ``(2p, 2p+1)`` by ``omega_p * position``; the
    other (spatial) channels are left as they are.

    Angles are computed in float64 on the CPU (any position, so no table limits the horizon: diffusers'
    ``WanRotaryPosEmbed`` stops at its ``rope_max_seq_len`` rows, 1024), then cos/sin are rounded to
    ``precision`` and the rotation runs in that dtype, as diffusers' float32 tables and worldtrace's
    ``--rope-precision float32`` do (:class:`worldtrace_cli.model.rope.MainRope`).

    Args:
        omega: float [channels/2] angular frequencies, radians per latent frame (any float dtype;
            kept as float64).
        precision: torch.float32 (default) or torch.float64.
    Raises:
        ValueError: ``omega`` not a non-empty 1-D tensor of finite values, or another precision.
    """

    def __init__(self, omega: torch.Tensor, precision: torch.dtype = torch.float32):
        omega = torch.as_tensor(omega)
        if omega.dim() != 1 or omega.numel() == 0 or not torch.isfinite(omega).all():
            raise ValueError(f"omega: expected a non-empty 1-D tensor of finite frequencies, got shape "
                             f"{list(omega.shape)}")
        if precision not in (torch.float32, torch.float64):
            raise ValueError(f"precision: must be torch.float32 or torch.float64, got {precision}")
        self.omega = omega.detach().to("cpu", torch.float64)
        self.channels = 2 * self.omega.numel()
        self.precision = precision

    @classmethod
    def wan(cls, head_dim: int = 128, theta: float = ROPE_THETA, precision: torch.dtype = torch.float32
            ) -> "TemporalRope":
        """Wan's temporal RoPE for ``head_dim``: ``head_dim - 4 * (head_dim // 6)`` channels (44 of 128),
        ``omega_j = theta ** (-2j / channels)`` (the official Wan ``rope_params``; diffusers'
        ``WanRotaryPosEmbed``; :func:`worldtrace_cli.model.rope.frequencies`).

        Raises:
            ValueError: ``head_dim`` < 6 or odd, ``theta`` not > 1.
        """
        _positive_int("head_dim", head_dim, 6)
        if head_dim % 2:
            raise ValueError(f"head_dim: must be even (channel pairs), got {head_dim}")
        if not theta > 1:
            raise ValueError(f"theta: must be > 1, got {theta!r}")
        return cls(frequencies(axis_channels(head_dim)[0], float(theta)), precision)

    @classmethod
    def from_table(cls, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor, channels: int,
                   theta: float = ROPE_THETA) -> "TemporalRope":
        """The temporal RoPE behind a table of the diffusers layout (``WanRotaryPosEmbed.freqs_cos`` /
        ``freqs_sin``: [rows, head_dim], row = position, each pair's value repeated on its two channels,
        the first ``channels`` columns temporal), computed analytically: ``omega_j = theta ** (-2j /
        channels)``, checked against every row of the table (to 1e-5), at the table's dtype.

        Raises:
            ValueError: a table of another layout, or one these frequencies do not reproduce (another
                ``theta``: pass the model's).
        """
        _positive_int("channels", channels, 2)
        if freqs_cos.dim() != 2 or freqs_cos.shape != freqs_sin.shape or freqs_cos.shape[1] < channels:
            raise ValueError(f"freqs_cos/freqs_sin: expected two [rows, >= {channels}] tables, got "
                             f"{list(freqs_cos.shape)} and {list(freqs_sin.shape)}")
        rope = cls(frequencies(channels, float(theta)),
                   torch.float64 if freqs_cos.dtype == torch.float64 else torch.float32)
        rows = torch.arange(freqs_cos.shape[0], dtype=torch.float64)
        ang = torch.outer(rows, rope.omega).repeat_interleave(2, dim=1)
        worst = max((ang.cos() - freqs_cos[:, :channels].double().cpu()).abs().max().item(),
                    (ang.sin() - freqs_sin[:, :channels].double().cpu()).abs().max().item())
        if worst > 1e-5:
            raise ValueError(f"rope_theta {theta!r}: the model's RoPE table is not theta ** (-2j / {channels}) "
                             f"(off by {worst:.2e}); pass the theta it was built with")
        return rope

    def angles(self, positions: torch.Tensor, freq_scale: torch.Tensor | None = None, device=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [N, channels/2] in :attr:`precision` on ``device`` for temporal ``positions`` [N]
        (latent frames, any real value; float64 arithmetic on the CPU). ``freq_scale`` [channels/2]
        multiplies the frequencies (YaRN: ``CacheWriter.temporal_frequency_scale``)."""
        omega = self.omega if freq_scale is None else self.omega * freq_scale.to("cpu", torch.float64)
        ang = torch.outer(torch.as_tensor(positions).to("cpu", torch.float64).reshape(-1), omega)
        return ang.cos().to(device, self.precision), ang.sin().to(device, self.precision)

    def rotate(self, keys: torch.Tensor, positions: torch.Tensor | None, freq_scale: torch.Tensor | None = None,
               angles: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``keys`` [B, N, H, D] with the first :attr:`channels` channels of every head rotated to the
        per-token temporal ``positions`` [N] (latent frames); the other channels unchanged; result in
        ``keys.dtype`` (a new tensor). ``angles``: :meth:`angles` of these positions, computed once and
        reused (``positions`` is then not read).

        Raises:
            ValueError: ``positions`` (or ``angles``) not of length N, or D < :attr:`channels`.
        """
        if keys.dim() != 4 or keys.shape[-1] < self.channels:
            raise ValueError(f"keys: expected [B, N, H, D >= {self.channels}], got {list(keys.shape)}")
        cos, sin = angles if angles is not None else self.angles(positions, freq_scale, keys.device)
        if cos.shape[0] != keys.shape[1]:
            raise ValueError(f"positions: {cos.shape[0]} for {keys.shape[1]} key tokens")
        rotated = rotate_channels(keys[..., :self.channels], cos, sin)
        return torch.cat([rotated, keys[..., self.channels:]], dim=-1)


@dataclass(frozen=True)
class PastKV:
    """One layer's past slots as read this chunk.

    Attributes:
        keys: canonical keys [1, N, H, D] (temporal RoPE not applied), in the memory's dtype and device.
        values: values [1, N, H, D].
        positions: float64 [S] each slot's virtual temporal position, latent frames from the chunk's first.
        token_positions: float64 [N] each key token's position (its slot's).
        counts: None (every slot one latent frame of ``tokens_per_frame`` tokens) or int64 [S] the
            tokens of each slot in this layer (store-time compressed retrieval slots).
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    token_positions: torch.Tensor
    counts: torch.Tensor | None = None

    def rotated(self, rope: TemporalRope, freq_scale: torch.Tensor | None = None) -> torch.Tensor:
        """The keys as attention reads them: [1, N, H, D], each token rotated to its slot's position
        (:meth:`TemporalRope.rotate`)."""
        return rope.rotate(self.keys, self.token_positions, freq_scale)


class KVMemory:
    """One WorldTrace writer with its geometry, for a chunked causal attention loop of your own.

    Args:
        cache: the writer spec, as ``--cache`` takes it (``sliding``, ``sink``, ``full``, ``field``,
            ``landmark``, ``mixed:2``, ``memrope``...: :func:`worldtrace_cli.memory.example_specs`).
        layers: self-attention layers; heads: heads per layer; head_dim: channels per head.
        tokens_per_frame: key tokens of one latent frame (a Wan 2.1 latent of h x w: (h/2) * (w/2)).
        frames_per_chunk: F, latent frames per chunk (3 for Self-Forcing and MG2).
        window: latent frames the model was trained to attend over, current chunk included
            (MG2 6, Self-Forcing 21): the default budget is ``window - F`` and WorldTrace writers default to
            N_s + N_r = window slots (docs/memory.md). Default ``2 * F``.
        budget, summary_slots, recent_slots, positions: the shared memory settings (``--budget``,
            ``--summary-slots``, ``--recent-slots``, ``--positions``); None = the writer's default.
        device, dtype: where and how the writer keeps K/V (the model's).
        **options: the writer's own settings by field name (``sink_frames=3``, ``landmark_threshold=0.2``).
    Raises:
        ValueError: a size that is not a positive integer (named), ``window <= frames_per_chunk``.
        InputError: an unknown writer or scheme, a setting the writer does not read, sizes the window
            cannot hold (the writer registry's one-line messages, naming the flag).
    """

    def __init__(self, cache: str = "sliding", *, layers: int, heads: int, head_dim: int, tokens_per_frame: int,
                 frames_per_chunk: int = 3, window: int | None = None, budget: int | None = None,
                 summary_slots: int | None = None, recent_slots: int | None = None, positions: str | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, **options):
        for name, value in (("layers", layers), ("heads", heads), ("head_dim", head_dim),
                            ("tokens_per_frame", tokens_per_frame), ("frames_per_chunk", frames_per_chunk)):
            _positive_int(name, value)
        window = 2 * frames_per_chunk if window is None else _positive_int("window", window)
        if window <= frames_per_chunk:
            raise ValueError(f"window: {window} latent frames must exceed frames_per_chunk ({frames_per_chunk})")
        if not isinstance(cache, str) or not cache:
            raise InputError(f"cache: expected a writer spec such as 'landmark', got {cache!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype: expected a floating torch.dtype, got {dtype!r}")
        self.config = MemoryConfig.of(cache, positions=positions, budget=budget, summary_slots=summary_slots,
                                      recent_slots=recent_slots, **options)
        self.window, self.frames_per_chunk = window, frames_per_chunk
        self.writer: CacheWriter = build_writer(self.config, window - frames_per_chunk, window)
        self.geometry = CacheGeometry(layers, heads, head_dim, tokens_per_frame, frames_per_chunk, window - 1,
                                      torch.device(device), dtype)
        self.reset()

    # ------------------------------------------------------------------ the chunk loop
    def reset(self) -> None:
        """Empty the memory: a new video (the writer's ``reset(geometry)``)."""
        self.writer.reset(self.geometry)
        self.writer.set_poses(None)
        self.next_frame = 0  # the first latent frame of the next chunk
        self.chunks = 0  # chunks committed
        self._begun: int | None = None

    @property
    def frame_start(self) -> int | None:
        """The first latent frame of the chunk begun (None between a commit and the next begin)."""
        return self._begun

    def begin_chunk(self, frame_start: int | None = None) -> list[Slot]:
        """Start a chunk (before any of its attention calls): the writer chooses the slots it reads.

        Args:
            frame_start: the chunk's first latent frame (absolute index); default :attr:`next_frame`
                (the frame after the last committed one).
        Returns:
            the slots read this chunk, oldest first (:class:`~worldtrace_cli.memory.Slot`: kind,
            source frames, role), the same for every layer.
        Raises:
            ValueError: a negative or non-integer ``frame_start``.
        """
        start = self.next_frame if frame_start is None else _positive_int("frame_start", frame_start, 0)
        self.writer.begin_chunk(start)
        self._begun = start
        self.slots = self.writer.slots()
        self.positions = self.writer.positions()
        return self.slots

    def _need_chunk(self, what: str) -> None:
        if self._begun is None:
            raise RuntimeError(f"KVMemory.{what}: call begin_chunk() first (once per chunk, before its reads)")

    def freq_scale(self) -> torch.Tensor | None:
        """The writer's temporal frequency multipliers for this chunk (float64 [t_ch/2], YaRN), or None:
        apply them to the chunk's queries and current keys too (:meth:`TemporalRope.rotate`)."""
        self._need_chunk("freq_scale")
        return self.writer.temporal_frequency_scale()

    def read(self, layer: int) -> PastKV:
        """Layer ``layer``'s past slots this chunk (:class:`PastKV`: canonical keys, values [1, N, H, D],
        slot and token positions). Valid until the next :meth:`commit`.

        Raises:
            ValueError: a layer outside ``[0, layers)``. RuntimeError: no chunk begun.
        """
        self._need_chunk("read")
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.geometry.num_layers:
            raise ValueError(f"layer: expected 0 <= layer < {self.geometry.num_layers}, got {layer!r}")
        k, v, positions = self.writer.read(layer)
        counts = self.writer.token_counts(layer)
        reps = counts if counts is not None else self.geometry.tokens_per_frame
        return PastKV(k, v, positions, positions.repeat_interleave(reps, 0), counts)

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]],
               frame_ids: Sequence[int] | None = None) -> None:
        """Store the finished chunk: every layer's canonical keys and values (the writer copies them).

        Args:
            layers_kv: one ``(keys, values)`` per layer, each [1, F*T, H, D] (T = tokens_per_frame; cast
                to the memory's dtype and device), tokens in frame-major order.
            frame_ids: the chunk's F absolute latent frames; default ``frame_start .. frame_start + F - 1``.
        Raises:
            ValueError: another number of layers or shape (named), or ``frame_ids`` not F frames.
            RuntimeError: no chunk begun.
        """
        self._need_chunk("commit")
        g = self.geometry
        if len(layers_kv) != g.num_layers:
            raise ValueError(f"layers_kv: {len(layers_kv)} layers, the memory has {g.num_layers}")
        want = (1, g.frames_per_chunk * g.tokens_per_frame, g.heads, g.head_dim)
        kv = []
        for i, (k, v) in enumerate(layers_kv):
            if tuple(k.shape) != want or tuple(v.shape) != want:
                raise ValueError(f"layers_kv[{i}]: keys {list(k.shape)} / values {list(v.shape)}, expected "
                                 f"{list(want)} ([1, frames_per_chunk * tokens_per_frame, heads, head_dim])")
            kv.append((k.to(g.device, g.dtype), v.to(g.device, g.dtype)))
        ids = list(range(self._begun, self._begun + g.frames_per_chunk)) if frame_ids is None else list(frame_ids)
        if len(ids) != g.frames_per_chunk:
            raise ValueError(f"frame_ids: {len(ids)} frames, a chunk has frames_per_chunk = {g.frames_per_chunk}")
        self.writer.commit(kv, ids)
        self.next_frame, self.chunks, self._begun = max(ids) + 1, self.chunks + 1, None

    # ------------------------------------------------------------------ state and records
    def state_dict(self) -> dict:
        """The memory as plain data: dicts, lists, scalars and the writer's live tensors (no copies;
        save before the next :meth:`commit`): ``torch.save`` / ``torch.load(weights_only=True)`` or
        :func:`worldtrace_cli.runs.state.save_state` write it. Holds the writer's ``state_dict`` and the
        chunk counters, never the settings (rebuild the memory with the same ones)."""
        return {"format": MEMORY_STATE_FORMAT, "cache": self.config.cache, "next_frame": self.next_frame,
                "chunks": self.chunks, "writer": self.writer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` into this memory (built with the same settings): it then reads
        and commits bit-identically to the one saved (docs/memory.md, "Resume: the state contract").
        Tensors are copied, so the source may go on.

        Raises:
            InputError: a state of another format or writer (or the writer's own refusal: budget, heads).
        """
        if not isinstance(state, dict) or state.get("format") != MEMORY_STATE_FORMAT:
            raise InputError(f"memory state: not a {MEMORY_STATE_FORMAT} state (KVMemory.state_dict)")
        if state.get("cache") != self.config.cache:
            raise InputError(f"memory state: saved with cache {state.get('cache')!r}, this memory is "
                             f"{self.config.cache!r}")
        self.writer.reset(self.geometry)
        self.writer.load_state_dict(state["writer"])
        self.next_frame, self.chunks, self._begun = int(state["next_frame"]), int(state["chunks"]), None

    def kv_bytes(self) -> int:
        """Bytes of K+V the chunk begun reads, all layers (the writer's ``kv_bytes``)."""
        self._need_chunk("kv_bytes")
        return self.writer.kv_bytes()

    def describe(self) -> dict:
        """The writer's resolved settings (cache, positions, budget, slot counts...)."""
        return self.writer.describe()

    def events(self) -> list[dict]:
        """The writer's events since the last call (landmark tests, retrievals), as chunks.jsonl has them."""
        return self.writer.events()


def build_memory(cache: str = "sliding", **sizes) -> KVMemory:
    """``KVMemory(cache, **sizes)``: a writer from its ``--cache`` spec and the model's sizes
    (``layers``, ``heads``, ``head_dim``, ``tokens_per_frame``, ``frames_per_chunk``, ``window`` /
    ``budget``...). Errors: as :class:`KVMemory`."""
    return KVMemory(cache, **sizes)


__all__ = ["KVMemory", "MEMORY_STATE_FORMAT", "PastKV", "TemporalRope", "build_memory"]
