"""Constructor configuration of the MG2 causal Wan DiT, read from the official ``config.json``.

Field names and defaults are those of the official ``CausalWanModel`` config (MG2 spec §2.1).
Unknown keys are errors; keys the official code stores but never uses are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import CheckpointError

# the names a preset's ``sampler`` takes: MG2's x0-then-fresh-noise step | the deterministic flow-ODE
# (Euler) step (:func:`worldtrace_cli.model.sampler.next_x`); torch-free, so presets check it early
SAMPLERS = ("renoise", "euler")

ACTION_ROPE_THETA = 256.0  # the action module's 1-D RoPE (MG2 spec §8): theta
ACTION_ROPE_CHANNELS = 8   # rotated channels of each action-attention head

# Stored in official configs but without effect on inference (MG2 spec §2.1, §16.4, §16.16).
_IGNORED_TOP = {"_class_name", "_diffusers_version", "text_len", "model_type", "inject_sample_info",
                "text_dim", "patch_size", "qk_norm", "cross_attn_norm", "window_size"}
_IGNORED_ACTION = {"rope_dim_list", "patch_size", "qk_norm", "qkv_bias"}


SIZE_FIELDS = ("dim", "ffn_dim", "freq_dim", "num_heads", "num_layers", "in_dim", "out_dim")


def check_sizes(cfg, source: str, names=SIZE_FIELDS) -> None:
    """The widths of a DiT config: each of ``names`` it has an integer >= 1, ``dim`` divisible by
    ``num_heads`` into an even head dim (RoPE rotates channel pairs). Shared by MG2's and the Wan-DiT
    families' configs (a fixture config with ``num_heads: 0`` was a ZeroDivisionError).

    Raises:
        CheckpointError: one line naming ``source`` and the field."""
    for name in names:
        value = getattr(cfg, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{source}: {name}: must be an integer >= 1, got {value!r}")
    if cfg.dim % cfg.num_heads or (cfg.dim // cfg.num_heads) % 2:
        raise CheckpointError(f"{source}: dim {cfg.dim} / num_heads {cfg.num_heads}: must give an even integer head "
                              f"dim (RoPE rotates channel pairs)")


def _check_types(cls, values: dict[str, Any], source: str, prefix: str) -> None:
    """Each value has its field's type: a positive int (sink_size: >= 0), a positive number, a bool,
    or a tuple of ints >= 0. Raises CheckpointError naming the key."""
    for f in fields(cls):
        if f.name not in values or f.name == "action_config":
            continue
        v, default = values[f.name], f.default
        if isinstance(default, bool):
            ok, want = isinstance(v, bool), "true or false"
        elif isinstance(default, int):
            low = 0 if f.name == "sink_size" else 1
            ok, want = isinstance(v, int) and not isinstance(v, bool) and v >= low, f"an integer >= {low}"
        elif isinstance(default, float):
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")
            want = "a finite number > 0"
        else:  # tuples of ints
            ok = isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
            want = "a list of integers >= 0"
        if not ok:
            raise CheckpointError(f"{source}: {prefix}{f.name}: must be {want}, got {v!r}")


@dataclass(frozen=True)
class ActionConfig:
    """Keyboard/mouse action module configuration (``action_config`` in config.json, spec §8)."""

    blocks: tuple[int, ...] = tuple(range(15))
    enable_mouse: bool = True
    enable_keyboard: bool = True
    heads_num: int = 16
    hidden_size: int = 128          # keyboard embedding width
    img_hidden_size: int = 1536     # must equal the DiT width
    keyboard_dim_in: int = 4
    keyboard_hidden_dim: int = 1024
    mouse_dim_in: int = 2
    mouse_hidden_dim: int = 1024
    mouse_qk_dim_list: tuple[int, ...] = (8, 28, 28)
    rope_theta: float = 256.0
    vae_time_compression_ratio: int = 4
    windows_size: int = 3

    @property
    def window_rows(self) -> int:
        """Action rows (pixel frames) each latent frame reads: 4 * 3 = 12 (spec §8)."""
        return self.vae_time_compression_ratio * self.windows_size


@dataclass(frozen=True)
class DiTConfig:
    """Causal Wan DiT configuration (spec §2.1). ``clip_dim`` is worldtrace's own: the width of the
    CLIP tokens fed to ``img_emb`` (1280 for ViT-H/14; smaller for the tiny preset)."""

    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256
    num_heads: int = 12
    num_layers: int = 30
    in_dim: int = 36
    out_dim: int = 16
    eps: float = 1e-6
    local_attn_size: int = 6
    sink_size: int = 0
    clip_dim: int = 1280
    action_config: ActionConfig = field(default_factory=ActionConfig)

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> "DiTConfig":
        """Build from an official config.json dict.

        Raises:
            CheckpointError: unknown keys (named), a width that is not an integer >= 1 or a ``dim`` that
                does not split into ``num_heads`` even heads (:func:`check_sizes`), ``local_attn_size`` < 1,
                ``img_hidden_size`` != ``dim``,
                or a value the model code fixes that differs from MG2's (``sink_size`` 0, action
                ``rope_theta`` 256, 8 rotated action channels, keyboard branch on).
        """
        raw = dict(raw)
        action = dict(raw.pop("action_config", {}) or {})
        top_names = {f.name for f in fields(cls)} - {"action_config"}
        act_names = {f.name for f in fields(ActionConfig)}
        unknown = sorted(k for k in raw if k not in top_names and k not in _IGNORED_TOP)
        unknown += sorted(f"action_config.{k}" for k in action if k not in act_names and k not in _IGNORED_ACTION)
        if unknown:
            raise CheckpointError(f"{source}: unknown config keys: {', '.join(unknown)}")
        act_kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in action.items() if k in act_names}
        kwargs = {k: v for k, v in raw.items() if k in top_names}
        _check_types(cls, kwargs, source, "")
        _check_types(ActionConfig, act_kwargs, source, "action_config.")
        cfg = cls(**kwargs, action_config=ActionConfig(**act_kwargs))
        check_sizes(cfg, source)
        if cfg.local_attn_size < 1:
            raise CheckpointError(f"{source}: local_attn_size must be >= 1 (the global-attention "
                                  f"foundation model cannot run causally, spec §2.1)")
        # values the model code fixes (MG2 uses exactly these): refuse others rather than run a different model
        act = cfg.action_config
        fixed = {"sink_size": (cfg.sink_size, 0), "action_config.rope_theta": (act.rope_theta, ACTION_ROPE_THETA),
                 "action_config.mouse_qk_dim_list[0]": (act.mouse_qk_dim_list[0], ACTION_ROPE_CHANNELS),
                 "action_config.enable_keyboard": (act.enable_keyboard, True)}
        for name, (value, supported) in fixed.items():
            if value != supported:
                hint = "; --cache sink keeps sink frames" if name == "sink_size" else ""
                raise CheckpointError(f"{source}: {name} = {value!r} is not supported (worldtrace implements "
                                      f"{supported!r}, the value of every MG2 model{hint})")
        if cfg.action_config.img_hidden_size != cfg.dim:
            raise CheckpointError(f"{source}: action_config.img_hidden_size "
                                  f"{cfg.action_config.img_hidden_size} != dim {cfg.dim}")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (lists, not tuples) for summary.json."""
        d = asdict(self)
        d["action_config"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["action_config"].items()}
        return d
