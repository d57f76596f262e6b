"""Image conditioning of LingBot-World (spec §10.2): the start image as the VAE sees it.

The image is squashed (no crop: the aspect ratio is only approximately kept) to h x w with bicubic
interpolation without antialiasing and scaled to [-1, 1]. The VAE input is that frame followed by
F_vid - 1 all-zero (mid-grey) frames, encoded by the Wan2.1 VAE (posterior mean, normalised) -- the
same video MG2 encodes, so :func:`worldtrace_cli.model.vae.encode_conditioning_latents` does it; y is
then :meth:`~worldtrace_cli.model.conditioning.ConditioningLatents.cond_concat` of the latents (4 mask
channels, ones at latent frame 0, then the 16 latent channels).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def preprocess_image(image, height: int, width: int) -> torch.Tensor:
    """RGB image (PIL image or uint8 array [H, W, 3]) -> float32 [1, 3, height, width] in [-1, 1].

    ``x / 255``, ``(x - 0.5) / 0.5``, then bicubic resize (``align_corners=False``, no antialias) to
    (height, width) without cropping (spec §10.2).

    Raises:
        ValueError: not an [H, W, 3] uint8 image, or a non-positive target size.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"target size must be positive, got {height}x{width}")
    arr = np.asarray(image.convert("RGB") if hasattr(image, "convert") else image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"image must be uint8 [H, W, 3], got {arr.dtype} {list(arr.shape)}")
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div(255.0)
    x = ((x - 0.5) / 0.5)[None]
    return F.interpolate(x, size=(height, width), mode="bicubic", align_corners=False, antialias=False)
