"""WorldTrace's memory writers outside worldtrace's own loop (docs/diffusers.md).

* The memory as a library, no backbone: :class:`KVMemory` (any ``--cache`` writer with its sizes;
  ``begin_chunk`` / ``read(layer)`` / ``commit``; ``state_dict``), :class:`TemporalRope` (rotate canonical
  keys to the slots' virtual positions), :class:`PastKV` (one layer's past).
* A diffusers hook on ``WanTransformer3DModel``: :class:`WorldTraceKVCacheConfig`,
  :func:`apply_worldtrace_kv_cache`, :func:`remove_worldtrace_kv_cache`, :func:`get_worldtrace_kv_state`,
  :func:`commit_chunk` (imported from :mod:`.diffusers` on first use, so ``import
  worldtrace_cli.integrations`` does not load diffusers).
* Original Wan 2.1 <-> diffusers state-dict names: :mod:`.wan_keys`.
"""

from __future__ import annotations

from .kv_state import WorldTraceKVCacheConfig, WorldTraceKVState
from .memory import KVMemory, PastKV, TemporalRope, build_memory

_DIFFUSERS = ("apply_worldtrace_kv_cache", "remove_worldtrace_kv_cache", "get_worldtrace_kv_state", "commit_chunk")
_KEYS = ("wan_to_diffusers", "diffusers_to_wan", "wan_transformer_from_original")


def __getattr__(name: str):
    if name in _DIFFUSERS:
        from . import diffusers as hooks

        return getattr(hooks, name)
    if name in _KEYS:
        from . import wan_keys

        return getattr(wan_keys, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KVMemory", "PastKV", "TemporalRope", "WorldTraceKVCacheConfig", "WorldTraceKVState", "build_memory",
           *_DIFFUSERS, *_KEYS]
