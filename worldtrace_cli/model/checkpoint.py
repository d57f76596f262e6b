"""Loading and validating official MG2 DiT weights (MG2 spec §4, §15, §18).

Only safe formats are read: safetensors, or ``torch.load(weights_only=True)`` for ``.pt``/``.pth``.
Official DiT files store names with a ``model.`` prefix; files with or without it load.
Mismatches raise :class:`~worldtrace_cli.errors.CheckpointError` with a one-line message naming
the missing / unexpected keys and wrong shapes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError
from .layout import resolve_checkpoint_files  # noqa: F401  (re-exported; torch-free)
from .weights import (check_state_dict, dequantize_int8, file_identity, read_json, read_state_dict,  # noqa: F401
                      strip_prefix)  # (re-exported)


def load_dit_weights(model: nn.Module, path: str | Path) -> None:
    """Load an official DiT file (with or without ``model.`` prefix) strictly into ``model``.

    Values are converted to the model's dtype (e.g. bf16 files into an fp32 model: exact upcast).
    """
    sd = strip_prefix(read_state_dict(path))
    check_state_dict(model, sd, str(path))
    model.load_state_dict(sd, strict=True)


class WorldModel:
    """The three networks of a preset on one device: ``dit`` (CausalWanDiT), ``vae``
    (diffusers AutoencoderKLWan), ``clip`` (CLIPImageTower); ``files`` lists checkpoint identities."""

    def __init__(self, dit, vae, clip, files: list[dict]):
        self.dit, self.vae, self.clip, self.files = dit, vae, clip, files


def load_world_model(preset, checkpoint: str | Path | None, random_weights: bool, weights_seed: int,
                      device: torch.device, dtype: torch.dtype, full_hash: bool = False) -> WorldModel:
    """Build a preset's DiT, VAE and CLIP tower, from an official folder or seeded random weights.

    Random weights (``tiny`` preset, or ``--random-weights``) follow :func:`init_random_weights` for
    the DiT and the helpers of :mod:`.vae` / :mod:`.image_encoder`. Checkpoint DiTs are built on the
    meta device and filled from the file, then cast to ``dtype`` on ``device``.

    Raises:
        CheckpointError: missing files, wrong keys/shapes, unreadable files.
        InputError: a checkpoint preset without ``--checkpoint`` and without ``--random-weights``.
    """
    from ..errors import InputError
    from .dit import CausalWanDiT, init_random_weights
    from .vae import build_wan_vae

    use_random = random_weights or preset.weights == "random"
    if preset.weights == "bundled" and checkpoint is not None:
        raise InputError(f"--checkpoint: preset {preset.name} ships its own weights ({preset.bundle}); "
                         f"drop --checkpoint, or choose an mg2-* preset")
    if preset.weights == "bundled" and not use_random:
        return _load_bundle(preset, device, dtype, full_hash)
    if use_random:
        with torch.device(device):
            dit = CausalWanDiT(preset.dit)
        init_random_weights(dit, weights_seed)
        dit = dit.to(dtype)
        vae = build_wan_vae(preset.vae, None, seed=weights_seed + 1, device=device, dtype=dtype)
        clip = load_clip_tower(preset, None, True, weights_seed, device, dtype)
        return WorldModel(dit.eval().requires_grad_(False), vae, clip, [])
    if checkpoint is None:
        raise InputError(f"preset {preset.name} needs --checkpoint DIR (an official Matrix-Game-2.0 folder "
                         f"holding {', '.join(preset.files.values())}) or --random-weights")
    paths = resolve_checkpoint_files(preset.files, checkpoint, preset.name)
    with torch.device("meta"):
        dit = CausalWanDiT(preset.dit)
    sd = strip_prefix(read_state_dict(paths["dit"]))
    check_state_dict(dit, sd, str(paths["dit"]))
    dit.load_state_dict(sd, strict=True, assign=True)
    dit = dit.to(device=device, dtype=dtype).eval().requires_grad_(False)
    vae = build_wan_vae(preset.vae, paths["vae"], device=device, dtype=dtype)
    clip = load_clip_tower(preset, checkpoint, False, weights_seed, device, dtype)
    files = [{"role": role, **file_identity(p, full_hash)} for role, p in paths.items()]
    return WorldModel(dit, vae, clip, files)


BUNDLE_PARTS = ("dit", "vae", "clip")


def bundle_path(preset) -> Path:
    """The weights file of a ``bundled`` preset: ``preset.bundle`` if absolute, else in the package's
    presets folder."""
    from importlib import resources

    path = Path(preset.bundle)
    return path if path.is_absolute() else Path(str(resources.files("worldtrace_cli.presets").joinpath(preset.bundle)))


def split_bundle(sd: dict[str, torch.Tensor], source: str) -> dict[str, dict[str, torch.Tensor]]:
    """``{"dit": {...}, "vae": {...}, "clip": {...}}`` from a bundle's ``dit.*``/``vae.*``/``clip.*`` keys.

    Tensors stored in int8 (``train export --dit-format int8``) come back as float32
    (:func:`~worldtrace_cli.model.weights.dequantize_int8`).

    Raises:
        CheckpointError: a key outside the three parts, a part missing, or a malformed int8 tensor.
    """
    parts: dict[str, dict[str, torch.Tensor]] = {p: {} for p in BUNDLE_PARTS}
    for key, value in dequantize_int8(sd, source).items():
        part, _, name = key.partition(".")
        if part not in parts or not name:
            raise CheckpointError(f"{source}: unexpected key {key!r} (a bundle holds dit.*, vae.*, clip.*)")
        parts[part][name] = value
    missing = [p for p, d in parts.items() if not d]
    if missing:
        raise CheckpointError(f"{source}: no {', '.join(missing)} weights in the bundle")
    return parts


def _load_bundle(preset, device: torch.device, dtype: torch.dtype, full_hash: bool) -> WorldModel:
    """A ``bundled`` preset's DiT, VAE and CLIP tower from its one safetensors file (strict keys)."""
    from .dit import CausalWanDiT
    from .image_encoder import build_clip_tower
    from .vae import build_wan_vae

    path = bundle_path(preset)
    parts = split_bundle(read_state_dict(path), str(path))
    with torch.device("meta"):
        dit = CausalWanDiT(preset.dit)
    check_state_dict(dit, parts["dit"], f"{path} (dit.*)")
    dit.load_state_dict({k: v.float() for k, v in parts["dit"].items()}, strict=True, assign=True)
    dit = dit.to(device=device, dtype=dtype).eval().requires_grad_(False)
    vae = build_wan_vae(preset.vae, parts["vae"], device=device, dtype=dtype)
    clip = build_clip_tower(preset.clip, None, device="cpu", dtype=torch.float32)
    check_state_dict(clip.model, parts["clip"], f"{path} (clip.*)")
    clip.model.load_state_dict(parts["clip"], strict=True)
    clip = clip.to(device=device, dtype=dtype)
    return WorldModel(dit, vae, clip, [{"role": "bundle", **file_identity(path, full_hash)}])


def load_clip_tower(preset, checkpoint: str | Path | None, random_weights: bool, weights_seed: int,
                    device: torch.device, dtype: torch.dtype):
    """The preset's CLIP image tower alone (e.g. for ``worldtrace metrics``): the same weights
    :func:`load_world_model` gives (random: seed ``weights_seed + 2``; else the checkpoint file).

    Raises:
        CheckpointError: missing or unreadable CLIP file.
    """
    from .image_encoder import build_clip_tower

    if preset.weights == "bundled" and not random_weights:
        tower = build_clip_tower(preset.clip, None, device="cpu", dtype=torch.float32)
        path = bundle_path(preset)
        tower.model.load_state_dict(split_bundle(read_state_dict(path), str(path))["clip"], strict=True)
        return tower.to(device=device, dtype=dtype)
    if random_weights or preset.weights == "random" or checkpoint is None:
        return build_clip_tower(preset.clip, None, seed=weights_seed + 2, device=device, dtype=dtype)
    path = resolve_checkpoint_files({"clip": preset.files["clip"]}, checkpoint, preset.name)["clip"]
    return build_clip_tower(preset.clip, path, device=device, dtype=dtype)
