"""Reading a conditioning image, torch-free: ``generate`` decodes it fully with PIL before torch or
a model loads, so a truncated or corrupt file is a one-line error at once
(:func:`~worldtrace_cli.jobs.inputs.check_image`); :mod:`worldtrace_cli.model.conditioning`
re-exports :func:`load_image` for the pipeline.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import InputError

KEEP_SCALE = 4  # a reduced decode keeps at least 4x the target size in the crop (MG2's images decode fully)


def _reduction(size: tuple[int, int], target: tuple[int, int]) -> float:
    """How many times an image of ``size`` (w, h) may be shrunk before the centre crop of
    :func:`preprocess_image` to ``target`` (height, width) would hold fewer than KEEP_SCALE x the
    target's pixels per side, under either orientation (EXIF may swap the sides)."""
    height, width = target
    factors = []
    for w, h in (size, size[::-1]):
        crop_w, crop_h = (w, w * height / width) if h / w > height / width else (h * width / height, h)
        factors.append(min(crop_w / (KEEP_SCALE * width), crop_h / (KEEP_SCALE * height)))
    return min(factors)


def load_image(path: str | Path, target: tuple[int, int] | None = None) -> Image.Image:
    """Read an image file as RGB, detecting the format from its content, not its extension.

    Like MG2's loader (diffusers ``load_image``), EXIF orientation is applied before the RGB
    conversion. The pixels are fully decoded here, so later steps cannot fail on bad data.

    Args:
        path: the image file.
        target: ``(height, width)`` the image will be cropped and resized to; with it, an image
            more than 2 x KEEP_SCALE times larger than the crop needs is decoded at reduced size:
            a JPEG through PIL's draft mode (the decoder scales its DCT by 1/2, 1/4 or 1/8, so a
            160-megapixel photo never exists at full size in memory), other formats shrunk by an
            integer box filter right after decoding. The crop keeps at least KEEP_SCALE x the
            target's pixels per side, and images below that bound decode exactly as without it.

    Returns:
        a fully loaded ``PIL.Image.Image`` in mode "RGB".

    Raises:
        InputError: ``image <path>: <problem>`` (one line) for a missing file, a directory, a file
            that is not a recognised image, or truncated/corrupt image data.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"image {path}: file not found")
    if path.is_dir():
        raise InputError(f"image {path}: is a directory, not an image file")
    try:
        with warnings.catch_warnings():
            # PIL warns above 89 MP (stderr noise); images past twice that still raise DecompressionBombError
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if target is not None and _reduction(img.size, target) >= 2:
                    scale = _reduction(img.size, target)
                    img.draft("RGB", (int(img.width / scale) + 1, int(img.height / scale) + 1))  # JPEG only
                img.load()
                if target is not None and int(_reduction(img.size, target)) >= 2:
                    img = img.reduce(int(_reduction(img.size, target)))
                img = ImageOps.exif_transpose(img).convert("RGB")
    except UnidentifiedImageError:
        raise InputError(f"image {path}: not a recognised image format") from None
    except Image.DecompressionBombError as exc:
        raise InputError(f"image {path}: too large ({exc})") from None
    except PermissionError:
        raise InputError(f"image {path}: permission denied") from None
    except (OSError, ValueError, SyntaxError) as exc:
        # PIL reports truncated/corrupt data as OSError ("image file is truncated ...") and some
        # malformed headers as ValueError/SyntaxError.
        detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise InputError(f"image {path}: truncated or corrupt image data ({detail})") from None
    return img
