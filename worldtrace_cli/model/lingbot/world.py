"""A LingBot-World preset's networks on one device: DiT, Wan2.1 VAE, umT5 text encoder (spec §2.1, §13).

Checkpoint folder (``--checkpoint``, spec §13, relative paths from the preset's ``files``):
``transformers/`` (the DiT as a diffusers folder: ``config.json`` + safetensors), ``Wan2.1_VAE.pth``,
``models_t5_umt5-xxl-enc-bf16.pth`` (the umT5-XXL encoder in Wan's module names) and
``google/umt5-xxl/`` (tokenizer). Instead of the ``.pth``, a ``text_encoder/`` folder may hold the same
encoder in Hugging Face format (what diffusers' Wan2.1-I2V repositories ship). A CLIP file (MG2's / Wan2.1's) is optional: LingBot has no image
encoder, the tower only feeds ``--metrics all`` (Scene Drift, PAC).

Random weights (``lingbot-tiny``, ``--random-weights``): the DiT is built on the meta device, made
on the target device in the target dtype and filled with the fixtures' draw scheme
(:func:`~worldtrace_cli.model.dit.init_random_weights`); the text encoder is a one-layer random umT5
of the real output width with a byte tokenizer (a full-size random umT5 would add 5.7 B parameters
and nothing to measure: the text is encoded once per run).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from ...errors import CheckpointError, InputError
from ..checkpoint import WorldModel, file_identity
from ..layout import LINGBOT_ALTERNATIVES, LINGBOT_OPTIONAL_ROLES, lingbot_checkpoint_paths
from .checkpoint import load_lingbot_dit, weight_files
from .dit import LingbotDiT
from .text import ByteTokenizer, UMT5TextEncoder, tiny_umt5

OPTIONAL_ROLES = LINGBOT_OPTIONAL_ROLES
ALTERNATIVES = LINGBOT_ALTERNATIVES  # role -> path used when the preset's file is absent (HF-format umT5)


class LingbotWorld(WorldModel):
    """``dit`` (:class:`LingbotDiT`), ``vae`` (AutoencoderKLWan), ``clip`` (CLIPImageTower or None),
    ``text`` (:class:`UMT5TextEncoder`), ``files`` (checkpoint identities)."""

    def __init__(self, dit, vae, clip, text, files: list[dict]):
        super().__init__(dit, vae, clip, files)
        self.text = text


def checkpoint_paths(preset, folder: str | Path) -> dict[str, Path]:
    """:func:`~worldtrace_cli.model.layout.lingbot_checkpoint_paths` (torch-free, also run with the
    input checks before torch loads)."""
    return lingbot_checkpoint_paths(preset, folder)


def random_dit(cfg, seed: int, device: torch.device, dtype: torch.dtype) -> LingbotDiT:
    """A :class:`LingbotDiT` with seeded random weights, allocated once on ``device`` in ``dtype``
    (full size in bf16: 37 GB, never a float32 copy)."""
    from ..dit import init_random_weights

    with torch.device("meta"):
        dit = LingbotDiT(cfg)
    dit = dit.to(dtype).to_empty(device=device)
    init_random_weights(dit, seed)
    return dit.eval().requires_grad_(False)


def load_text_encoder(paths: dict, dtype: torch.dtype, device: torch.device) -> UMT5TextEncoder:
    """The umT5 encoder of a checkpoint folder (the release's ``.pth`` in Wan's module names, or an HF
    ``text_encoder/`` folder), loaded into host memory and kept there between prompts
    (:meth:`UMT5TextEncoder.keep_on_host`: on a GPU it is there only while a prompt is encoded).

    Raises:
        CheckpointError: an unreadable encoder or tokenizer."""
    if paths["text_encoder"].is_file():
        text = UMT5TextEncoder.from_wan_checkpoint(paths["text_encoder"], paths["tokenizer"], dtype=dtype, device="cpu")
    else:
        text = UMT5TextEncoder.from_pretrained(paths["text_encoder"], paths["tokenizer"], dtype=dtype, device="cpu")
    text.keep_on_host(device)
    return text


def load_lingbot_world(preset, checkpoint: str | Path | None, random_weights: bool, weights_seed: int,
                       device: torch.device, dtype: torch.dtype, full_hash: bool = False) -> LingbotWorld:
    """Build a LingBot preset's networks from a checkpoint folder or seeded random weights.

    The DiT's cache settings are the preset's (``local_attn_size`` / ``sink_size``), as the official
    CLI overrides the checkpoint's ``config.json`` (spec §2.2, §15.2).

    Raises:
        InputError: a checkpoint preset without ``--checkpoint`` and without ``--random-weights``.
        CheckpointError: missing files (one line), a DiT or VAE that does not match, an unreadable
            text encoder or one whose width is not 4096.
    """
    from ..image_encoder import build_clip_tower
    from ..vae import build_wan_vae

    if random_weights or preset.weights == "random":
        dit = random_dit(preset.dit, weights_seed, device, dtype)
        vae = build_wan_vae(preset.vae, None, seed=weights_seed + 1, device=device, dtype=dtype)
        clip = build_clip_tower(preset.clip, None, seed=weights_seed + 2, device=device, dtype=dtype)
        text = UMT5TextEncoder(tiny_umt5(seed=weights_seed + 3), ByteTokenizer())
        text.keep_on_host(device)  # on a GPU only while a prompt is encoded (docs/gpu-memory.md)
        return LingbotWorld(dit, vae, clip, text, [])
    if checkpoint is None:
        raise InputError(f"preset {preset.name} needs --checkpoint DIR (a LingBot-World causal-fast folder holding "
                         f"{', '.join(v for k, v in preset.files.items() if k not in OPTIONAL_ROLES)}) "
                         f"or --random-weights")
    paths = checkpoint_paths(preset, checkpoint)
    dit = load_lingbot_dit(paths["dit"], dtype=dtype, device=device)
    if not dit.cfg.has_camera:  # a Self-Forcing / LongLive folder given to a LingBot preset
        raise CheckpointError(f"{paths['dit']}: model_type t2v is a text-to-video DiT (Self-Forcing / LongLive), "
                              f"not LingBot-World (i2v with a camera branch)")
    if replace(dit.cfg, local_attn_size=-1, sink_size=0) != replace(preset.dit, local_attn_size=-1, sink_size=0):
        raise CheckpointError(f"{paths['dit'] / 'config.json'}: does not describe preset {preset.name}'s model "
                              f"({dit.cfg.to_dict()})")
    dit.cfg = preset.dit
    dit.requires_grad_(False)
    vae = build_wan_vae(preset.vae, paths["vae"], device=device, dtype=dtype)
    text = load_text_encoder(paths, dtype, device)
    width = text.model.config.d_model
    if width != 4096:
        raise CheckpointError(f"{paths['text_encoder']}: umT5 width {width}, the DiT reads 4096 (umT5-XXL)")
    clip = build_clip_tower(preset.clip, paths["clip"], device=device, dtype=dtype) if "clip" in paths else None
    files = [{"role": "dit", **file_identity(f, full_hash)} for f in weight_files(paths["dit"])]
    files += [{"role": role, **file_identity(paths[role], full_hash)} for role in ("vae", "text_encoder", "clip")
              if role in paths and paths[role].is_file()]
    return LingbotWorld(dit, vae, clip, text, files)
