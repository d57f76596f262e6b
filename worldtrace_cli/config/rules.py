"""The value rules of a preset YAML (:func:`worldtrace_cli.config.load_preset` applies them):
types and ranges of its scalar keys, and which architecture, mode and DiT family go together.
Every error is one line naming the file and key."""

from __future__ import annotations

from ..errors import InputError
from ..model.config import SAMPLERS
from .backbones import BACKBONES

# generate --backend: worldtrace's own DiT, or diffusers' WanTransformer3DModel in the same loop (t2v presets)
BACKENDS = ("native", "diffusers")

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


def check_family(raw: dict, dit, source: str, row) -> None:
    """What the preset's backbone row (:class:`~worldtrace_cli.config.backbones.Backbone`) allows: its
    modes (mode ``text`` is Self-Forcing's, selfforcing-architecture.md §1), its DiT's ``model_type``,
    a fixed chunk length, and the ``sampler`` / ``context_noise`` keys only where the preset chooses
    the sampler (MG2; the Wan-DiT families have their own). Raises InputError naming the file and key."""
    from .backbones import BACKBONES

    if raw["mode"] not in row.modes:
        owners = [r.architecture for r in BACKBONES.values() if raw["mode"] in r.modes]
        hint = f" (mode {raw['mode']} needs architecture: {' or '.join(owners)})" if owners else ""
        raise InputError(f"{source}: mode: {row.title} presets run mode {' or '.join(row.modes)}, "
                         f"got {raw['mode']!r}{hint}")
    if not row.preset_sampler and raw.get("sampler", "renoise") != "renoise":
        raise InputError(f"{source}: sampler: {row.title} presets use the model's own sampler; only "
                         f"{' and '.join(r.title for r in BACKBONES.values() if r.preset_sampler)} presets take 'euler'")
    if not row.preset_sampler and raw.get("context_noise", 0):
        raise InputError(f"{source}: context_noise: {row.title} presets take no context noise (its context pass is clean)")
    if row.dit_model_type is not None and dit.model_type != row.dit_model_type:
        others = [r.architecture for r in BACKBONES.values() if r.dit_model_type == dit.model_type]
        hint = f"; model_type {dit.model_type} is architecture: {' or '.join(others)}" if others else ""
        raise InputError(f"{source}: dit: model_type: {row.title}'s DiT is {row.dit_model_type}, got "
                         f"{dit.model_type!r}{hint}")
    if row.chunk_frames and raw.get("frames_per_chunk", 3) != row.chunk_frames:
        raise InputError(f"{source}: frames_per_chunk: {row.title} chunks are {row.chunk_frames} latent frames")




def check_backend(preset, backend: str, compile: str = "none", rope_precision: str = "float32",
                  weights_dtype: str = "auto", offload: str = "auto") -> None:
    """Refuse a ``--backend`` a run of ``preset`` (a :class:`Preset`) cannot take, before anything loads:
    one its backbone row does not list (:attr:`~worldtrace_cli.config.backbones.Backbone.backends`), or
    settings the backend does not take yet (``--compile``, ``--rope-precision float64``, fp8 weights,
    block offloading). Called by :class:`RunConfig` and by ``loopbench run`` before its first job.

    Raises:
        InputError: one line naming the flag (exit 2).
    """
    if backend not in BACKENDS:
        raise InputError(f"--backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "native":
        return
    row = preset.backbone
    if backend not in row.backends:
        runs_it = ", ".join(b.title for b in BACKBONES.values() if backend in b.backends)
        raise InputError(f"--backend {backend}: preset {preset.name} ({row.title}) runs --backend "
                         f"{' | '.join(row.backends)}; {backend} runs the {runs_it} presets")
    for flag, value, default in (("--compile", compile, "none"), ("--rope-precision", rope_precision, "float32"),
                                 ("--weights-dtype", weights_dtype, ("auto", "fit")),
                                 ("--offload", offload, ("auto", "text"))):
        if value not in ((default,) if isinstance(default, str) else default):
            raise InputError(f"--backend {backend} with {flag} {value}: not wired yet (diffusers' float32 "
                             f"RoPE tables, its own compile / casting / offloading APIs); run without {flag}")


__all__ = ["BACKENDS", "check_backend", "check_family", "check_preset_values"]
