"""MG2 conditioning: start image loading/preprocessing, ``cond_concat`` and CLIP visual context.

References: MG2 spec (``docs/reference/mg2-architecture.md``) §12.1-12.4; ecosystem notes ("PIL alone reproduces
MG2's frame preprocessing bit for bit").
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from .vae import CONDITIONING_ENCODE_LATENT_FRAMES, encode_conditioning_latents

MASK_CHANNELS = 4


def preprocess_image(image: Image.Image, height: int, width: int) -> torch.Tensor:
    """MG2's start-frame preprocessing (spec §12.1), for any target ``height x width``.

    Centre-crop to the aspect ``height:width`` (taller than the target: keep the width,
    ``h' = int(w * height / width)``; otherwise keep the height, ``w' = int(h * width / height)``;
    the crop box is centred with float coordinates that PIL rounds), resize to ``(width, height)``
    with PIL bilinear (antialiased), ``/ 255``, then ``(x - 0.5) / 0.5``. Equals MG2's torchvision
    path bit for bit.

    Args:
        image: a PIL image (converted to RGB if needed).
        height, width: target size in pixels (positive).

    Returns:
        float32 ``[1, 3, height, width]`` in [-1, 1].

    Raises:
        ValueError: non-positive target size, or an image so thin that the crop is empty.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"target size must be positive, got {height}x{width}")
    image = image.convert("RGB")
    w, h = image.size
    if h / w > height / width:
        new_w, new_h = w, int(w * height / width)
    else:
        new_w, new_h = int(h * width / height), h
    if new_w < 1 or new_h < 1:
        raise ValueError(f"a {w}x{h} image cannot be centre-cropped to the aspect {width}:{height}")
    box = ((w - new_w) / 2, (h - new_h) / 2, (w + new_w) / 2, (h + new_h) / 2)
    image = image.crop(box).resize((width, height), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255.0)
    return ((x - 0.5) / 0.5).unsqueeze(0)


class ConditioningLatents:
    """Per-frame conditioning channels (``cond_concat``) for any latent frame range (spec §12.2-12.3).

    Holds only the K <= 31 encoded image latents; frame ``f >= K`` reuses frame ``K-1`` (exact,
    see :data:`~worldtrace_cli.model.vae.CONDITIONING_ENCODE_LATENT_FRAMES`), so memory does not
    grow with the rollout length.

    Attributes:
        image_latents: float32 ``[1, 16, K, h, w]``, normalised.
    """

    def __init__(self, image_latents: torch.Tensor):
        if image_latents.ndim != 5 or image_latents.shape[:2] != (1, 16) or image_latents.shape[2] < 1:
            raise ValueError(f"image_latents must be [1, 16, K, h, w] with K >= 1, got {list(image_latents.shape)}")
        self.image_latents = image_latents.float()

    @property
    def num_encoded_frames(self) -> int:
        """K, the number of latent frames actually encoded."""
        return self.image_latents.shape[2]

    def cond_concat(self, start: int, count: int) -> torch.Tensor:
        """``cond_concat`` for absolute latent frames ``start .. start+count-1``.

        Returns:
            float32 ``[1, 20, count, h, w]`` on the latents' device: channels 0-3 the mask (1.0 at
            absolute latent frame 0 only, else 0.0), channels 4-19 the image latents of frame
            ``min(f, K-1)``.

        Raises:
            ValueError: ``start < 0`` or ``count < 1``.
        """
        if start < 0 or count < 1:
            raise ValueError(f"need start >= 0 and count >= 1, got start={start}, count={count}")
        lat = self.image_latents
        index = torch.arange(start, start + count, device=lat.device).clamp_(max=lat.shape[2] - 1)
        frames = lat.index_select(2, index)
        mask = torch.zeros(1, MASK_CHANNELS, count, *lat.shape[3:], device=lat.device, dtype=torch.float32)
        if start == 0:
            mask[:, :, 0] = 1.0
        return torch.cat([mask, frames], dim=1)


@torch.no_grad()
def build_conditioning(image: torch.Tensor, vae, clip_tower, num_latent_frames: int
                       ) -> tuple[ConditioningLatents, torch.Tensor]:
    """Encode the start image into MG2's two conditions (spec §12.2-12.4).

    Args:
        image: ``[1, 3, H, W]`` in [-1, 1] (from :func:`preprocess_image`), H, W multiples of 8.
        vae: Wan 2.1 ``AutoencoderKLWan`` (:func:`~worldtrace_cli.model.vae.build_wan_vae`).
        clip_tower: :class:`~worldtrace_cli.model.image_encoder.CLIPImageTower`.
        num_latent_frames: latent frames of the rollout; at most
            ``CONDITIONING_ENCODE_LATENT_FRAMES`` (31) are encoded.

    Returns:
        ``(ConditioningLatents with [1, 16, min(N, 31), H/8, W/8] latents,
        visual_context float32 [1, 257, hidden])``, both on the models' devices.

    Raises:
        ValueError: wrong image shape or ``num_latent_frames < 1``.
    """
    latents = encode_conditioning_latents(vae, image, num_latent_frames)
    visual_context = clip_tower.conditioning_tokens(image).float()
    return ConditioningLatents(latents), visual_context


__all__ = ["CONDITIONING_ENCODE_LATENT_FRAMES", "ConditioningLatents", "MASK_CHANNELS", "build_conditioning",
           "preprocess_image"]
