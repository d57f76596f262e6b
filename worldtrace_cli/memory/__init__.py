"""KV-cache memory: writers (what is kept) and position schemes (where it is read).

Every module of this package is imported here (:func:`pkgutil.iter_modules`), so a writer is one
new file whose class is decorated with :func:`~.base.register`: no list to edit. The registry
(:data:`WRITERS`, :func:`example_specs`, :func:`descriptions`) is complete once this package is
imported.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import InputError
from .base import WRITERS, CacheGeometry, CacheWriter, MemoryConfig, Slot, descriptions, example_specs
from .positions import SCHEMES

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["WRITERS", "SCHEMES", "CacheGeometry", "CacheWriter", "MemoryConfig", "Slot", "build_writer",
           "descriptions", "example_specs"]


def build_writer(config: MemoryConfig, default_budget: int) -> CacheWriter:
    """Instantiate the writer named by ``config.cache`` (sizes may be final only after ``reset``).

    Args:
        config: memory settings.
        default_budget: past latent-frame slots of writers that default to MG2's own cache (sliding,
            sink) when ``config.budget`` is None: ``local_attn_size - frames_per_chunk``. Writers
            sized by the model's window (WorldTrace writers, memrope) resolve it in ``reset`` from
            ``geometry.trained_offset + 1``.
    Raises:
        InputError: unknown writer or position scheme, an invalid flag value, or a flag the writer
            would ignore (the message names the flag).
    """
    if config.writer_name not in WRITERS:
        raise InputError(f"--cache: unknown writer {config.cache!r} (choose from {', '.join(example_specs())})")
    if config.positions is not None and config.positions not in SCHEMES:
        raise InputError(f"--positions: unknown scheme {config.positions!r} (choose from {', '.join(sorted(SCHEMES))})")
    return WRITERS[config.writer_name](config, default_budget)
