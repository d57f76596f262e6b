"""The torch-free checks of a :class:`~.registry.MemoryConfig` and the slot counts it resolves to."""

from __future__ import annotations

from ..errors import InputError
from .flags import POSITION_SCHEMES, SLOT_FIELDS
from .registry import MemoryConfig, WriterRow, keep_ratio_of, writer_flags, writer_options


# --------------------------------------------------------------------------- checks and sizes

def check_flags(config: MemoryConfig) -> WriterRow:
    """Every check of a :class:`MemoryConfig` that needs neither the model nor torch: the writer and
    position scheme exist, sizes and settings are in range (each :class:`Flag`'s check), the writer
    reads every setting given, its ``:arg`` parses. Returns the writer's row.

    Raises:
        InputError: one line naming the flag: unknown writer or scheme; ``--budget`` < 0; a setting
            out of range (``--landmark-threshold`` not in (0, 2], ``--sink-frames`` < 1,
            ``--max-cache-gb`` not > 0, ``--top-k`` or ``--retrieval-budget`` < 0, or both given,
            ``--keep-ratio`` outside (0, 1], a ``--bank-device`` other than ``cpu`` / ``cuda[:i]``:
            whether that CUDA device exists is checked with torch, by the writer); a flag the
            writer does not read; a bad ``:arg``.
    """
    row = writer_options(config)
    if config.positions is not None and config.positions not in POSITION_SCHEMES:
        raise InputError(f"--positions: unknown scheme {config.positions!r} (choose from {', '.join(POSITION_SCHEMES)})")
    if config.budget is not None and config.budget < 0:
        raise InputError(f"--budget: must be >= 0, got {config.budget}")
    known = writer_flags()
    for fname, value in config.options.items():
        if value is None:
            continue
        fl = row.flags.get(fname) or (known[fname][0] if fname in known else None)
        if fl is None:
            raise InputError(f"--{fname.replace('_', '-')}: no writer has this setting")
        problem = fl.check(value) if fl.check else None
        if problem:
            raise InputError(f"{fl.option}: {problem}")
    for fname in SLOT_FIELDS:
        if getattr(config, fname) is not None and fname not in row.reads:
            raise InputError(f"--{fname.replace('_', '-')}: --cache {config.cache} does not use it ({row.why})")
    for fname, value in config.options.items():
        if value is not None and fname not in row.flags:
            names = sorted(known[fname][1])
            readers = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
            raise InputError(f"{known[fname][0].option}: --cache {config.cache} does not use it (only {readers} "
                             f"{'reads' if len(known[fname][1]) == 1 else 'read'} it; {row.why})")
    conflict = getattr(row.options, "conflict", None)  # a writer's own check across its settings
    if conflict is not None:
        problem = conflict(row.options(**{k: v for k, v in config.options.items() if v is not None}))
        if problem:
            raise InputError(problem)
    if row.arg is None and config.writer_arg is not None:
        raise InputError(f"--cache {config.cache}: {config.writer_name} takes no ':' argument")
    if row.arg == "keep_ratio":
        keep_ratio_of(config)
    if row.arg == "field_slots":
        mixed_field_slots(config)
    return row


def mixed_field_slots(config: MemoryConfig, n_summary: int | None = None) -> int:
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


def resolve_slots(config: MemoryConfig, default_summary: int = 4, default_recent: int = 2) -> tuple[int, int]:
    """(N_s, N_r) from ``--summary-slots``, ``--recent-slots`` and ``--budget`` (budget = N_s + N_r).

    Defaults: ``default_summary``/``default_recent`` (:func:`window_defaults` of the model's
    window; 4 and 2 for MG2, the paper's recall setting). With only ``--budget``, N_r keeps its
    default (at most budget - 1) and N_s takes the rest.

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


def writer_sizes(config: MemoryConfig, window: int, default_budget: int) -> tuple[int, int] | None:
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
        k = config.settings().sink_frames
        # k == budget: the sinks alone (Self-Forcing's window 6 + sink 3, chunk 3), only when asked for
        # with --budget: a model's default budget (gta_drive's 1) never silently loses every recent frame
        if not 1 <= k <= budget or (k == budget and config.budget is None):
            raise InputError(f"--sink-frames {k} and --budget {budget}: --cache {config.cache} needs the budget to hold "
                             f"the sink frames and at least 1 recent slot ({k + 1}; --budget {k} keeps the sinks alone)")
        return k, budget - k
    if row.sizes == "memrope":
        k = config.settings().sink_frames
        budget = window if budget is None else budget
        if budget < k + 3:
            flag_name = "--budget" if config.budget is not None else "--sink-frames"
            raise InputError(f"{flag_name}: --cache {config.cache} needs --sink-frames ({k}) + 2 EMA + at least 1 recent "
                             f"slot = {k + 3}, but the budget is {budget}")
        return k + 2, budget - k - 2
    if row.sizes == "slots":
        ns, nr = resolve_slots(config, *window_defaults(window))
        if row.arg == "field_slots":
            mixed_field_slots(config, ns)
        return ns, nr
    return None


def check_memory(config: MemoryConfig, window: int, default_budget: int) -> tuple[int, int] | None:
    """:func:`check_flags` then :func:`writer_sizes`: everything about a writer spec and its flags
    that can be known from the preset alone (``window``, ``default_budget``), without torch.

    Raises:
        InputError: see :func:`check_flags` and :func:`writer_sizes`.
    """
    check_flags(config)
    return writer_sizes(config, window, default_budget)


def check_writer_specs(memories, preset) -> None:
    """The torch-free half of ``jobs.inputs.check_writers``: each writer's flags and sizes for ``preset``'s
    window (:func:`check_memory`), and a writer that retrieves by camera pose refused for a backbone
    without a camera (the writer row's ``needs_poses``, the preset's backbone row's ``camera``).

    Args:
        memories: :class:`~worldtrace_cli.writer_options.MemoryConfig` s; preset: a
            :class:`~worldtrace_cli.config.Preset` (its window, default budget and backbone row).
    Raises:
        InputError: the first refusal (naming ``--cache``).
    """
    for memory in memories:
        check_memory(memory, preset.window, preset.default_budget)
        if not preset.backbone.camera and writer_options(memory).needs_poses:
            raise InputError(f"--cache {memory.cache}: retrieves memory by camera pose; preset {preset.name} "
                             f"({preset.backbone.title}) has no camera (use field, landmark, sliding, sink, full, ...)")
