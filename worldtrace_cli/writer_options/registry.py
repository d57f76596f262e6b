"""The writer rows (:data:`WRITER_OPTIONS`) and :class:`MemoryConfig`, a run's memory settings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..errors import InputError
from .flags import (SIZE_READS, SIZES, SLOT_FIELDS, Flag, LandmarkOptions, MixedOptions, NoOptions, RetrievalOptions,
                    SinkOptions, SpillOptions, UnboundedOptions, WorldKVOptions, flags_of)


# --------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class WriterRow:
    """One writer's row.

    Attributes:
        sizes: how its past slots are counted: ``budget`` (the newest ``--budget`` frames, default
            the model's own: window - frames per chunk), ``slots`` (N_s summary + N_r recent,
            defaults from the window: :func:`window_defaults`), ``sink`` (``--sink-frames`` + recent
            within ``--budget``, default the model's own), ``memrope`` (sinks + 2 EMA + recent within
            ``--budget``, default the window) or ``unbounded`` (no slot count).
        why: what the writer does instead of a flag it does not read (the refusal's reason).
        options: its settings, a frozen dataclass of :func:`flag` fields (:class:`NoOptions`: none).
        arg: what ``--cache name:arg`` means: None (no argument), ``field_slots`` (``mixed:k``) or
            ``keep_ratio`` (``worldkv:r``: sets the ``keep_ratio`` setting).
        about: one line for ``--cache``'s help.
        needs_poses: the writer chooses its memory by camera pose (its class's ``needs_poses``), so a run
            without a camera (text-to-video) is refused before torch loads.
    """

    sizes: str
    why: str
    options: type = NoOptions
    arg: str | None = None
    about: str = ""
    needs_poses: bool = False

    @property
    def flags(self) -> dict[str, Flag]:
        """The writer's own flags, by field name."""
        return flags_of(self.options)

    @property
    def reads(self) -> frozenset:
        """Every optional field the writer reads: its size fields and its own settings."""
        return frozenset(SIZE_READS[self.sizes]) | frozenset(self.flags)


_EVERY_FRAME = "it keeps every past frame; its cap is --max-cache-gb"
_SLOT_COUNTS = "its sizes are the slot counts"
WRITER_OPTIONS: dict[str, WriterRow] = {}


# names a writer's setting cannot take: MemoryConfig's own fields and the other options of generate,
# compare, loopbench run, play and open() (a writer's flags are added beside them)
RESERVED = frozenset({"cache", "caches", "positions", "options", "preset", "checkpoint", "random_weights",
                      "weights_seed", "image", "images", "world_seed", "seed", "seeds", "chunks", "device", "dtype",
                      "threads", "metrics", "output", "overwrite", "record", "pipeline", "rope_precision", "compile",
                      "compile_mode", "overlap_decode", "hud", "save_every", "resume_dir", "no_progress", "progress",
                      "prompt", "poses", "intrinsics", "hash_checkpoint", "host", "port", "max_sessions", "runs_dir",
                      "no_record", "trajectory", "configs", "worlds", "shard", "full", "verbose", "help"})


def add_writer(name: str, row: WriterRow) -> WriterRow:
    """Add (or replace) writer ``name``'s row: the CLI built after this call shows its flags and
    ``--cache`` entry, and :func:`check_flags` checks them. Its mechanism registers separately
    (:func:`worldtrace_cli.memory.base.register`); a contract test keeps both registries equal.

    Raises:
        ValueError: an unknown ``sizes`` or ``arg``, a flag that is also a size field or another option
            of the commands and of ``open()`` (:data:`RESERVED`), or a flag another writer declares
            with a different kind (one flag has one type on the command line).
    """
    if row.sizes not in SIZES or row.arg not in (None, "field_slots", "keep_ratio"):
        raise ValueError(f"writer {name}: sizes {row.sizes!r} / arg {row.arg!r}")
    for fname, fl in row.flags.items():
        if fname in SLOT_FIELDS or fname in RESERVED:
            raise ValueError(f"writer {name}: {fl.option} is taken (a shared memory setting, or a run's or "
                             f"session's own option)")
        for other, orow in WRITER_OPTIONS.items():
            if other != name and fname in orow.flags and orow.flags[fname].kind != fl.kind:
                raise ValueError(f"writer {name}: {fl.option} is {fl.kind} here and {orow.flags[fname].kind} "
                                 f"for {other}")
    WRITER_OPTIONS[name] = row
    return row


for _name, _row in {
    "sliding": WriterRow("budget", "it keeps the newest --budget frames verbatim",
                         about="MG2's own cache, the newest frames verbatim"),
    "sink": WriterRow("sink", "its sizes are --sink-frames and --budget", SinkOptions,
                      about="attention-sink frames and the newest frames"),
    "full": WriterRow("unbounded", _EVERY_FRAME, UnboundedOptions, about="every past frame, growing"),
    "yarn": WriterRow("unbounded", _EVERY_FRAME, UnboundedOptions,
                      about="every past frame, YaRN-scaled temporal frequencies"),
    "field": WriterRow("slots", _SLOT_COUNTS, SpillOptions, about="WorldTrace Field, canonical means of the evicted frames' groups"),
    "naive": WriterRow("slots", _SLOT_COUNTS, SpillOptions, about="averages of RoPE-rotated keys, the phase-cancelling baseline"),
    "mixed": WriterRow("slots", _SLOT_COUNTS, MixedOptions, "field_slots",
                       about="K Field summary slots, the rest landmarks"),
    "field-streaming": WriterRow("slots", "it keeps O(N_s) running sums and no evicted frames",
                                 about="Field from running sums, no host store"),
    "landmark": WriterRow("slots", "landmarks are kept on the compute device", LandmarkOptions,
                          about="WorldTrace Landmark, frames kept at scene entries"),
    "memrope": WriterRow("memrope", "its sizes are --sink-frames, 2 EMA slots and --budget", SinkOptions,
                         about="MemRoPE, sinks, 2 EMA slots and recent frames"),
    "retrieval": WriterRow("slots", "it retrieves --summary-slots frames into slots; the bank is --bank-device",
                           RetrievalOptions, "keep_ratio", about="WorldTrace Retrieval, summary slots retrieved by camera pose",
                           needs_poses=True),
    "worldkv": WriterRow("unbounded", "its window is --top-k retrieved chunks + the previous chunk", WorldKVOptions,
                         "keep_ratio", about="WorldKV, chunks retrieved by camera pose", needs_poses=True),
}.items():
    add_writer(_name, _row)


def writer_flags() -> dict[str, tuple[Flag, list[str]]]:
    """Every writer-specific flag of the registry with the writers that read it, by field name
    (the CLI builds one option per entry)."""
    out: dict[str, tuple[Flag, list[str]]] = {}
    for name, row in WRITER_OPTIONS.items():
        for fname, fl in row.flags.items():
            out.setdefault(fname, (fl, []))[1].append(name)
    return out


def settings_for(cache: str, options: dict) -> dict:
    """``options`` (memory keywords by name) without the settings of other writers that ``cache``'s
    writer does not read: one set of flags for several writers (``play``'s writer switch), each
    writer taking its own. Unchanged for an unknown writer (its check refuses it by name)."""
    row = WRITER_OPTIONS.get(cache.split(":", 1)[0])
    if row is None:
        return dict(options)
    others = set(writer_flags()) - set(row.flags)
    return {k: v for k, v in options.items() if k not in others}


def writer_options(config) -> WriterRow:
    """The row of ``config.cache``'s writer (``mixed:2`` -> ``mixed``).

    Raises:
        InputError: an unknown writer (the message lists the runnable specs).
    """
    row = WRITER_OPTIONS.get(config.writer_name)
    if row is None:
        raise InputError(f"--cache: unknown writer {config.cache!r} (choose from {', '.join(writer_specs())})")
    return row


def writer_specs() -> list[str]:
    """The runnable writer specs, sorted, as error messages list them (``mixed:K``: K summary slots
    from Field, the rest landmarks)."""
    return sorted(name + {"field_slots": ":K", "keep_ratio": ""}.get(r.arg, "") for name, r in WRITER_OPTIONS.items())


# --------------------------------------------------------------------------- the memory settings

@dataclass(frozen=True)
class MemoryConfig:
    """A run's memory settings: what every writer reads, plus the chosen writer's own settings.

    Attributes:
        cache: the writer spec (``--cache``: ``landmark``, ``mixed:2``, ``worldkv:0.25``).
        positions: the position scheme (``--positions``; None: the writer's default).
        budget, summary_slots, recent_slots: the cache's size in latent-frame slots (``--budget`` =
            N_s + N_r; None: the writer's default from the model's window, :func:`writer_sizes`).
        options: the writer's own settings that were given, by field name (``{"top_k": 4}``);
            the rest take its options dataclass's defaults (:meth:`settings`).
    """

    cache: str = "sliding"
    positions: str | None = None
    budget: int | None = None
    summary_slots: int | None = None
    recent_slots: int | None = None
    options: dict = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, cache: str = "sliding", **settings) -> "MemoryConfig":
        """A MemoryConfig from flat keyword settings: the shared fields by name, anything else a
        writer setting (``MemoryConfig.of("worldkv", top_k=4)``); None values are "not given"."""
        shared = {k: settings.pop(k) for k in ("positions", *SLOT_FIELDS) if k in settings}
        return cls(cache=cache, **shared, options={k: v for k, v in settings.items() if v is not None})

    @property
    def writer_name(self) -> str:
        """``mixed:2`` -> ``mixed``."""
        return self.cache.split(":", 1)[0]

    @property
    def writer_arg(self) -> str | None:
        """``mixed:2`` -> ``"2"``; None without a ``:``."""
        return self.cache.split(":", 1)[1] if ":" in self.cache else None

    def settings(self):
        """The writer's options dataclass: its defaults, the given :attr:`options`, and the spec's
        ``:r`` for a ``keep_ratio`` argument. Run :func:`check_flags` first (this assumes a valid
        config).

        Raises:
            InputError: an unknown writer.
        """
        row = writer_options(self)
        values = {k: v for k, v in self.options.items() if k in row.flags}
        if row.arg == "keep_ratio" and self.writer_arg is not None:
            values["keep_ratio"] = keep_ratio_of(self)
        return row.options(**values)

    def to_dict(self) -> dict:
        """The flat form runs record (``summary.json``'s ``config.memory``, resume states): the shared
        fields and every setting of the writer, resolved (its defaults included)."""
        out = {"cache": self.cache, "positions": self.positions, "budget": self.budget,
               "summary_slots": self.summary_slots, "recent_slots": self.recent_slots}
        row = WRITER_OPTIONS.get(self.writer_name)
        if row is None:
            return {**out, **self.options}
        try:
            resolved = self.settings()
        except InputError:  # a bad ``:arg``, recorded as given (check_flags refuses it)
            resolved = row.options(**{k: v for k, v in self.options.items() if k in row.flags})
        return {**out, **dataclasses.asdict(resolved)}

    @classmethod
    def from_dict(cls, d: dict) -> "MemoryConfig":
        """Inverse of :meth:`to_dict`: the settings recorded at their writer's default are dropped,
        so ``options`` holds what was given (``from_dict(to_dict(m)) == m`` unless a given value
        equals its default). Also reads the older flat form that recorded every writer's settings for
        every writer (the keys this writer does not read are dropped)."""
        d = dict(d)
        if isinstance(d.get("options"), dict):
            d.update(d.pop("options"))
        row = WRITER_OPTIONS.get(str(d.get("cache", "sliding")).split(":", 1)[0])
        cfg = cls.of(**d)
        if row is not None:
            spec_ratio = row.arg == "keep_ratio" and cfg.writer_arg is not None  # worldkv:0.25 records 0.25 twice
            defaults = dataclasses.asdict(row.options())
            cfg = dataclasses.replace(cfg, options={k: v for k, v in cfg.options.items()
                                                    if k in row.flags and v != defaults[k]
                                                    and not (spec_ratio and k == "keep_ratio")})
        return cfg


def keep_ratio_of(config: MemoryConfig) -> float:
    """The keep ratio r of ``--keep-ratio r`` or of the spec ``--cache worldkv:r`` (so one ``compare``
    or ``loopbench`` list can hold several ratios), else the writer's default.

    Raises:
        InputError: both given, or a spec argument that is not a number in (0, 1].
    """
    given = config.options.get("keep_ratio")
    if config.writer_arg is None:
        return writer_options(config).options().keep_ratio if given is None else given
    if given is not None:
        raise InputError(f"--keep-ratio, --cache {config.cache}: give the keep ratio once")
    try:
        r = float(config.writer_arg)
    except ValueError:
        r = math.nan
    if not (math.isfinite(r) and 0 < r <= 1):
        raise InputError(f"--cache {config.cache}: expected {config.writer_name}:r with r the keep ratio in (0, 1], "
                         f"e.g. {config.writer_name}:0.25")
    return r
