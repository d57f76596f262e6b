"""KV-cache memory: writers (what is kept) and position schemes (where it is read).

Every module of this package is imported here (:func:`pkgutil.iter_modules`), so a writer is one
new file whose class is decorated with :func:`~.base.register`, plus its row of options in the
torch-free :mod:`worldtrace_cli.writer_options` (the CLI's early checks). The registry
(:data:`WRITERS`, :func:`example_specs`, :func:`descriptions`) is complete once this package is
imported.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..writer_options import DEFAULT_WINDOW, check_flags
from .base import WRITERS, CacheGeometry, CacheWriter, MemoryConfig, Slot, descriptions, example_specs
from .positions import SCHEMES

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["WRITERS", "SCHEMES", "CacheGeometry", "CacheWriter", "MemoryConfig", "Slot", "build_writer",
           "descriptions", "example_specs"]


def build_writer(config: MemoryConfig, default_budget: int, window: int = DEFAULT_WINDOW) -> CacheWriter:
    """Instantiate the writer named by ``config.cache`` (sizes are final after ``reset``).

    Args:
        config: memory settings.
        default_budget: past latent-frame slots of writers that default to MG2's own cache (sliding,
            sink) when ``config.budget`` is None: ``local_attn_size - frames_per_chunk``.
        window: latent frames the model attends over, current chunk included (``local_attn_size``;
            :attr:`~worldtrace_cli.config.Preset.window`): writers sized by it (WorldTrace writers,
            memrope) check their sizes for it now and again at ``reset`` from
            ``geometry.trained_offset + 1``.
    Raises:
        InputError: unknown writer or position scheme, an invalid flag value, a flag the writer
            would ignore (the message names the flag), sizes the window cannot hold
            (:mod:`worldtrace_cli.writer_options`).
    """
    check_flags(config)  # unknown writer / scheme first, with the torch-free messages
    return WRITERS[config.writer_name](config, default_budget, window)
