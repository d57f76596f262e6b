"""KV-cache memory: writers (what is kept) and position schemes (where it is read)."""

from __future__ import annotations

from ..errors import InputError
from . import field, field_streaming, full, landmark, memrope, mixed, naive, sink, sliding, yarn  # noqa: F401
from .base import WRITERS, CacheGeometry, CacheWriter, MemoryConfig, Slot
from .positions import SCHEMES

__all__ = ["WRITERS", "SCHEMES", "CacheGeometry", "CacheWriter", "MemoryConfig", "Slot", "build_writer"]


def build_writer(config: MemoryConfig, default_budget: int) -> CacheWriter:
    """Instantiate the writer named by ``config.cache``.

    Args:
        config: memory settings.
        default_budget: past latent-frame slots when ``config.budget`` is None (MG2's own:
            ``local_attn_size - frames_per_chunk``).
    Raises:
        InputError: unknown writer or position scheme, negative budget.
    """
    if config.writer_name not in WRITERS:
        raise InputError(f"--cache: unknown writer {config.cache!r} (choose from {', '.join(sorted(WRITERS))})")
    if config.positions is not None and config.positions not in SCHEMES:
        raise InputError(f"--positions: unknown scheme {config.positions!r} (choose from {', '.join(sorted(SCHEMES))})")
    if config.budget is not None and config.budget < 0:
        raise InputError(f"--budget: must be >= 0, got {config.budget}")
    return WRITERS[config.writer_name](config, default_budget)
