"""Constructor configuration of the LingBot-World DiT (spec §2.1), read from a diffusers ``config.json``.

Field names are the official ``WanModelFast`` config keys. ``qk_norm``, ``cross_attn_norm``,
``patch_size`` and ``text_dim`` are on the official class's ignore-for-config list (always the
constructor defaults, spec §2.1), so they are accepted and ignored here too; any other unknown key
is an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ...errors import CheckpointError

_IGNORED = {"_class_name", "_diffusers_version", "_name_or_path", "qk_norm", "cross_attn_norm",
            "patch_size", "text_dim", "window_size"}

TEXT_DIM = 4096          # umT5-XXL width (spec §2.1)
CAMERA_CHANNELS = 6      # per pixel: ray origin (3) | ray direction (3) (spec §10.3)
PIXELS_PER_LATENT = 64   # 8 x 8 pixels folded into channels per latent cell (spec §10.3 step 6)
FRAMES_PER_CHUNK = 4     # latent frames per chunk, the official CLI default (spec §2.2)


@dataclass(frozen=True)
class LingbotConfig:
    """LingBot-World DiT configuration (spec §2.1). Defaults are the released A14B model.

    ``local_attn_size`` (latent frames in the cache, current chunk included; -1 = global) and
    ``sink_size`` (latent frames never evicted) describe the official cache (spec §7); the official
    CLI overrides them at load time (defaults -1 / 0; README 18 / 6, spec §2.2).
    """

    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    num_heads: int = 40
    num_layers: int = 40
    in_dim: int = 36
    out_dim: int = 16
    text_len: int = 512
    eps: float = 1e-6
    model_type: str = "i2v"
    local_attn_size: int = -1
    sink_size: int = 0

    @property
    def head_dim(self) -> int:
        """Channels per head (128 for every released and fixture configuration)."""
        return self.dim // self.num_heads

    @property
    def has_camera(self) -> bool:
        """True for LingBot-World (``i2v``: image channels and the camera branch); a ``t2v`` model
        (Self-Forcing, LongLive: Wan2.1-T2V) is the same network without them (selfforcing-architecture.md
        §1: its state dict is LingBot's less the camera modules)."""
        return self.model_type == "i2v"

    @property
    def camera_dim(self) -> int:
        """Width of one token's camera vector: 6 * 64 * 2 * 2 = 1536 (spec §5 step 4)."""
        return CAMERA_CHANNELS * PIXELS_PER_LATENT * 4

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config.json") -> "LingbotConfig":
        """Build from a diffusers ``config.json`` dict.

        Raises:
            CheckpointError: unknown keys, ``model_type`` other than ``i2v`` / ``t2v``, or a width not divisible
                by the head count; the message names ``source`` and the keys.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in data if k not in known and k not in _IGNORED)
        if unknown:
            raise CheckpointError(f"{source}: unknown LingBot config keys: {', '.join(unknown)}")
        cfg = cls(**{k: v for k, v in data.items() if k in known})
        if cfg.model_type not in ("i2v", "t2v"):
            raise CheckpointError(f"{source}: model_type must be 'i2v' (LingBot-World, spec §2.1) or 't2v' "
                                  f"(Self-Forcing / LongLive, selfforcing-architecture.md §2), got {cfg.model_type!r}")
        from ..config import check_sizes

        check_sizes(cfg, source)  # integers >= 1; dim into num_heads even heads
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for summaries)."""
        return asdict(self)


A14B = LingbotConfig()


TRAINED_WINDOW = 18  # latent frames the release attends over (README setting, spec §2.2): offsets up to 17


def trained_window(local_attn_size: int) -> int:
    """Latent frames the model attends over, current chunk included: ``local_attn_size``, or the
    release's trained window (18) for a global cache (-1, spec §2.2)."""
    return local_attn_size if local_attn_size > 0 else TRAINED_WINDOW


def official_memory(local_attn_size: int, sink_size: int, frames_per_chunk: int = FRAMES_PER_CHUNK) -> dict:
    """``MemoryConfig`` keyword arguments that reproduce the official cache (spec §7, §14).

    * ``local_attn_size`` -1 (global, the official CLI default): ``full``.
    * no sink: ``sliding`` with ``budget = W - F`` past latent frames (the newest W - F).
    * sink s >= 1: ``sink`` with ``budget = W - F`` and ``sink_frames = s`` (frames 0..s-1 plus the
      newest W - F - s), read at their true offsets (``positions="actual"``: rank-contiguous positions
      change the output, spec §14).

    Raises:
        ValueError: a window that cannot hold the sink and one chunk (``W < s + F``, spec §15.7).
    """
    if local_attn_size == -1:
        return {"cache": "full", "positions": "actual"}
    budget = local_attn_size - frames_per_chunk
    if budget < sink_size or budget < 0 or (sink_size and budget == sink_size):
        raise ValueError(f"local_attn_size {local_attn_size} must exceed sink_size {sink_size} + chunk {frames_per_chunk}")
    if sink_size == 0:
        return {"cache": "sliding", "budget": budget, "positions": "actual"}
    return {"cache": "sink", "budget": budget, "sink_frames": sink_size, "positions": "actual"}
