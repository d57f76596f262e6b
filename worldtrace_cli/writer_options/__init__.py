"""The torch-free writer registry: each KV-cache writer's own options, sizes and checks.

A writer is its mechanism (a file in :mod:`worldtrace_cli.memory`) plus one row here
(:class:`WriterRow` in :data:`WRITER_OPTIONS`): how it sizes its cache, what its ``:arg`` means, and
its own settings as a small frozen dataclass whose fields are declared with :func:`flag` (the
command-line flag, its help and its torch-free check). Everything else is built from the rows:
the CLI's flags and ``--cache`` help (:mod:`worldtrace_cli.cli.options`), the refusal of a flag the
writer does not read, the checks that ``generate``, ``compare``, ``loopbench run`` and sessions run
before torch loads (:func:`check_memory`), and the contract tests' matrix. The writers run the same
functions when they are built (:func:`check_flags`) and at ``reset`` (:func:`writer_sizes`).

:class:`MemoryConfig` keeps what every writer reads: the writer spec, the position scheme and the
cache's size (``--budget`` = N_s summary + N_r recent slots). A writer's own settings are in
``MemoryConfig.options`` (the values given, by field name) and resolve to its dataclass with
:meth:`MemoryConfig.settings`.

Sizes are in latent frames (slots); the model's *window* is the latent frames it attends over,
current chunk included (MG2's ``local_attn_size``, 6 for universal).
"""

from .checks import (check_flags, check_memory, check_writer_specs, mixed_field_slots, resolve_slots, window_defaults,
                     writer_sizes)
from .flags import (DEFAULT_WINDOW, LANDMARK_TAU, POSITION_SCHEMES, SIZE_READS, SIZES, SLOT_FIELDS, Flag,
                    LandmarkOptions, MixedOptions, NoOptions, RetrievalOptions, SinkOptions, SpillOptions,
                    UnboundedOptions, WorldKVOptions, at_least, flag, flags_of)
from .registry import (WRITER_OPTIONS, MemoryConfig, WriterRow, add_writer, keep_ratio_of, settings_for,
                       writer_flags, writer_options, writer_specs)

__all__ = ["DEFAULT_WINDOW", "LANDMARK_TAU", "POSITION_SCHEMES", "SIZES", "SIZE_READS", "SLOT_FIELDS", "WRITER_OPTIONS",
           "Flag", "LandmarkOptions", "MemoryConfig", "MixedOptions", "NoOptions", "RetrievalOptions", "SinkOptions",
           "SpillOptions", "UnboundedOptions", "WorldKVOptions", "WriterRow", "add_writer", "at_least", "check_flags",
           "check_memory", "check_writer_specs", "flag", "flags_of", "keep_ratio_of", "mixed_field_slots", "resolve_slots", "settings_for",
           "window_defaults", "writer_flags", "writer_options", "writer_sizes", "writer_specs"]
