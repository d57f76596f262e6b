"""LingBot camera input (spec §10.1, §10.3, §11): pose/intrinsics file validation with one-line errors,
the geometry rules, and each conversion step against the official intermediates of the fixture run."""

from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from worldtrace_cli.errors import InputError
from worldtrace_cli.model.lingbot import camera as C

DATA = Path(__file__).parent / "data" / "lingbot" / "tiny_data.safetensors"


@pytest.fixture(scope="module")
def data():
    return load_file(str(DATA))


@pytest.fixture()
def pose_files(tmp_path, data):
    np.save(tmp_path / "poses.npy", data["poses"].numpy())
    np.save(tmp_path / "intrinsics.npy", data["intrinsics"].numpy())
    return tmp_path


def test_files_load_as_float64(pose_files):
    p, k = C.load_poses(pose_files / "poses.npy"), C.load_intrinsics(pose_files / "intrinsics.npy")
    assert p.shape == (140, 4, 4) and k.shape == (140, 4) and p.dtype == k.dtype == np.float64


@pytest.mark.parametrize("edit, message", [
    (lambda p: p[:, :3], r"shape \[N, 4, 4\], got \[140, 3, 4\]"),
    (lambda p: p.reshape(-1), r"shape \[N, 4, 4\]"),
    (lambda p: _set(p, (7, 1, 2), np.nan), "row 7 contains NaN or inf"),
    (lambda p: _set(p, (3, 0, 0), 2.0), "row 3 rotation is not rigid"),
    (lambda p: _mirror(p, 5), "row 5 rotation is not rigid"),
    (lambda p: _set(p, (2, 3, 0), 0.5), r"row 2 bottom row is \[0.5, 0.0, 0.0, 1.0\]"),
])
def test_bad_poses_are_one_line_errors(pose_files, data, edit, message):
    np.save(pose_files / "poses.npy", edit(data["poses"].numpy().copy()))
    with pytest.raises(InputError, match=message) as err:
        C.load_poses(pose_files / "poses.npy")
    assert "\n" not in str(err.value) and "poses.npy" in str(err.value)


def _set(p, index, value):
    p[index] = value
    return p


def _mirror(p, row):
    p[row, :3, 0] *= -1  # det -1: a reflection, not a rotation
    return p


def test_bad_intrinsics_and_missing_files(pose_files, data):
    k = data["intrinsics"].numpy().copy()
    np.save(pose_files / "intrinsics.npy", k[:, :3])
    with pytest.raises(InputError, match=r"shape \[N, 4\]"):
        C.load_intrinsics(pose_files / "intrinsics.npy")
    k[4, 0] = np.inf
    with pytest.raises(InputError, match="row 4 contains NaN or inf"):
        C.check_intrinsics(k)
    k[4, 0] = -1
    with pytest.raises(InputError, match="row 4 has a non-positive focal length"):
        C.check_intrinsics(k)
    with pytest.raises(InputError, match="file not found"):
        C.load_poses(pose_files / "nope.npy")
    (pose_files / "junk.npy").write_bytes(b"not numpy")
    with pytest.raises(InputError, match="not a readable .npy"):
        C.load_poses(pose_files / "junk.npy")


def test_frame_counts_and_latent_grid():
    assert C.frame_counts(140, 137) == (137, 32, 125)   # fixture: lat_f 35 -> 32
    assert C.frame_counts(361, 361) == (361, 88, 349)   # README run: 91 latent frames -> 88
    assert C.frame_counts(140, 1000) == (137, 32, 125)  # clipped to the usable pose rows
    with pytest.raises(InputError, match="no full chunk"):
        C.frame_counts(9, 9)
    assert C.latent_grid((32, 64), 2048) == (4, 8)
    assert C.latent_grid((480, 832), 480 * 832) == (58, 104)   # 464x832: the float floor (spec §15.5)
    assert C.latent_grid((1080, 1920), 480 * 832) == (58, 104)
    assert C.latent_grid((720, 1280), 720 * 1280) == (90, 160)


def test_each_step_matches_official_intermediates(data):
    poses = data["poses"].numpy()[:137]
    tau, resampled = C.resample_poses(poses, 32)
    assert np.abs(tau - data["cam_tgt_indices"].numpy()).max() == 0
    assert np.abs(resampled - data["cam_c2ws_interpolated"].numpy()).max() < 1e-5
    rel = C.relative_framewise(resampled)
    assert np.abs(rel - data["cam_c2ws_relative_framewise"].numpy()).max() < 2e-5
    assert np.abs(np.linalg.norm(rel[:, :3, 3], axis=1).max() - 1) < 1e-12
    k = C.scale_intrinsics(data["intrinsics"].numpy()[0], (32, 64))
    assert np.abs(k - data["cam_Ks_transformed"].numpy()[0]).max() < 1e-5


def test_static_camera_gives_zero_origin_and_unit_pixel_rays():
    poses = np.tile(np.eye(4), (9, 1, 1))
    emb = C.camera_embedding(poses, np.array([[400.0, 400.0, 416.0, 240.0]]), 4, (16, 24))
    assert emb.shape == (1, 384, 4, 2, 3)
    assert emb[:, :192].abs().max() == 0  # channels 0-2 (x 64 pixels): translation
    px = emb[0].reshape(6, 8, 8, 4, 2, 3).permute(3, 4, 1, 5, 2, 0).reshape(4, 16, 24, 6)  # [F, h, w, 6]
    assert np.allclose(px[..., 3:].norm(dim=-1).numpy(), 1, atol=1e-6)
    k = C.scale_intrinsics([400.0, 400.0, 416.0, 240.0], (16, 24))
    u, v = 5, 11  # column, row
    d = np.array([(u + 0.5 - k[2]) / k[0], (v + 0.5 - k[3]) / k[1], 1.0])
    assert np.allclose(px[2, v, u, 3:].numpy(), d / np.linalg.norm(d), atol=1e-6)


def test_relative_motion_is_in_previous_camera_axes():
    """A camera turned 90 degrees about y, then stepping along its own z: the step is +z in its axes."""
    c0 = np.eye(4)
    c1 = np.eye(4)
    c1[:3, :3] = [[0, 0, 1], [0, 1, 0], [-1, 0, 0]]
    c2 = c1.copy()
    c2[:3, 3] = c1[:3, :3] @ np.array([0, 0, 2.0])
    rel = C.relative_framewise(np.stack([c0, c1, c2]))
    assert np.allclose(rel[0], np.eye(4))
    assert np.allclose(rel[2][:3, 3], [0, 0, 1])  # normalised by the largest step (2)
    assert np.allclose(rel[1][:3, :3], c1[:3, :3])


def test_image_preprocessing_matches_official_vae_input(data):
    import torch

    from worldtrace_cli.model.lingbot.conditioning import preprocess_image

    x = preprocess_image(data["image_uint8"].numpy(), 32, 64)
    assert x.shape == (1, 3, 32, 64) and x.dtype == torch.float32
    assert (x[0] - data["vae_encode_input_frame0"]).abs().max().item() == 0
    squashed = preprocess_image(data["image_uint8"].numpy(), 48, 48)  # no crop: the whole image, squashed
    assert squashed.shape == (1, 3, 48, 48)
    with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\]"):
        preprocess_image(np.zeros((4, 4), dtype=np.uint8), 8, 8)
