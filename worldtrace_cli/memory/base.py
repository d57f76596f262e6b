"""The cache contract (paper §3; docs/architecture.md §2): what a KV-cache writer keeps and where each slot is read.

A writer holds, for every self-attention layer, up to ``budget`` past *slots*, each one latent
frame of T tokens: canonical keys (spatial RoPE applied, temporal RoPE not) and values. Writers
decide **content** (which frames, averaged or verbatim); position schemes
(:mod:`worldtrace_cli.memory.positions`) decide **where** each slot is read.

Per chunk the rollout calls ``begin_chunk(frame_start)``, then ``read(layer)`` for every layer
(the DiT rotates each slot once and reuses it for all denoising steps and the context pass), then
after the context pass ``commit(layers_kv, frame_ids)`` once with every layer's canonical K/V of
the chunk. Positions are offsets in latent frames from the first frame of the current chunk, so
any horizon works.

Adding a writer: one file in this package with a :class:`CacheWriter` subclass decorated with
:func:`register` (``@register(example="name:arg")`` when its spec needs an argument), and its row
of options and sizes in the torch-free :data:`~worldtrace_cli.writer_options.WRITER_OPTIONS` (what
the CLI checks before torch loads). The package imports every module in it; the contract tests pick the writer up from
:data:`WRITERS` / :func:`example_specs` (docs/memory.md, "Adding a writer").
"""

from __future__ import annotations

from typing import ClassVar, Sequence

import torch

from ..writer_options import MemoryConfig  # noqa: F401  (defined torch-free with the writer rows; re-exported)
from ..writer_options import DEFAULT_WINDOW, check_flags
from .positions import SCHEMES
from .slots import CacheGeometry, Slot  # noqa: F401  (re-exported)

WRITERS: dict[str, type["CacheWriter"]] = {}
EXAMPLES: dict[str, str] = {}  # writer name -> a runnable ``--cache`` spec (``mixed`` -> ``mixed:2``)

STATE_VERSION = 1  # bump when a writer's state_dict layout changes


def register(cls: type["CacheWriter"] | None = None, *, example: str | None = None):
    """Class decorator adding a writer to :data:`WRITERS` under its ``name``.

    Use ``@register`` or ``@register(example="mixed:2")``; ``example`` is a runnable ``--cache`` spec
    (default: the name), which the contract tests, ``bench mechanism`` and the CLI help use. The
    writer's one-line description is the first line of its class docstring.
    """
    def add(c: type["CacheWriter"]) -> type["CacheWriter"]:
        WRITERS[c.name] = c
        EXAMPLES[c.name] = example or c.name
        return c

    return add if cls is None else add(cls)


def example_specs() -> list[str]:
    """One runnable ``--cache`` spec per registered writer, sorted by writer name (e.g. ``mixed:2``)."""
    return [EXAMPLES[name] for name in sorted(WRITERS)]


def descriptions() -> dict[str, str]:
    """Writer name -> one-line description (first docstring line) for CLI help, sorted by name."""
    return {name: (WRITERS[name].__doc__ or "").strip().splitlines()[0] for name in sorted(WRITERS)}


def check_bank_device(name: str) -> torch.device:
    """The ``--bank-device`` as a torch.device: ``cpu`` or ``cuda[:i]`` of a device that exists.

    Raises:
        InputError: another device type, a malformed name, or a CUDA device this machine lacks.
    """
    from ..errors import InputError

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise InputError(f"--bank-device: {name!r} is not a device name (use cpu or cuda[:i])") from None
    if device.type not in ("cpu", "cuda"):
        raise InputError(f"--bank-device: must be cpu or cuda[:i], got {name!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError(f"--bank-device {name}: this machine has no CUDA device")
        if device.index is not None and device.index >= count:
            raise InputError(f"--bank-device {name}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    return device


class CacheWriter:
    """Base class of KV-cache writers. Subclasses set ``name``/``default_positions`` and implement
    :meth:`slots`, :meth:`_read_kv` and :meth:`commit`; state is created in :meth:`reset`, and
    :meth:`state_dict` / :meth:`load_state_dict` save and restore it explicitly.

    The constructor validates the flags against the writer's row in
    :data:`~worldtrace_cli.writer_options.WRITER_OPTIONS` (a writer refuses a flag it would ignore,
    with an InputError naming it); sizes that depend on the model's window are resolved in ``reset``
    (:func:`~worldtrace_cli.writer_options.writer_sizes`).
    """

    name: ClassVar[str] = ""
    default_positions: ClassVar[str] = "actual"
    needs_poses: ClassVar[bool] = False  # True: the rollout must call set_poses (retrieval by camera pose)

    def __init__(self, config: MemoryConfig, default_budget: int, window: int = DEFAULT_WINDOW):
        """Args: config: the memory settings; default_budget: the model's own past slots (window -
        frames per chunk), used when ``--budget`` is not given; window: latent frames the model
        attends over, current chunk included (MG2's ``local_attn_size``; sizes that follow it are
        final at :meth:`reset`). Raises InputError: see :func:`~worldtrace_cli.writer_options.check_flags`."""
        check_flags(config)  # the torch-free checks the CLI ran before the model loaded (writer_options)
        if config.options.get("bank_device") is not None:
            check_bank_device(config.options["bank_device"])
        self.config = config
        self.settings = config.settings()  # the writer's own options (its row's dataclass), resolved once
        self.budget = config.budget if config.budget is not None else default_budget
        self.positions_scheme = config.positions or self.default_positions
        self.frame_start = 0
        self.geometry: CacheGeometry | None = None

    def reset(self, geometry: CacheGeometry) -> None:
        """Empty the cache for a new rollout with the given geometry."""
        self.geometry = geometry
        self.frame_start = 0
        self._positions: torch.Tensor | None = None
        self.frame_poses: torch.Tensor | None = None

    def set_poses(self, poses: torch.Tensor | None) -> None:
        """Give the writer every latent frame's camera pose for this rollout (after :meth:`reset`).

        ``generate`` calls it once, before the first chunk, with the poses of all latent frames it
        will generate (the trajectory is known in advance: for MG2 dead-reckoned from the actions by
        the one motion model, :func:`~worldtrace_cli.world.motion.camera_to_world`; for LingBot its
        camera-to-world poses); a live session (:class:`~worldtrace_cli.session.Session`) calls it
        before every chunk with the poses known so far, a prefix of the same numbers (a writer
        reads only the frames generated and the current chunk's). Writers read ``self.frame_poses[f]`` for latent frame f and never
        derive poses themselves. Not part of :meth:`state_dict` (rebuilt from the trajectory).

        Args:
            poses: float64 [N, 4, 4] camera-to-world matrices, OpenCV axes (x right, y down,
                z forward), one per latent frame, on the CPU; or None (no camera known).
        Raises:
            InputError: ``needs_poses`` and poses is None; ValueError: wrong shape.
        """
        if poses is None:
            if self.needs_poses:
                from ..errors import InputError

                raise InputError(f"--cache {self.config.cache}: this writer retrieves by camera pose and the "
                                 f"model gives none")
            self.frame_poses = None
            return
        if poses.dim() != 3 or poses.shape[1:] != (4, 4):
            raise ValueError(f"set_poses: expected [N, 4, 4] camera-to-world matrices, got {tuple(poses.shape)}")
        self.frame_poses = poses.detach().to("cpu", torch.float64)

    def begin_chunk(self, frame_start: int) -> None:
        """Start a chunk whose first latent frame has absolute index ``frame_start``."""
        self.frame_start = frame_start
        self._positions = None

    def slots(self) -> list[Slot]:
        """The past slots read this chunk, oldest first (same for every layer)."""
        raise NotImplementedError

    def _read_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Canonical K and V of :meth:`slots` for one layer: [1, S*T, H, D] each."""
        raise NotImplementedError

    def commit(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int]) -> None:
        """Store a finished chunk: per layer canonical K and V [1, F*T, H, D]; ``frame_ids`` [F] absolute.

        The tensors are the DiT's own outputs of this call (under CUDA graphs they live in the graph
        pool and are overwritten by the next call): a writer copies what it keeps, per frame
        (:func:`~worldtrace_cli.memory.window.split_frames`), and keeps no view of them.
        """
        raise NotImplementedError

    def rewrite(self, layers_kv: Sequence[tuple[torch.Tensor, torch.Tensor]], frame_ids: Sequence[int],
                summary: bool = False) -> list[int]:
        """Replace the K/V of frames the cache holds verbatim by a re-computation (LongLive's prompt-switch
        re-cache, selfforcing-architecture.md §10.3): per layer canonical K and V [1, F*T, H, D] of the
        absolute frames ``frame_ids`` [F]. Recent slots among them are rewritten; summary slots (sinks)
        only with ``summary`` (LongLive's early switch rewrites its sink); nothing is added or evicted.
        Returns the frame ids rewritten. Default: none (a writer whose slots are not verbatim frames)."""
        return []

    # --- explicit state (resume) ---

    def state_dict(self) -> dict:
        """Everything :meth:`reset` creates and the rollout changes, as plain data.

        A nested structure of dicts with str keys, lists, ints, floats, str, bool, None and
        tensors (no objects), for :func:`worldtrace_cli.runs.state.save_state`. Tensors are the writer's
        live ones (no copies): save them before the next :meth:`commit`. The geometry and config
        are not included (they are rebuilt); ``writer``/``version``/``budget`` identify the layout.

        Contract: ``w2 = build_writer(same config, same default budget); w2.reset(same geometry);
        w2.load_state_dict(w1.state_dict())`` makes w2 read and commit bit-identically to w1.
        """
        return {"writer": self.name, "version": STATE_VERSION, "budget": self.budget,
                "frame_start": self.frame_start, "heads": self.geometry.heads}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` after :meth:`reset` (with the same config and geometry).

        Tensors are copied onto this writer's device (host stores stay on the host), so the
        source may keep being used.

        Raises:
            InputError: the state belongs to another writer, layout version or budget, or holds
                another number of heads (a state saved before heads were recorded is taken as whole).
        """
        from ..errors import InputError

        if self.geometry is None:
            raise RuntimeError("load_state_dict needs reset(geometry) first")
        got = (state.get("writer"), state.get("version"), state.get("budget"))
        if got != (self.name, STATE_VERSION, self.budget):
            raise InputError(f"resume state: saved by writer {got[0]!r} (state version {got[1]}, budget {got[2]}), "
                             f"cannot restore into --cache {self.config.cache} (version {STATE_VERSION}, "
                             f"budget {self.budget})")
        if state.get("heads", self.geometry.heads) != self.geometry.heads:
            raise InputError(f"resume state: its cache holds {state['heads']} heads per slot, this model "
                             f"{self.geometry.heads}")
        self.frame_start = int(state["frame_start"])
        self._positions = None

    def _device_copy(self, t: torch.Tensor) -> torch.Tensor:
        """A private copy of ``t`` on the compute device (dtype kept)."""
        return t.to(self.geometry.device, copy=True)

    def positions(self) -> torch.Tensor:
        """Virtual temporal positions [S] (float64 latent-frame offsets from ``frame_start``)."""
        if self._positions is None:
            self._positions = SCHEMES[self.positions_scheme](self.slots(), self.frame_start, self.geometry)
        return self._positions

    def read(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(K_canon [1, N, H, D], V [1, N, H, D], positions [S]) of one layer for this chunk, with
        N = S*T, or the sum of :meth:`token_counts` when slots differ in size."""
        k, v = self._read_kv(layer)
        return k, v, self.positions()

    def token_counts(self, layer: int) -> torch.Tensor | None:
        """Tokens of each slot of :meth:`read` in one layer: int64 [S] on the CPU, or None when every
        slot is one whole latent frame of T tokens (every writer but the compressed retrieval ones).

        A store-time compressed chunk (WorldKV §3) keeps its anchor frame whole and fewer tokens of
        its other frames, chosen per layer: each frame stays one slot (so every position scheme
        applies per frame) whose token count may differ between layers, and may be 0. The model
        reads every token of a slot at the slot's position
        (:attr:`~worldtrace_cli.model.chunk.LayerPast.counts`).
        """
        return None

    def slot_tokens(self) -> torch.Tensor:
        """int64 [L, S]: :meth:`token_counts` of every layer (T where a layer gives None)."""
        g = self.geometry
        n = len(self.slots())
        rows = [self.token_counts(layer) for layer in range(g.num_layers)]
        return torch.stack([torch.full((n,), g.tokens_per_frame, dtype=torch.int64) if r is None else r
                            for r in rows]) if n else torch.zeros(g.num_layers, 0, dtype=torch.int64)

    def token_bytes(self) -> int:
        """Bytes of one token's K and V in one layer (2 * heads * head_dim * dtype size)."""
        g = self.geometry
        return 2 * g.heads * g.head_dim * torch.finfo(g.dtype).bits // 8

    def _empty(self) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.geometry
        k = torch.zeros(1, 0, g.heads, g.head_dim, device=g.device, dtype=g.dtype)
        return k, k.clone()

    def kv_bytes(self) -> int:
        """Bytes of K/V of the slots this chunk reads on the compute device, all layers."""
        return int(self.slot_tokens().sum()) * self.token_bytes()

    def host_bytes(self) -> int:
        """Bytes kept off the compute device (e.g. the field writer's evicted frames); 0 by default."""
        return 0

    def reserve_host(self, latent_frames: int) -> int:
        """Size (and on CUDA page-lock) now the host store that ``latent_frames`` more committed latent
        frames will need, after :meth:`reset`, so the chunk loop does not pay for it (docs/gpu-memory.md); returns
        the bytes reserved. Default: nothing to reserve. Same values either way."""
        return 0

    def temporal_frequency_scale(self) -> torch.Tensor | None:
        """Multipliers [t_ch/2] of the temporal RoPE frequencies for this chunk (YaRN); None = unchanged."""
        return None

    def events(self) -> list[dict]:
        """Events since the last call (e.g. landmark detections) for chunks.jsonl."""
        return []

    def describe(self) -> dict:
        """Resolved settings for summary.json."""
        return {"cache": self.name, "positions": self.positions_scheme, "budget": self.budget}


def frames_state(frames: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]]) -> list:
    """Per-frame per-layer (k, v) tensors as nested lists ``[[[k, v], ...layers], ...frames]`` (no copies)."""
    return [[[k, v] for k, v in frame] for frame in frames]


def load_frames(state: list, device) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Inverse of :func:`frames_state`: private copies on ``device``."""
    return [[(k.to(device, copy=True), v.to(device, copy=True)) for k, v in frame] for frame in state]
