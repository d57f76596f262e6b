"""A Self-Forcing / LongLive preset's networks on one device: the t2v DiT, the Wan2.1 VAE, umT5.

Checkpoint folder (``--checkpoint``): the root of the Self-Forcing repository as its README sets it
up (selfforcing-architecture.md §0, §2), relative paths from the preset's ``files``:

* ``checkpoints/self_forcing_dmd.pt``: a ``torch.save`` of ``{"generator": sd, "generator_ema": sd}``
  (keys prefixed ``model.``: the wrapper's attribute); the EMA weights are the ones the official
  ``inference.py --use_ema`` samples with, and the ones read here (``generator`` when there is no EMA);
* LongLive v1.0 (``longlive``): ``longlive_models/models/longlive_base.pt`` (``generator``, as its
  configs' ``use_ema: false``) and ``longlive_models/models/lora.pt`` (merged at load, scale 1);
* ``wan_models/Wan2.1-T2V-1.3B/``: ``Wan2.1_VAE.pth``, ``models_t5_umt5-xxl-enc-bf16.pth`` and the
  ``google/umt5-xxl/`` tokenizer, the same encoder LingBot-World reads
  (:class:`~worldtrace_cli.model.lingbot.text.UMT5TextEncoder`).

Instead of the ``.pt``, the DiT may be a diffusers ``WanTransformer3DModel`` folder (``--checkpoint`` naming it
or a pipeline folder holding it as ``transformer/``; the VAE and umT5 then at the preset's paths or the pipeline's
``vae/``, ``text_encoder/``, ``tokenizer/``): :mod:`~worldtrace_cli.model.diffusers_folder` checks it before
anything loads (:func:`~worldtrace_cli.model.layout.diffusers_checkpoint_paths`).

Random weights (``self-forcing-tiny``, ``longlive-tiny``, ``--random-weights``): exactly LingBot's
random path (:func:`~worldtrace_cli.model.lingbot.world.load_lingbot_world`) on a ``t2v`` config; a
``--checkpoint`` diffusers folder given to such a preset (not with ``--random-weights``) replaces its DiT alone.
The files are never bundled (Self-Forcing's weights are CC BY-NC-SA 4.0, LongLive's licence unstated).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import CheckpointError, InputError
from ..checkpoint import file_identity
from ..diffusers_folder import DiffusersDiT, diffusers_dit_folder, read_diffusers_dit
from ..layout import diffusers_checkpoint_paths, takes_diffusers_dit
from ..lingbot.dit import LingbotDiT
from ..lingbot.world import LingbotWorld, checkpoint_paths, load_lingbot_world, load_text_encoder
from ..weights import check_state_dict, read_weights_file

GENERATOR_KEYS = ("generator_ema", "generator")  # self_forcing_dmd.pt's entries, the EMA preferred (--use_ema)
LONGLIVE_KEYS = ("generator", "model", "generator_ema")  # longlive_base.pt: its configs set use_ema: false
PREFIX = "model."  # WanDiffusionWrapper.model


def read_generator(path: str | Path, keys: tuple[str, ...] = GENERATOR_KEYS) -> tuple[dict[str, torch.Tensor], str]:
    """The DiT state dict of a Self-Forcing / LongLive training checkpoint (``.pt``: the first of
    ``keys`` present, keys with the ``model.`` prefix dropped) or of a flat ``.pt`` / ``.safetensors``.
    Read with ``weights_only=True`` (tensors only, memory-mapped). Returns (state dict, entry name).

    Raises:
        CheckpointError: missing or unreadable file, Python objects besides tensors, no generator entry.
    """
    raw = read_weights_file(path)
    entry = next((k for k in keys if isinstance(raw, dict) and isinstance(raw.get(k), dict)), None)
    sd = raw[entry] if entry else raw
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: no DiT state dict (expected {' or '.join(keys)}, or a flat one)")
    if all(k.startswith(PREFIX) for k in sd):
        sd = {k[len(PREFIX):]: v for k, v in sd.items()}
    return sd, entry or "state dict"


def load_selfforcing_dit(path: str | Path | DiffusersDiT, cfg, dtype: torch.dtype, device: torch.device,
                         lora: str | Path | None = None, lora_alpha: float | None = None) -> LingbotDiT:
    """A ``t2v`` :class:`LingbotDiT` of ``cfg`` filled strictly from ``path`` (:func:`read_generator`; or a
    checked diffusers folder, :func:`~worldtrace_cli.model.diffusers_folder.read_diffusers_dit`;
    with ``lora``, LongLive's entry order :data:`LONGLIVE_KEYS` and its adapter merged in float32 before
    the cast to ``dtype``: :func:`~worldtrace_cli.model.selfforcing.lora.merge_lora`, scale
    ``lora_alpha / rank``, 1 when None).

    Raises:
        CheckpointError: unreadable file, missing / unexpected / mis-shaped keys (one line naming them),
            a LoRA that does not fit.
    """
    if isinstance(path, DiffusersDiT):
        sd, source = read_diffusers_dit(path), str(path.folder)
    else:
        (sd, _), source = read_generator(path, LONGLIVE_KEYS if lora else GENERATOR_KEYS), str(path)
    with torch.device("meta"):
        dit = LingbotDiT(cfg)
    check_state_dict(dit, sd, source)
    dit.load_state_dict(sd, strict=True, assign=True)
    if lora is not None:
        from .lora import merge_lora, read_lora

        dit = dit.float()
        merge_lora(dit, read_lora(lora), lora_alpha, str(lora))
    return dit.to(device=device, dtype=dtype).eval().requires_grad_(False)


def load_selfforcing_world(preset, checkpoint: str | Path | None, random_weights: bool, weights_seed: int,
                           device: torch.device, dtype: torch.dtype, full_hash: bool = False) -> LingbotWorld:
    """Build a ``selfforcing`` preset's networks (``world.dit``, ``vae``, ``text``, ``clip`` or None).

    Raises:
        InputError: a checkpoint preset without ``--checkpoint`` and without ``--random-weights``.
        CheckpointError: missing files (one line), a DiT state dict that does not match the preset,
            an unreadable text encoder or one whose width is not 4096.
    """
    from ..image_encoder import build_clip_tower
    from ..vae import build_wan_vae

    diffusers = (checkpoint is not None and not random_weights and takes_diffusers_dit(preset)
                 and (preset.weights == "random" or diffusers_dit_folder(checkpoint) is not None))
    if random_weights or preset.weights == "random":
        paths = diffusers_checkpoint_paths(preset, checkpoint) if diffusers else {}  # checked before anything loads
        world = load_lingbot_world(preset, None, True, weights_seed, device, dtype)
        if diffusers:  # the preset's random VAE and text encoder, the folder's DiT
            world.dit = load_selfforcing_dit(paths["dit"], preset.dit, dtype, device)
            world.files = [{"role": "dit", **file_identity(f, full_hash)} for f in paths["dit"].files]
        return world
    if checkpoint is None:
        raise InputError(f"preset {preset.name} needs --checkpoint DIR (the Self-Forcing or LongLive repository root holding "
                         f"{', '.join(preset.files.values())}, or a diffusers Wan T2V folder: docs/diffusers.md) "
                         f"or --random-weights")
    paths = diffusers_checkpoint_paths(preset, checkpoint) if diffusers else checkpoint_paths(preset, checkpoint)
    dit = load_selfforcing_dit(paths["dit"], preset.dit, dtype, device, paths.get("lora"))
    vae = build_wan_vae(preset.vae, paths["vae"], device=device, dtype=dtype)
    text = load_text_encoder(paths, dtype, device)  # in host memory between prompts
    if text.model.config.d_model != 4096:
        raise CheckpointError(f"{paths['text_encoder']}: umT5 width {text.model.config.d_model}, the DiT reads 4096")
    clip = build_clip_tower(preset.clip, paths["clip"], device=device, dtype=dtype) if "clip" in paths else None
    dit_files = [paths["dit"]] if not diffusers else list(paths["dit"].files)
    files = [{"role": "dit", **file_identity(f, full_hash)} for f in dit_files]
    files += [{"role": role, **file_identity(paths[role], full_hash)} for role in ("vae", "text_encoder", "clip")
              if role in paths and paths[role].is_file()]
    return LingbotWorld(dit, vae, clip, text, files)


__all__ = ["GENERATOR_KEYS", "LONGLIVE_KEYS", "load_selfforcing_dit", "load_selfforcing_world", "read_generator"]
