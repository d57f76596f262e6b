"""CLIP ViT-H/14 image tower (transformers ``CLIPVisionModelWithProjection``) for MG2's visual context.

References: MG2 spec (``docs/reference/mg2-architecture.md``) §12.4; ecosystem notes, section "CLIP ViT-H/14
image tower" (weight names of MG2's ``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``
and their mapping to transformers names).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

from ..errors import CheckpointError
from .weights import check_state_dict, read_state_dict

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

_CONFIG_DIRS = {"vit-h-14": "clip_vit_h14", "tiny": "clip_tiny"}
_LAYER_KEY = re.compile(r"^visual\.transformer\.(\d+)\.")
# Per-layer MG2 (Wan) names -> transformers names; attn.to_qkv is split separately.
_LAYER_MAP = {"norm1": "layer_norm1", "attn.proj": "self_attn.out_proj", "norm2": "layer_norm2",
              "mlp.0": "mlp.fc1", "mlp.2": "mlp.fc2"}
_SHOWN = 4


def clip_config(variant: str = "vit-h-14") -> CLIPVisionConfig:
    """The shipped ``CLIPVisionConfig`` of ``variant``.

    "vit-h-14": MG2's open-clip XLM-RoBERTa-large ViT-H/14 vision tower (hidden 1280, 32 layers,
    16 heads, MLP 5120, GELU, LayerNorm eps 1e-5, projection 1024; spec §12.4).
    "tiny": same 224 px / 14 px patches (257 tokens), hidden 64, 2 layers, projection 32.

    Raises:
        ValueError: unknown variant.
    """
    if variant not in _CONFIG_DIRS:
        raise ValueError(f"unknown CLIP variant {variant!r} (expected one of {', '.join(_CONFIG_DIRS)})")
    path = Path(__file__).parent / "configs" / _CONFIG_DIRS[variant] / "config.json"
    fields = json.loads(path.read_text())
    fields.pop("model_type", None)  # a class attribute of CLIPVisionConfig, kept in the file for readers
    return CLIPVisionConfig(**fields)


def _short_list(items: list[str]) -> str:
    more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def convert_mg2_clip_state_dict(state_dict: dict[str, torch.Tensor], num_layers: int | None = None, *,
                                source: str = "CLIP state dict") -> dict[str, torch.Tensor]:
    """Map MG2's CLIP weights (Wan names, ``visual.*``) to ``CLIPVisionModelWithProjection`` names.

    ``textual.*`` and ``log_scale`` are ignored. ``visual.attn.to_qkv`` is split into q, k, v (in
    that order); ``cls_embedding [1,1,D]`` and ``pos_embedding [1,257,D]`` lose their leading
    singleton dims; ``head [D,P]`` is transposed into ``visual_projection.weight [P,D]``. Tensors
    keep their dtype; no copies are made except for the transposed head.

    Args:
        state_dict: name -> tensor, as stored in
            ``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth``.
        num_layers: transformer layers expected (``None``: as many as the file holds).
        source: what to name in error messages (usually the file path).

    Returns:
        transformers name -> tensor.

    Raises:
        CheckpointError: one line naming missing visual keys, unexpected visual keys, or a fused
            qkv tensor whose first dim is not divisible by 3.
    """
    layer_ids = {int(m.group(1)) for k in state_dict if (m := _LAYER_KEY.match(k))}
    if num_layers is None:
        num_layers = max(layer_ids) + 1 if layer_ids else 0
    needed = ["visual.patch_embedding.weight", "visual.cls_embedding", "visual.pos_embedding",
              "visual.pre_norm.weight", "visual.pre_norm.bias", "visual.post_norm.weight",
              "visual.post_norm.bias", "visual.head"]
    for i in range(num_layers):
        for name in ("attn.to_qkv", *_LAYER_MAP):
            needed += [f"visual.transformer.{i}.{name}.weight", f"visual.transformer.{i}.{name}.bias"]
    visual = {k for k in state_dict if k.startswith("visual.")}
    missing = [k for k in needed if k not in state_dict]
    unexpected = sorted(visual - set(needed))
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing: {_short_list(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected: {_short_list(unexpected)}")
    if problems:
        raise CheckpointError(
            f"{source}: not an MG2 CLIP ViT state dict with {num_layers} layers: {'; '.join(problems)}")

    sd = state_dict
    out = {
        "vision_model.embeddings.patch_embedding.weight": sd["visual.patch_embedding.weight"],
        "vision_model.embeddings.class_embedding": sd["visual.cls_embedding"].reshape(-1),
        "vision_model.embeddings.position_embedding.weight": sd["visual.pos_embedding"].flatten(0, -2),
        "vision_model.pre_layrnorm.weight": sd["visual.pre_norm.weight"],
        "vision_model.pre_layrnorm.bias": sd["visual.pre_norm.bias"],
        "vision_model.post_layernorm.weight": sd["visual.post_norm.weight"],
        "vision_model.post_layernorm.bias": sd["visual.post_norm.bias"],
        "visual_projection.weight": sd["visual.head"].t().contiguous(),
    }
    for i in range(num_layers):
        src, dst = f"visual.transformer.{i}.", f"vision_model.encoder.layers.{i}."
        for kind in ("weight", "bias"):
            qkv = sd[f"{src}attn.to_qkv.{kind}"]
            if qkv.shape[0] % 3:
                raise CheckpointError(f"{source}: {src}attn.to_qkv.{kind} has {qkv.shape[0]} rows, not a multiple of 3")
            for name, part in zip(("q_proj", "k_proj", "v_proj"), qkv.chunk(3, dim=0)):
                out[f"{dst}self_attn.{name}.{kind}"] = part
            for old, new in _LAYER_MAP.items():
                out[f"{dst}{new}.{kind}"] = sd[f"{src}{old}.{kind}"]
    return out


class CLIPImageTower(torch.nn.Module):
    """MG2's CLIP image conditioning around a transformers ``CLIPVisionModelWithProjection``.

    Attributes:
        model: the wrapped transformers model.
        hidden_size: token width (1280 for ViT-H/14).
        image_size: input resolution of the tower (224).
    """

    def __init__(self, model: CLIPVisionModelWithProjection):
        super().__init__()
        self.model = model
        self.hidden_size = model.config.hidden_size
        self.image_size = model.config.image_size

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """MG2's CLIP preprocessing (spec §12.4), computed in float32.

        ``[B, 3, H, W]`` in [-1, 1] -> bicubic resize to 224x224 (squash, no crop, no antialias,
        ``align_corners=False``) -> ``x * 0.5 + 0.5`` -> ``(x - mean) / std`` with OpenAI's CLIP
        mean/std. Returns float32 ``[B, 3, 224, 224]`` on the tower's device.

        Raises:
            ValueError: images not ``[B, 3, H, W]``.
        """
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be [B, 3, H, W], got {list(images.shape)}")
        device = self.model.device
        # Constants stay float32 even when the tower is cast to bf16/fp16.
        mean = torch.tensor(OPENAI_CLIP_MEAN, device=device).view(1, 3, 1, 1)
        std = torch.tensor(OPENAI_CLIP_STD, device=device).view(1, 3, 1, 1)
        x = images.to(device=device, dtype=torch.float32)
        x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bicubic", align_corners=False)
        return (x * 0.5 + 0.5 - mean) / std

    def _forward(self, images: torch.Tensor):
        pixels = self.preprocess(images).to(self.model.dtype)
        return self.model(pixel_values=pixels, output_hidden_states=True)

    @torch.no_grad()
    def conditioning_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """MG2's visual context: the token sequence after the penultimate block (spec §12.4).

        Args:
            images: ``[B, 3, H, W]`` in [-1, 1], any float dtype.

        Returns:
            ``[B, 257, hidden_size]`` (CLS + 16x16 patches) in the tower's dtype: ``hidden_states[-2]``
            of the transformers model, without post-LayerNorm or projection.
        """
        return self._forward(images).hidden_states[-2]

    @torch.no_grad()
    def image_embeds(self, images: torch.Tensor) -> torch.Tensor:
        """Standard CLIP image embedding (post-LayerNorm CLS token, projected), for CLIP metrics.

        Args:
            images: ``[B, 3, H, W]`` in [-1, 1].

        Returns:
            ``[B, projection_dim]`` (1024 for ViT-H/14) in the tower's dtype, not L2-normalised.
        """
        pixels = self.preprocess(images).to(self.model.dtype)
        return self.model(pixel_values=pixels).image_embeds


def build_clip_tower(variant: str = "vit-h-14", weights: str | Path | None = None, *, seed: int = 0,
                     device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> CLIPImageTower:
    """Build the CLIP image tower with seeded random or MG2 weights.

    Args:
        variant: "vit-h-14" or "tiny" (:func:`clip_config`).
        weights: ``None`` for transformers' random init seeded with ``seed`` (global torch RNG
            state restored afterwards), or MG2's
            ``models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth`` (``torch.load`` with
            ``weights_only=True``, memory-mapped; ``.safetensors`` with the same keys also works),
            converted with :func:`convert_mg2_clip_state_dict` and loaded strictly.
        device, dtype: where the returned tower lives.

    Returns:
        :class:`CLIPImageTower` in eval mode with ``requires_grad`` False.

    Raises:
        ValueError: unknown variant.
        CheckpointError: missing/unreadable file, missing or unexpected visual keys, wrong shapes
            (one line naming the file).
    """
    config = clip_config(variant)
    if weights is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = CLIPVisionModelWithProjection(config)
    else:
        sd = convert_mg2_clip_state_dict(read_state_dict(weights), config.num_hidden_layers, source=str(weights))
        # Built on meta to skip a 632M-parameter random init; non-persistent buffers (position_ids)
        # are not in the state dict, so they are rebuilt below and a final check makes sure nothing
        # stays on meta (transformers models silently return garbage otherwise).
        with torch.device("meta"):
            model = CLIPVisionModelWithProjection(config)
        check_state_dict(model, sd, str(weights))
        model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True, assign=True)
        emb = model.vision_model.embeddings
        emb.position_ids = torch.arange(emb.num_positions).expand(1, -1)
        if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            raise RuntimeError("CLIPVisionModelWithProjection kept meta tensors after loading (transformers changed?)")
    tower = CLIPImageTower(model.eval())
    return tower.to(device=device, dtype=dtype).eval().requires_grad_(False)


__all__ = ["CLIPImageTower", "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD", "build_clip_tower", "clip_config",
           "convert_mg2_clip_state_dict"]
