"""Start-image loading/preprocessing and MG2 conditioning tensors (spec §12.1-12.4)."""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from worldtrace_cli.errors import InputError
from worldtrace_cli.model.conditioning import ConditioningLatents, build_conditioning, preprocess_image
from worldtrace_cli.trajectory.images import load_image
from worldtrace_cli.model.image_encoder import build_clip_tower
from worldtrace_cli.model.vae import build_wan_vae


pytestmark = pytest.mark.usefixtures("one_thread")


IMAGES = Path(__file__).resolve().parents[1] / "assets" / "images"
DEMO_SIZES = {"mg2_gta_drive_0005.png": (1280, 720), "mg2_temple_run_0003.png": (900, 570),
              "mg2_universal_0000.png": (700, 485), "mg2_universal_0004.png": (1220, 630),
              "mg2_universal_0012.png": (1280, 720), "mg2_universal_0015.png": (690, 388)}


def test_load_image_reads_the_demo_images_by_content():
    jpeg_named_png = 0
    for name, size in DEMO_SIZES.items():
        path = IMAGES / name
        jpeg_named_png += path.read_bytes()[:2] == b"\xff\xd8"
        img = load_image(path)
        assert img.mode == "RGB" and img.size == size
    assert jpeg_named_png == 4


def test_huge_images_are_decoded_at_reduced_size_and_demo_images_exactly(tmp_path):
    """Issue 15: a 160-megapixel JPEG took 2.3 GB to become 176x96. With the target size a JPEG is
    decoded through PIL's draft mode (1/2..1/8 DCT scaling) and other formats are box-reduced,
    keeping >= 4x the target in the crop; MG2's demo images decode exactly as before."""
    for name in DEMO_SIZES:  # at MG2's 352x640 and the tiny 96x176 alike: no reduction, same pixels
        full = np.asarray(load_image(IMAGES / name))
        for target in ((352, 640), (96, 176)):
            assert np.array_equal(np.asarray(load_image(IMAGES / name, target)), full), (name, target)
    ramp = np.linspace(0, 255, 4800, dtype=np.float32)
    pixels = np.stack([ramp[None, :].repeat(3600, 0), ramp[:3600, None].repeat(4800, 1),
                       np.full((3600, 4800), 90, np.float32)], axis=-1).astype(np.uint8)
    jpeg, png = tmp_path / "huge.jpg", tmp_path / "huge.png"
    Image.fromarray(pixels).save(jpeg, quality=90)
    Image.fromarray(pixels[::2, ::2]).save(png, compress_level=1)
    opened = []
    real_load = Image.Image.load

    def spy(self):  # the size the decoder actually produced
        out = real_load(self)
        opened.append(self.size)
        return out

    Image.Image.load = spy
    try:
        small = load_image(jpeg, (96, 176))
    finally:
        Image.Image.load = real_load
    assert opened[0] == (1200, 900)  # decoded at 1/4: 3.2 MB of pixels instead of 52 MB
    assert small.mode == "RGB" and small.size == (1200, 900)
    reduced = load_image(png, (96, 176))  # PNG has no draft: decoded, then reduced at once
    assert reduced.size == (1200, 900)
    for img, source in ((small, pixels), (reduced, pixels[::2, ::2])):  # the model sees the same picture
        want = preprocess_image(Image.fromarray(source), 96, 176)
        assert (preprocess_image(img, 96, 176) - want).abs().mean() < 0.02


def test_a_large_image_puts_no_bomb_warning_on_stderr(monkeypatch):
    """Between PIL's warning (89 MP) and error (179 MP) limits an image used to print a two-line
    DecompressionBombWarning beside worldtrace's own lines; it is decoded at reduced size instead.
    Past the error limit it stays a one-line InputError."""
    import warnings

    from worldtrace_cli.jobs.inputs import check_image

    path = IMAGES / "mg2_universal_0000.png"  # 700 x 485 = 339,500 pixels
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 200_000)  # warn above 200k, refuse above 400k
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_image(path, 96, 176)
        assert load_image(path, (96, 176)).size == (700, 485)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100_000)
    with pytest.raises(InputError, match="too large"):
        load_image(path, (96, 176))


def _input_error(path, *needles):
    with pytest.raises(InputError) as err:
        load_image(path)
    msg = str(err.value)
    assert msg.startswith(f"image {path}: ") and "\n" not in msg and err.value.exit_code == 2
    assert all(n in msg for n in needles), msg


def test_load_image_errors_name_the_file(tmp_path):
    _input_error(tmp_path / "absent.png", "not found")
    _input_error(tmp_path, "directory")
    text = tmp_path / "notes.png"
    text.write_text("this is not an image\n")
    _input_error(text, "not a recognised image")
    jpeg = (IMAGES / "mg2_universal_0012.png").read_bytes()
    truncated = tmp_path / "cut.png"
    truncated.write_bytes(jpeg[: len(jpeg) // 3])
    _input_error(truncated, "truncated")


def _column_image(width, height):
    """RGB image whose pixel (x, y) is (x % 256, x // 256, y % 256)."""
    x = np.arange(width)[None, :].repeat(height, 0)
    y = np.arange(height)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x % 256, x // 256, y % 256], axis=-1).astype(np.uint8))


def _to_uint8(t):
    return ((t[0] * 0.5 + 0.5) * 255).round().to(torch.int64).permute(1, 2, 0).numpy()


@pytest.mark.parametrize("size, target, cols, rows", [
    ((201, 100), (100, 100), (50, 150), (0, 100)),   # wider: keep height; box 50.5..150.5 -> PIL rounds to 50..150
    ((100, 301), (100, 100), (0, 100), (100, 200)),  # taller: keep width; box 100.5..200.5 -> 100..200
    ((203, 100), (100, 100), (52, 152), (0, 100)),   # box 51.5..151.5 -> round half to even: 52..152
    ((300, 100), (100, 200), (50, 250), (0, 100)),   # wider: width int(100 * 200 / 100) = 200
    ((160, 90), (90, 160), (0, 160), (0, 90)),       # already the target size: identity
])
def test_preprocess_centre_crop(size, target, cols, rows):
    img = _column_image(*size)
    height, width = target
    out = preprocess_image(img, height, width)
    assert out.shape == (1, 3, height, width) and out.dtype == torch.float32
    crop = np.asarray(img)[rows[0]:rows[1], cols[0]:cols[1]]
    assert crop.shape[:2] == (height, width)  # the chosen crops need no resize
    assert np.array_equal(_to_uint8(out), crop)


def test_preprocess_resizes_the_crop_bilinearly():
    img = _column_image(1280, 720)
    out = preprocess_image(img, 96, 176)
    # 720/1280 = 0.5625 > 96/176: taller than the target, keep the width, height int(1280 * 96 / 176) = 698
    expected = img.crop((0, 11, 1280, 709)).resize((176, 96), Image.BILINEAR)
    assert np.array_equal(_to_uint8(out), np.asarray(expected))


@pytest.mark.parametrize("height, width", [(352, 640), (96, 176)])
def test_preprocess_demo_image_shape_and_range(height, width):
    out = preprocess_image(load_image(IMAGES / "mg2_universal_0000.png"), height, width)
    assert out.shape == (1, 3, height, width) and out.dtype == torch.float32
    assert out.min() >= -1.0 and out.max() <= 1.0 and out.std() > 0.1
    # /255 then (x - 0.5) / 0.5: every value is on the 8-bit grid
    levels = (out * 0.5 + 0.5) * 255
    assert (levels - levels.round()).abs().max() < 1e-4


def test_preprocess_rejects_bad_sizes():
    with pytest.raises(ValueError):
        preprocess_image(_column_image(10, 10), 0, 10)
    with pytest.raises(ValueError, match="cannot be centre-cropped"):
        preprocess_image(_column_image(1, 500), 96, 176)


def test_cond_concat_mask_and_clamping():
    k, h, w = 5, 2, 3
    lat = torch.arange(k, dtype=torch.float32).view(1, 1, k, 1, 1).expand(1, 16, k, h, w).clone()
    cond = ConditioningLatents(lat)
    assert cond.num_encoded_frames == 5

    first = cond.cond_concat(0, 3)
    assert first.shape == (1, 20, 3, h, w) and first.dtype == torch.float32
    assert torch.equal(first[:, :4, 0], torch.ones(1, 4, h, w))
    assert torch.equal(first[:, :4, 1:], torch.zeros(1, 4, 2, h, w))
    assert first[0, 4:, :, 0, 0][0].tolist() == [0, 1, 2]

    later = cond.cond_concat(3, 4)
    assert torch.equal(later[:, :4], torch.zeros(1, 4, 4, h, w))
    assert later[0, 4:, :, 0, 0][0].tolist() == [3, 4, 4, 4]
    far = cond.cond_concat(3000, 3)
    assert far[:, :4].abs().sum() == 0 and far[0, 4:, :, 0, 0][0].tolist() == [4, 4, 4]
    assert torch.equal(far[:, 4:], lat[:, :, [4, 4, 4]])

    with pytest.raises(ValueError):
        cond.cond_concat(-1, 3)
    with pytest.raises(ValueError):
        cond.cond_concat(0, 0)
    with pytest.raises(ValueError):
        ConditioningLatents(torch.zeros(1, 20, 3, 2, 2))


def test_build_conditioning_with_tiny_models():
    vae = build_wan_vae("tiny", seed=1)
    clip = build_clip_tower("tiny", seed=2)
    image = preprocess_image(load_image(IMAGES / "mg2_gta_drive_0005.png"), 16, 24)
    cond, visual = build_conditioning(image, vae, clip, num_latent_frames=6)
    assert cond.image_latents.shape == (1, 16, 6, 2, 3) and cond.image_latents.dtype == torch.float32
    assert visual.shape == (1, 257, 64) and visual.dtype == torch.float32
    assert torch.equal(visual, clip.conditioning_tokens(image))
    assert cond.cond_concat(0, 3).shape == (1, 20, 3, 2, 3)

    long, _ = build_conditioning(image, vae, clip, num_latent_frames=48)
    assert long.image_latents.shape == (1, 16, 31, 2, 3)
    assert torch.allclose(long.image_latents[:, :, :6], cond.image_latents, atol=1e-6, rtol=0)
    assert torch.equal(long.cond_concat(45, 3)[:, 4:], long.image_latents[:, :, [30, 30, 30]])
