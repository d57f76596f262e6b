"""Which memory options each KV-cache writer takes, and the slot counts they resolve to (torch-free).

``generate``, ``compare`` and ``loopbench run`` check every ``--cache`` spec and memory flag against
this table before torch and the model load, so a bad flag is reported in a fraction of a second
(:func:`check_memory`). The writers (:mod:`worldtrace_cli.memory`) run the same functions when they
are built (:func:`check_flags`) and again at ``reset`` (:func:`writer_sizes`), where the model's
window is final: one rule, one place. A writer's file holds its mechanism; its row in
:data:`WRITER_OPTIONS` says which optional flags it reads, what its ``:arg`` is and how it sizes its
cache (docs/memory.md, "Adding a writer"; a contract test keeps the rows equal to the registered
writers).

Sizes are in latent frames (slots); the model's *window* is the latent frames it attends over,
current chunk included (MG2's ``local_attn_size``, 6 for universal).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import InputError

# optional MemoryConfig fields (None = the writer's default) -> their flag; a writer refuses any it does not read
OPTIONAL_FLAGS = {"budget": "--budget", "summary_slots": "--summary-slots", "recent_slots": "--recent-slots",
                  "spill_dir": "--spill-dir", "top_k": "--top-k", "retrieval_budget": "--retrieval-budget",
                  "keep_ratio": "--keep-ratio", "bank_device": "--bank-device"}
POSE_FIELDS = ("top_k", "retrieval_budget", "keep_ratio", "bank_device")
SLOT_FIELDS = ("budget", "summary_slots", "recent_slots")
# worldtrace_cli.memory.SCHEMES, named here so --help and the early checks do not import torch (a test keeps them equal)
POSITION_SCHEMES = ("actual", "block_relative", "centroid_linear", "rank", "slot_rank")
SIZES = ("budget", "slots", "sink", "memrope", "unbounded")
# the writers that read --landmark-threshold (the landmark detector: landmark.py, and mixed's landmark slots)
TAU_WRITERS = frozenset({"landmark", "mixed"})
DEFAULT_WINDOW = 6  # MG2 universal local_attn_size: a writer built without its model's window assumes it


@dataclass(frozen=True)
class WriterOptions:
    """One writer's options.

    Attributes:
        reads: the :data:`OPTIONAL_FLAGS` fields the writer uses; any other one given is refused.
        why: what the writer does instead (the refusal message's reason).
        sizes: how its past slots are counted: ``budget`` (the newest ``--budget`` frames, default
            the model's own: window - frames per chunk), ``slots`` (N_s summary + N_r recent,
            defaults from the window: :func:`window_defaults`), ``sink`` (``--sink-frames`` + recent
            within ``--budget``, default the model's own), ``memrope`` (sinks + 2 EMA + recent within
            ``--budget``, default the window) or ``unbounded`` (no slot count).
        arg: what ``--cache name:arg`` means: None (no argument), ``field_slots`` (``mixed:k``) or
            ``keep_ratio`` (``worldkv:r``).
    """

    reads: frozenset
    why: str
    sizes: str
    arg: str | None = None


def _row(reads, why: str, sizes: str, arg: str | None = None) -> WriterOptions:
    return WriterOptions(frozenset(reads), why, sizes, arg)


_EVERY_FRAME = "it keeps every past frame; its cap is --max-cache-gb"
WRITER_OPTIONS: dict[str, WriterOptions] = {
    "sliding": _row({"budget"}, "it keeps the newest --budget frames verbatim", "budget"),
    "sink": _row({"budget"}, "its sizes are --sink-frames and --budget", "sink"),
    "full": _row((), _EVERY_FRAME, "unbounded"),
    "yarn": _row((), _EVERY_FRAME, "unbounded"),
    "field": _row({*SLOT_FIELDS, "spill_dir"}, "its sizes are the slot counts", "slots"),
    "naive": _row({*SLOT_FIELDS, "spill_dir"}, "its sizes are the slot counts", "slots"),
    "mixed": _row({*SLOT_FIELDS, "spill_dir"}, "its sizes are the slot counts", "slots", "field_slots"),
    "field-streaming": _row(SLOT_FIELDS, "it keeps O(N_s) running sums and no evicted frames", "slots"),
    "landmark": _row(SLOT_FIELDS, "landmarks are kept on the compute device", "slots"),
    "memrope": _row({"budget"}, "its sizes are --sink-frames, 2 EMA slots and --budget", "memrope"),
    "retrieval": _row({*SLOT_FIELDS, "keep_ratio", "bank_device"},
                      "it retrieves --summary-slots frames into slots; the bank is --bank-device", "slots", "keep_ratio"),
    "worldkv": _row(POSE_FIELDS, "its window is --top-k retrieved chunks + the previous chunk", "unbounded",
                    "keep_ratio"),
}


def writer_options(config) -> WriterOptions:
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


def check_flags(config) -> WriterOptions:
    """Every check of a :class:`~worldtrace_cli.config.MemoryConfig` that needs neither the model
    nor torch: the writer and position scheme exist, values are in range, the writer reads every
    optional flag given, its ``:arg`` parses. Returns the writer's row.

    Raises:
        InputError: one line naming the flag: unknown writer or scheme; ``--budget`` < 0;
            ``--landmark-threshold`` not in (0, 2] (a cosine distance); ``--sink-frames`` < 1;
            ``--max-cache-gb`` not a finite number > 0; ``--top-k`` or ``--retrieval-budget`` < 0,
            or both given; ``--keep-ratio`` outside (0, 1]; a ``--bank-device`` name other than
            ``cpu`` / ``cuda[:i]`` (whether that CUDA device exists is checked with torch, by the
            writer); a flag the writer does not use; a bad ``:arg``.
    """
    row = writer_options(config)
    if config.positions is not None and config.positions not in POSITION_SCHEMES:
        raise InputError(f"--positions: unknown scheme {config.positions!r} (choose from {', '.join(POSITION_SCHEMES)})")
    if config.budget is not None and config.budget < 0:
        raise InputError(f"--budget: must be >= 0, got {config.budget}")
    tau = config.landmark_threshold
    if not (math.isfinite(tau) and 0 < tau <= 2):
        raise InputError(f"--landmark-threshold: must be in (0, 2] (a cosine distance; 0 would make every "
                         f"frame a landmark), got {tau}")
    if config.sink_frames < 1:
        raise InputError(f"--sink-frames: must be >= 1, got {config.sink_frames}")
    if not (math.isfinite(config.max_cache_gb) and config.max_cache_gb > 0):
        raise InputError(f"--max-cache-gb: must be a finite number > 0, got {config.max_cache_gb}")
    if config.top_k is not None and config.top_k < 0:
        raise InputError(f"--top-k: must be >= 0, got {config.top_k}")
    if config.retrieval_budget is not None and config.retrieval_budget < 0:
        raise InputError(f"--retrieval-budget: must be >= 0 latent frames, got {config.retrieval_budget}")
    r = config.keep_ratio
    if r is not None and not (math.isfinite(r) and 0 < r <= 1):
        raise InputError(f"--keep-ratio: must be in (0, 1] (the share of non-anchor tokens kept), got {r}")
    if config.bank_device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", config.bank_device):
        raise InputError(f"--bank-device: must be cpu or cuda[:i], got {config.bank_device!r}")
    pose_writers = sorted(name for name, w in WRITER_OPTIONS.items() if w.reads & set(POSE_FIELDS))
    for field, flag in OPTIONAL_FLAGS.items():
        if getattr(config, field) is not None and field not in row.reads:
            why = (f"only the pose-retrieval writers {' and '.join(pose_writers)} use it"
                   if field in POSE_FIELDS and not row.reads & set(POSE_FIELDS) else row.why)
            raise InputError(f"{flag}: --cache {config.cache} does not use it ({why})")
    if config.top_k is not None and config.retrieval_budget is not None:
        raise InputError("--top-k, --retrieval-budget: give one (k fixed, or k from a token budget)")
    if row.arg is None and config.writer_arg is not None:
        raise InputError(f"--cache {config.cache}: {config.writer_name} takes no ':' argument")
    if row.arg == "keep_ratio":
        keep_ratio_of(config, 1.0)
    if row.arg == "field_slots":
        mixed_field_slots(config)
    return row


def keep_ratio_of(config, default: float) -> float:
    """The keep ratio r of ``--keep-ratio r`` or of the spec ``--cache worldkv:r`` (so one ``compare``
    or ``loopbench`` list can hold several ratios), else ``default``.

    Raises:
        InputError: both given, or a spec argument that is not a number in (0, 1].
    """
    if config.writer_arg is None:
        return default if config.keep_ratio is None else config.keep_ratio
    if config.keep_ratio is not None:
        raise InputError(f"--keep-ratio, --cache {config.cache}: give the keep ratio once")
    try:
        r = float(config.writer_arg)
    except ValueError:
        r = math.nan
    if not (math.isfinite(r) and 0 < r <= 1):
        raise InputError(f"--cache {config.cache}: expected {config.writer_name}:r with r the keep ratio in (0, 1], "
                         f"e.g. {config.writer_name}:0.25")
    return r


def mixed_field_slots(config, n_summary: int | None = None) -> int:
    """k of ``--cache mixed:k`` (field slots; the other N_s - k summary slots are landmarks).

    Args:
        n_summary: N_s, when known (k must be at most N_s); None checks the syntax only.
    Raises:
        InputError: k missing, not an integer, negative, or above N_s.
    """
    bound = "" if n_summary is None else f" in [0, {n_summary}]"
    try:
        k = int(config.writer_arg)  # None or "x" -> TypeError / ValueError
    except (TypeError, ValueError):
        raise InputError(f"--cache {config.cache}: expected mixed:k with k an integer field-slot count{bound}, "
                         f"e.g. mixed:2") from None
    if k < 0 or (n_summary is not None and k > n_summary):
        raise InputError(f"--cache {config.cache}: k must be in [0, {'N_s' if n_summary is None else n_summary}] "
                         f"(the summary slots), got {k}")
    return k


def window_defaults(window: int) -> tuple[int, int]:
    """Default (N_s, N_r) for a model window of ``window`` latent frames (local_attn_size).

    N_s + N_r = window, so with slot-rank positions the oldest slot sits at offset -window, which
    is Eq. 2's t_min (q = a - 1, t_min = q - Delta, Delta = window - 1): no slot falls below it.
    N_r = 2 (at most window - 1): (4, 2) for MG2's window 6 (the paper's recall setting), (2, 2)
    for gta_drive's window 4.
    """
    nr = max(1, min(2, window - 1))
    return max(0, window - nr), nr


def resolve_slots(config, default_summary: int = 4, default_recent: int = 2) -> tuple[int, int]:
    """(N_s, N_r) from ``--summary-slots``, ``--recent-slots`` and ``--budget`` (budget = N_s + N_r).

    Defaults: ``default_summary``/``default_recent`` (:func:`window_defaults` of the model's
    window; 4 and 2 for MG2, the paper's recall setting, design.md §3). With only ``--budget``,
    N_r keeps its default (at most budget - 1) and N_s takes the rest.

    Raises:
        InputError: negative counts, N_r < 1, or a budget that disagrees with both counts.
    """
    ns, nr, budget = config.summary_slots, config.recent_slots, config.budget
    if ns is not None and ns < 0:
        raise InputError(f"--summary-slots: must be >= 0, got {ns}")
    if nr is not None and nr < 1:
        raise InputError(f"--recent-slots: must be >= 1, got {nr}")
    if budget is not None:
        if ns is not None and nr is not None and ns + nr != budget:
            raise InputError(f"--budget {budget} != --summary-slots {ns} + --recent-slots {nr}")
        if ns is None and nr is None:
            nr = max(1, min(default_recent, budget - 1))
        if ns is None:
            ns = budget - nr
        if nr is None:
            nr = budget - ns
        if nr < 1 or ns < 0:
            raise InputError(f"--budget {budget}: too small for {max(ns, 0)} summary + {max(nr, 1)} recent slots "
                             f"(at least 1 recent slot)")
    return (default_summary if ns is None else ns), (default_recent if nr is None else nr)


def writer_sizes(config, window: int, default_budget: int) -> tuple[int, int] | None:
    """(summary slots, recent slots) of ``config``'s writer for a model window of ``window`` latent
    frames, or None for a writer without a slot count (``unbounded``). ``budget`` writers give
    (0, budget); ``sink`` gives (sink frames, recent); ``memrope`` (sinks + 2 EMA, recent).

    Args:
        window: latent frames the model attends over, current chunk included (MG2: local_attn_size).
        default_budget: the model's own past slots, window - frames per chunk (``budget``/``sink``).
    Raises:
        InputError: sizes that cannot hold the writer (too small a ``--budget``, a ``--sink-frames``
            that fills it, ``mixed:k`` above N_s, counts that disagree), naming the flag.
    """
    row = writer_options(config)
    budget = config.budget
    if row.sizes == "budget":
        return 0, (default_budget if budget is None else budget)
    if row.sizes == "sink":
        budget = default_budget if budget is None else budget
        k = config.sink_frames
        if not 1 <= k < budget:
            raise InputError(f"--sink-frames {k} and --budget {budget}: --cache {config.cache} needs the budget to hold "
                             f"the sink frames and at least 1 recent slot ({k + 1})")
        return k, budget - k
    if row.sizes == "memrope":
        k = config.sink_frames
        budget = window if budget is None else budget
        if budget < k + 3:
            flag = "--budget" if config.budget is not None else "--sink-frames"
            raise InputError(f"{flag}: --cache {config.cache} needs --sink-frames ({k}) + 2 EMA + at least 1 recent "
                             f"slot = {k + 3}, but the budget is {budget}")
        return k + 2, budget - k - 2
    if row.sizes == "slots":
        ns, nr = resolve_slots(config, *window_defaults(window))
        if row.arg == "field_slots":
            mixed_field_slots(config, ns)
        return ns, nr
    return None


def check_memory(config, window: int, default_budget: int) -> tuple[int, int] | None:
    """:func:`check_flags` then :func:`writer_sizes`: everything about a writer spec and its flags
    that can be known from the preset alone (``window``, ``default_budget``), without torch.

    Raises:
        InputError: see :func:`check_flags` and :func:`writer_sizes`.
    """
    check_flags(config)
    return writer_sizes(config, window, default_budget)
