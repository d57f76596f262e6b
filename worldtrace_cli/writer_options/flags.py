"""A writer's own settings: the :class:`Flag` of each field, and the writers' options dataclasses
(torch-free; :mod:`worldtrace_cli.writer_options` says how they are used)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

LANDMARK_TAU = 0.1  # the landmark detector's threshold without a calibrated one (the paper's, set for MG2)
# worldtrace_cli.memory.SCHEMES, named here so --help and the early checks do not import torch (a test keeps them equal)
POSITION_SCHEMES = ("actual", "block_relative", "centroid_linear", "rank", "slot_rank")
SIZES = ("budget", "slots", "sink", "memrope", "unbounded")
# the size fields every writer's config has; which of them a writer reads follows from its ``sizes``
SLOT_FIELDS = ("budget", "summary_slots", "recent_slots")
SIZE_READS = {"budget": ("budget",), "sink": ("budget",), "memrope": ("budget",), "slots": SLOT_FIELDS, "unbounded": ()}
DEFAULT_WINDOW = 6  # MG2 universal local_attn_size: a writer built without its model's window assumes it


# --------------------------------------------------------------------------- a writer's own flags

@dataclass(frozen=True)
class Flag:
    """A command-line flag of a writer's own setting (a field of its options dataclass).

    Attributes:
        name: the field name (``top_k``); the flag is ``--top-k`` (:attr:`option`).
        kind: ``int``, ``float``, ``str`` or ``path`` (the CLI's parameter type; a path is kept as str).
        help: one line; the CLI adds which writers read it and their defaults.
        check: ``check(value)`` -> a problem (str) or None, torch-free; run on a given value only.
        metavar: the CLI's metavar, or None for click's.
    """

    name: str
    kind: str
    help: str
    check: Callable[[Any], str | None] | None = None
    metavar: str | None = None

    @property
    def option(self) -> str:
        """The command-line flag: ``--top-k`` for ``top_k``."""
        return "--" + self.name.replace("_", "-")


def flag(default, kind: str, help: str, check: Callable[[Any], str | None] | None = None, metavar: str | None = None):
    """A writer-options dataclass field with its :class:`Flag` (the field's name becomes the flag's).

    Example::

        @dataclass(frozen=True)
        class EchoOptions:
            gain: float = flag(1.0, "float", "echo: how loud", check=at_least(0))
    """
    return field(default=default, metadata={"flag": Flag("", kind, help, check, metavar)})


def flags_of(options_cls) -> dict[str, Flag]:
    """The :class:`Flag` of every field of a writer-options dataclass, by field name."""
    return {f.name: dataclasses.replace(f.metadata["flag"], name=f.name) for f in dataclasses.fields(options_cls)}


def at_least(low, unit: str = "") -> Callable[[Any], str | None]:
    """A check: a number >= ``low`` (``unit`` is added to the message)."""
    return lambda v: None if v >= low else f"must be >= {low}{unit}, got {v}"


def _finite_positive(v) -> str | None:
    return None if math.isfinite(v) and v > 0 else f"must be a finite number > 0, got {v}"


def _tau(v) -> str | None:
    return None if math.isfinite(v) and 0 < v <= 2 else (
        f"must be in (0, 2] (a cosine distance; 0 would make every frame a landmark), got {v}")


def _padding(v) -> str | None:
    return None if v in ("none", "repeat") else f"must be none or repeat, got {v!r}"


def _ratio(v) -> str | None:
    return None if math.isfinite(v) and 0 < v <= 1 else f"must be in (0, 1] (the share of non-anchor tokens kept), got {v}"


def _device(v) -> str | None:
    # whether that CUDA device exists is checked with torch, by the writer
    return None if re.fullmatch(r"cpu|cuda(:\d+)?", v) else f"must be cpu or cuda[:i], got {v!r}"


_SINK_HELP = "first latent frames kept (attention sink)"
_CAP_HELP = ("refuse before the KV cache (2 copies per chunk: stored frames, rotated buffers) exceeds this many GB "
             "(per process under --split-heads)")
_SPILL_HELP = "keep evicted frames on disk here instead of host memory (very long runs)"
_TAU_HELP = ("tau: cosine distance (0-2) between consecutive frame descriptors that marks a scene entry (default: "
             "the preset's calibrated tau, loopworld 0.0047, else the paper's 0.1; `worldtrace bench tau` calibrates it)")
_PAD_HELP = ("while fewer landmarks than slots exist: none = read only those held (default), repeat = fill the empty "
             "slots with the oldest landmark, the paper's Algorithm 1 (on loopworld it reads latent frame 0 several times "
             "past the trained offsets and draws grey stripes: docs/memory.md)")
_KEEP_HELP = "store-time compression: keep this share of each chunk's non-anchor tokens (0-1)"
_BANK_HELP = "where the bank of past K/V lives: cpu or cuda[:i]"


@dataclass(frozen=True)
class NoOptions:
    """A writer without settings of its own."""


@dataclass(frozen=True)
class SinkOptions:
    """``sink`` and ``memrope``: the attention-sink frames."""

    sink_frames: int = flag(1, "int", _SINK_HELP, at_least(1))


@dataclass(frozen=True)
class UnboundedOptions:
    """``full`` and ``yarn``: the memory cap of a cache that keeps every frame."""

    max_cache_gb: float = flag(16.0, "float", _CAP_HELP, _finite_positive)


@dataclass(frozen=True)
class SpillOptions:
    """``field`` and ``naive``: where evicted frames wait for their summary's refresh."""

    spill_dir: str | None = flag(None, "path", _SPILL_HELP)


@dataclass(frozen=True)
class LandmarkOptions:
    """``landmark``: the scene-entry detector's threshold."""

    landmark_threshold: float = flag(LANDMARK_TAU, "float", _TAU_HELP, _tau)
    landmark_padding: str = flag("none", "str", _PAD_HELP, _padding, metavar="none|repeat")


@dataclass(frozen=True)
class MixedOptions:
    """``mixed:k``: Field's store and the landmark detector."""

    spill_dir: str | None = flag(None, "path", _SPILL_HELP)
    landmark_threshold: float = flag(LANDMARK_TAU, "float", _TAU_HELP, _tau)
    landmark_padding: str = flag("none", "str", _PAD_HELP, _padding, metavar="none|repeat")


@dataclass(frozen=True)
class RetrievalOptions:
    """``retrieval``: the pose-indexed bank (no compression by default)."""

    keep_ratio: float = flag(1.0, "float", _KEEP_HELP, _ratio)
    bank_device: str = flag("cpu", "str", _BANK_HELP, _device, metavar="DEVICE")


@dataclass(frozen=True)
class WorldKVOptions:
    """``worldkv``: retrieval by camera pose as WorldKV releases it (keep ratio 0.5, k = 6 chunks)."""

    top_k: int | None = flag(None, "int", "banked chunks retrieved per chunk by camera pose (default 6, as released)",
                             at_least(0))
    retrieval_budget: int | None = flag(None, "int", "derive k from a token budget of FRAMES latent frames instead "
                                        "(paper: 18 -> k = 12 at --keep-ratio 0.25)", at_least(0, " latent frames"),
                                        metavar="FRAMES")
    keep_ratio: float = flag(0.5, "float", _KEEP_HELP + " (paper 0.25)", _ratio)
    bank_device: str = flag("cpu", "str", _BANK_HELP, _device, metavar="DEVICE")

    def conflict(self) -> str | None:
        """The settings' check across fields (an options class may define one; :func:`check_flags`
        runs it on the given values): k is fixed or comes from a token budget, not both."""
        if self.top_k is not None and self.retrieval_budget is not None:
            return "--top-k, --retrieval-budget: give one (k fixed, or k from a token budget)"
        return None
