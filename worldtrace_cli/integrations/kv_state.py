"""The diffusers hook's settings and state: :class:`WorldTraceKVCacheConfig`, :class:`WorldTraceKVState`.

No diffusers import here: the hooks themselves are :mod:`worldtrace_cli.integrations.diffusers`. The state
follows one chunk at a time as the product's chunk loop does (docs/architecture.md §1): the first
transformer call after a commit begins a chunk (the writer picks its slots, :meth:`KVMemory.begin_chunk`);
every call of the chunk (denoising steps, the context pass) reads the same past, each layer rotated to
its slots' virtual positions once per chunk; the call made inside ``commit_chunk(transformer)`` hands every
layer's canonical K/V to the writer after it returns.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from ..errors import InputError
from ..memory import MemoryConfig
from ..model.attention_stats import AttentionProbe
from ..model.rope import ROPE_THETA
from ..writer_options import check_flags
from .memory import KVMemory, TemporalRope

STATE_FORMAT = "worldtrace-diffusers-kv/1"


@dataclass(frozen=True)
class WorldTraceKVCacheConfig:
    """What :func:`~worldtrace_cli.integrations.diffusers.apply_worldtrace_kv_cache` attaches.

    Attributes:
        cache: the writer spec (``--cache``: ``sliding``, ``sink``, ``full``, ``field``, ``landmark``,
            ``mixed:2``, ``memrope``, ``yarn``...; docs/memory.md). Pose-retrieval writers (``worldkv``,
            ``retrieval``) need camera poses, which a diffusers call does not carry: refused.
        frames_per_chunk: F, latent frames of every transformer call (3: Self-Forcing, CausVid).
        window: latent frames the model attends over, current chunk included (21 for Self-Forcing's
            global cache and Wan 2.1's 81-frame clips): sizes the writers' defaults (budget
            ``window - F``; WorldTrace writers N_s + N_r = window) and the trained offset ``window - 1``.
        budget, summary_slots, recent_slots, positions: the shared memory settings; None = the
            writer's default.
        options: the writer's own settings by field name (``{"sink_frames": 3}``).
        attention_stats: measure, on every call that does not commit, each cache slot's share of the
            self-attention (exact softmax mass, :mod:`worldtrace_cli.model.attention_stats`); the last
            call's is :attr:`WorldTraceKVState.attention`. Costs one extra pass over q and the keys.
        attention_queries: measure a seeded sample of that many query tokens per layer (0: all).
        rope_theta: the RoPE base of the transformer (Wan: 10000), checked against its table.
        official_timesteps: also compute the timestep sinusoid in float64, as the original Wan and
            Self-Forcing code (and worldtrace) do, instead of diffusers' float32 ``Timesteps`` (a hook on
            ``condition_embedder.timesteps_proj``, removed with the cache). With it a Self-Forcing rollout
            equals worldtrace's bit for bit; without, diffusers' own rounding moves a flow at t = 1000
            by up to 2.6e-5 (tiny model; docs/diffusers.md).
    Raises:
        ValueError: a field of the wrong type or range (named).
        InputError: an unknown writer, a setting it does not read, sizes the window cannot hold.
    """

    cache: str = "sliding"
    frames_per_chunk: int = 3
    window: int = 21
    budget: int | None = None
    summary_slots: int | None = None
    recent_slots: int | None = None
    positions: str | None = None
    options: dict = field(default_factory=dict)
    attention_stats: bool = False
    attention_queries: int = 0
    rope_theta: float = ROPE_THETA
    official_timesteps: bool = False

    def __post_init__(self):
        for name in ("frames_per_chunk", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WorldTraceKVCacheConfig.{name}: expected an integer >= 1, got {value!r}")
        if self.window <= self.frames_per_chunk:
            raise ValueError(f"WorldTraceKVCacheConfig.window: {self.window} latent frames must exceed "
                             f"frames_per_chunk ({self.frames_per_chunk})")
        if not isinstance(self.cache, str) or not self.cache:
            raise ValueError(f"WorldTraceKVCacheConfig.cache: expected a writer spec such as 'landmark', got "
                             f"{self.cache!r}")
        if not isinstance(self.options, dict):
            raise ValueError(f"WorldTraceKVCacheConfig.options: expected a dict of writer settings, got "
                             f"{type(self.options).__name__}")
        for name in ("attention_stats", "official_timesteps"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"WorldTraceKVCacheConfig.{name}: expected a bool, got {getattr(self, name)!r}")
        q = self.attention_queries
        if isinstance(q, bool) or not isinstance(q, int) or q < 0:
            raise ValueError(f"WorldTraceKVCacheConfig.attention_queries: expected an integer >= 0, got {q!r}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 1:
            raise ValueError(f"WorldTraceKVCacheConfig.rope_theta: expected a number > 1, got {self.rope_theta!r}")
        memory = self.memory_config()
        check_flags(memory)  # the writer registry's one-line refusals, before any model is touched
        from ..writer_options import WRITER_OPTIONS

        if WRITER_OPTIONS[memory.writer_name].needs_poses:
            raise InputError(f"WorldTraceKVCacheConfig.cache: {self.cache!r} retrieves by camera pose; a diffusers "
                             f"transformer call carries none")

    def memory_config(self) -> MemoryConfig:
        """The :class:`~worldtrace_cli.memory.MemoryConfig` of these settings."""
        return MemoryConfig.of(self.cache, positions=self.positions, budget=self.budget,
                               summary_slots=self.summary_slots, recent_slots=self.recent_slots, **self.options)

    def to_dict(self) -> dict:
        """Plain data (for a state's identity check and records)."""
        return asdict(self)


class WorldTraceKVState:
    """The KV-cache memory one transformer's hooks share (owned by its hooks; nothing global).

    Attributes:
        config: the :class:`WorldTraceKVCacheConfig`.
        memory: the :class:`~worldtrace_cli.integrations.memory.KVMemory` (built at the first call, when
            the latent grid gives the tokens per frame), or None before it.
        rope: the transformer's temporal RoPE (:class:`TemporalRope`, its frequencies analytically).
        chunks: chunks committed so far; frame_start: the first latent frame of the chunk being read
            (None between a commit and the next call).
        slots, positions: the slots the current (or last) chunk read and their float64 [S] offsets.
        attention: float64 [layers, S + 1]: per layer each slot's share of the last measured call's
            self-attention, then the chunk's own (rows sum to 1); None without ``attention_stats``.
        attention_chunk: the chunk that call belonged to.
        events: the writer's events of the last commit (landmark tests, ...: as chunks.jsonl has them).
    """

    def __init__(self, config: WorldTraceKVCacheConfig, num_layers: int, heads: int, head_dim: int,
                 rope: TemporalRope, weight: torch.Tensor):
        self.config, self.num_layers, self.heads, self.head_dim, self.rope = config, num_layers, heads, head_dim, rope
        self._weight = weight  # a key projection's weight: the model's device and dtype
        self.reset()

    # ------------------------------------------------------------------ public
    def reset(self) -> None:
        """Forget everything: the next call starts a new video at latent frame 0."""
        self.memory: KVMemory | None = None
        self.chunks, self.frame_start = 0, None
        self.slots, self.positions = [], torch.zeros(0, dtype=torch.float64)
        self.attention, self.attention_chunk = None, None
        self.freq_scale, self.events = None, []
        self._commit_depth, self._call = 0, None
        self._past: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._angles: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def next_frame(self) -> int:
        """The first latent frame of the next chunk (frames committed so far)."""
        return 0 if self.memory is None else self.memory.next_frame

    def slot_attention(self) -> list[dict]:
        """Each slot of the last measured call with its share of attention (mean over layers):
        ``{"kind", "role", "frames", "position", "share"}``, then ``{"kind": "current", "share"}``.

        Raises:
            RuntimeError: nothing measured (``attention_stats`` off, or no call yet)."""
        if self.attention is None:
            raise RuntimeError("no attention measured: WorldTraceKVCacheConfig(attention_stats=True), then a call")
        mean = self.attention.mean(0).tolist()
        rows = [{"kind": s.kind, "role": s.role, "frames": list(s.frames), "position": float(p), "share": m}
                for s, p, m in zip(self.slots, self.positions.tolist(), mean)]
        return rows + [{"kind": "current", "share": mean[-1]}]

    def state_dict(self) -> dict:
        """Plain data and the writer's live tensors (save before the next commit): the memory's
        :meth:`~worldtrace_cli.integrations.memory.KVMemory.state_dict`, the tokens per frame and the
        settings it was made with. ``torch.save`` / ``torch.load(weights_only=True)`` round-trip it."""
        return {"format": STATE_FORMAT, "config": self.config.to_dict(),
                "tokens_per_frame": None if self.memory is None else self.memory.geometry.tokens_per_frame,
                "memory": None if self.memory is None else self.memory.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (a transformer with the same hook settings): the next call continues
        the saved video exactly (bit-identical reads and commits).

        Raises:
            InputError: another format, other settings, or a memory state the writer refuses."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InputError(f"KV state: not a {STATE_FORMAT} state (get_worldtrace_kv_state(t).state_dict())")
        if state.get("config") != self.config.to_dict():
            raise InputError(f"KV state: saved with settings {state.get('config')}, this hook has {self.config.to_dict()}")
        self.reset()
        if state.get("memory") is not None:
            self._build_memory(int(state["tokens_per_frame"]), self._weight.device)
            self.memory.load_state_dict(state["memory"])
            self.chunks = self.memory.chunks

    # ------------------------------------------------------------------ driven by the hooks
    def _build_memory(self, tokens_per_frame: int, device) -> None:
        c = self.config
        self.memory = KVMemory(c.cache, layers=self.num_layers, heads=self.heads, head_dim=self.head_dim,
                               tokens_per_frame=tokens_per_frame, frames_per_chunk=c.frames_per_chunk,
                               window=c.window, budget=c.budget, summary_slots=c.summary_slots,
                               recent_slots=c.recent_slots, positions=c.positions, device=device,
                               dtype=self._weight.dtype, **c.options)

    def begin_call(self, frames: int, tokens_per_frame: int, batch: int, device) -> None:
        """A transformer call on ``frames`` latent frames of ``tokens_per_frame`` tokens each: begin the
        chunk if it is the first call since a commit; start the call's attention probe.

        Raises:
            ValueError: another frame count than ``frames_per_chunk``, another grid than the memory's,
                a committing call of batch > 1."""
        c = self.config
        self._call = None
        if frames != c.frames_per_chunk:
            raise ValueError(f"hidden_states holds {frames} latent frames; WorldTraceKVCacheConfig.frames_per_chunk "
                             f"is {c.frames_per_chunk} (one chunk per call)")
        if self.memory is None:
            self._build_memory(tokens_per_frame, device)
        elif tokens_per_frame != self.memory.geometry.tokens_per_frame:
            raise ValueError(f"hidden_states has {tokens_per_frame} tokens per latent frame; this video's cache "
                             f"holds {self.memory.geometry.tokens_per_frame} (reset() for another size)")
        commit = self._commit_depth > 0
        if commit and batch != 1:
            raise ValueError(f"a committing call has batch {batch}: the cache holds one video (batch 1)")
        if self.memory.frame_start is None:
            self.slots = self.memory.begin_chunk()
            self.positions, self.frame_start = self.memory.positions, self.memory.frame_start
            self.freq_scale = self.memory.freq_scale()
            self._past, self._angles = {}, {}
        probe = None
        if c.attention_stats and not commit:
            probe = AttentionProbe(self.memory.writer.slot_tokens(), c.attention_queries, 0, self.chunks)
        self._call = {"commit": commit, "probe": probe, "kv": {}}

    def past(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s past keys rotated to their slots' positions and its values, [1, N, H, D]
        in ``dtype``, read from the writer and rotated once per chunk (every call of the chunk reuses it)."""
        if layer not in self._past:
            p = self.memory.read(layer)
            k = p.keys.to(dtype)
            if k.shape[1]:
                n = k.shape[1]
                key = n if p.counts is None else None  # every layer reads the same slots: one table per chunk
                angles = self._angles.get(key) if key is not None else None
                if angles is None:
                    angles = self.rope.angles(p.token_positions, self.freq_scale, k.device)
                    if key is not None:
                        self._angles[key] = angles
                k = self.rope.rotate(k, None, angles=angles)
            self._past[layer] = (k, p.values.to(dtype))
        return self._past[layer]

    def current_angles(self, tokens: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [tokens, channels/2] of the current chunk's frames 0..F-1 at YaRN-scaled frequencies
        (only for a writer with :meth:`~worldtrace_cli.memory.CacheWriter.temporal_frequency_scale`)."""
        key = -tokens
        if key not in self._angles:
            f = self.config.frames_per_chunk
            pos = torch.arange(f, dtype=torch.float64).repeat_interleave(tokens // f)
            self._angles[key] = self.rope.angles(pos, self.freq_scale, device)
        return self._angles[key]

    def observe(self, layer: int, q, k_canon, v, keys) -> None:
        """One layer's call: keep its canonical K/V when the call commits; measure its attention."""
        call = self._call
        if call is None:
            raise RuntimeError("a hooked attn1 ran outside a hooked transformer call (call the transformer itself)")
        if call["commit"]:
            call["kv"][layer] = (k_canon, v)
        if call["probe"] is not None:
            call["probe"].observe(layer, q, keys, None, q.shape[1])

    def end_call(self) -> None:
        """After the transformer call returned: commit the chunk (inside ``commit_chunk``), keep the
        attention shares."""
        call, self._call = self._call, None
        if call is None:
            return
        if call["probe"] is not None:
            self.attention, self.attention_chunk = call["probe"].shares(), self.chunks
        if call["commit"]:
            missing = [i for i in range(self.num_layers) if i not in call["kv"]]
            if missing:
                raise RuntimeError(f"commit: layers {missing} did not run their hooked attn1")
            self.memory.commit([call["kv"][i] for i in range(self.num_layers)])
            self.chunks, self.frame_start = self.memory.chunks, None
            self.events = self.memory.events()  # drained each chunk, so they never pile up
            self._past, self._angles = {}, {}


__all__ = ["STATE_FORMAT", "WorldTraceKVCacheConfig", "WorldTraceKVState"]
