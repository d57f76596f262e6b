"""The value rules of a preset YAML (:func:`worldtrace_cli.config.load_preset` applies them):
types and ranges of its scalar keys, and which architecture, mode and DiT family go together.
Every error is one line naming the file and key."""

from __future__ import annotations

from ..errors import InputError
from ..model.config import SAMPLERS

WAN_DIT_ARCHITECTURES = ("lingbot", "selfforcing")  # their ``dit`` is a LingbotConfig (i2v | t2v)


def check_preset_values(raw: dict, source: str) -> None:
    """Types and ranges of a preset's scalar keys (a wrong type must not surface as a traceback when
    the model is built). Raises InputError naming the file and key."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf")

    def integer(v, low=1):
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    rules = {"dit": (lambda v: isinstance(v, dict), "a mapping of DiT config keys"),
             "fps": (number, "a finite number > 0"), "timestep_shift": (number, "a finite number > 0"),
             "frames_per_chunk": (integer, "an integer >= 1"),
             "denoising_steps": (lambda v: isinstance(v, list) and v and all(integer(x, 0) and x <= 1000 for x in v),
                                 "a non-empty list of integer timesteps in [0, 1000]"),
             "landmark_threshold": (lambda v: number(v) and v <= 2, "a cosine distance in (0, 2]"),
             "sampler": (lambda v: v in SAMPLERS, f"one of {', '.join(SAMPLERS)}"),
             "context_noise": (lambda v: integer(v, 0) and v < 1000, "an integer timestep in [0, 1000)"),
             **{k: (lambda v: isinstance(v, str), "a string") for k in ("description", "vae", "clip", "bundle")},
             "files": (lambda v: v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in v.values())),
                       "a mapping of roles to file names")}
    for key, (ok, want) in rules.items():
        if key in raw and not (raw[key] is None and key in ("bundle", "files")) and not ok(raw[key]):
            raise InputError(f"{source}: {key}: must be {want}, got {raw[key]!r}"[:300])


def check_family(raw: dict, dit, source: str) -> None:
    """A ``selfforcing`` preset is a ``t2v`` DiT in mode ``text`` with chunks of 3 latent frames
    (selfforcing-architecture.md §1); mode ``text`` belongs to it alone, and LingBot-World is ``i2v``;
    the ``sampler`` and ``context_noise`` keys are MG2's (the Wan-DiT families have their own samplers).
    Raises InputError naming the file and key."""
    arch = raw.get("architecture", "mg2")
    if arch in WAN_DIT_ARCHITECTURES and raw.get("sampler", "renoise") != "renoise":
        own = "LingBot presets use LingBot's own" if arch == "lingbot" else "they use their own 4-step"
        raise InputError(f"{source}: sampler: {own} sampler; only MG2-architecture presets take 'euler'")
    if arch in WAN_DIT_ARCHITECTURES and raw.get("context_noise", 0):
        raise InputError(f"{source}: context_noise: only MG2-architecture presets take a context noise")
    if arch == "selfforcing":
        if dit.model_type != "t2v":
            raise InputError(f"{source}: dit: model_type: a selfforcing preset is a t2v DiT, got {dit.model_type!r}")
        if raw["mode"] != "text":
            raise InputError(f"{source}: mode: a selfforcing preset runs prompt segments (mode text), got {raw['mode']!r}")
        if raw.get("frames_per_chunk", 3) != 3:
            raise InputError(f"{source}: frames_per_chunk: Self-Forcing / LongLive v1.0 chunks are 3 latent frames")
    elif raw["mode"] == "text":
        raise InputError(f"{source}: mode: text (prompt segments) needs architecture: selfforcing, got {arch}")
    elif arch == "lingbot" and dit.model_type != "i2v":
        raise InputError(f"{source}: dit: model_type: LingBot-World is i2v; a t2v DiT is architecture: selfforcing")


__all__ = ["WAN_DIT_ARCHITECTURES", "check_family", "check_preset_values"]
