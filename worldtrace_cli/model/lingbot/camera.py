"""Camera conditioning of LingBot-World: ``poses.npy`` + ``intrinsics.npy`` -> camera tensor (spec §10, §11).

Input files (spec §11): ``poses.npy`` [N, 4, 4] camera-to-world matrices in OpenCV axes (x right,
y down, z forward), one per *pixel* (video) frame at 16 fps, translation in arbitrary units;
``intrinsics.npy`` [N, 4] = [fx, fy, cx, cy] in pixels of a 480x832 frame (only row 0 is used).

The conversion (spec §10.3): resample the pose timeline to the latent frames (lerp + quaternion slerp),
make each pose relative to the previous latent frame's camera, normalise translations by the largest
one of the whole trajectory, and give every pixel ``[t | R d]`` (ray origin, rotated unit ray
direction), folded 8x8 into 384 channels per latent cell. All arithmetic is float64.
"""

from __future__ import annotations

from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from ...errors import InputError

if TYPE_CHECKING:  # torch is imported where tensors are made, so input checks stay light
    import torch

INTRINSICS_HW = (480, 832)   # the frame size intrinsics.npy is expressed in (spec §10.3 step 4)
# Without intrinsics.npy: fx = fy = 420 px on the 832 px width (about 90 degrees horizontal field of
# view, the order of the fixture's ViPE-style example, 420 / 418) and a centred principal point.
DEFAULT_INTRINSICS = (420.0, 420.0, 416.0, 240.0)
ROTATION_TOLERANCE = 1e-3    # max |R^T R - I| and |det R - 1| accepted as rigid


def _load_npy(path: str | Path) -> np.ndarray:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InputError(f"{path}: not a readable .npy array ({exc})") from None


def check_poses(poses: np.ndarray, source: str = "poses") -> np.ndarray:
    """Validate camera-to-world poses and return them as float64 [N, 4, 4].

    Raises:
        InputError: (one line naming ``source`` and the first bad row) a shape other than [N, 4, 4]
            with N >= 1, NaN/inf, a bottom row other than [0, 0, 0, 1], or a rotation block that is
            not a proper rotation (``|R^T R - I| > 1e-3`` or ``|det R - 1| > 1e-3``).
    """
    p = np.asarray(poses)
    if p.ndim != 3 or p.shape[1:] != (4, 4) or p.shape[0] < 1:
        raise InputError(f"{source}: expected camera-to-world poses of shape [N, 4, 4], got {list(p.shape)}")
    p = p.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(p).all(axis=(1, 2)))
    if bad.size:
        raise InputError(f"{source}: row {bad[0]} contains NaN or inf ({bad.size} rows)")
    bottom = np.abs(p[:, 3] - np.array([0.0, 0.0, 0.0, 1.0])).max(axis=1)
    if (bottom > 1e-6).any():
        i = int(np.argmax(bottom > 1e-6))
        raise InputError(f"{source}: row {i} bottom row is {p[i, 3].tolist()}, expected [0, 0, 0, 1]")
    r = p[:, :3, :3]
    ortho = np.abs(np.swapaxes(r, 1, 2) @ r - np.eye(3)).max(axis=(1, 2))
    det = np.abs(np.linalg.det(r) - 1)
    bad = np.flatnonzero((ortho > ROTATION_TOLERANCE) | (det > ROTATION_TOLERANCE))
    if bad.size:
        i = int(bad[0])
        raise InputError(f"{source}: row {i} rotation is not rigid (|R^T R - I| = {ortho[i]:.3g}, "
                         f"det = {np.linalg.det(r[i]):.4g}; {bad.size} rows)")
    return p


def check_intrinsics(intrinsics: np.ndarray, source: str = "intrinsics") -> np.ndarray:
    """Validate intrinsics [N, 4] (or one row [4]) = [fx, fy, cx, cy] and return float64 [N, 4].

    Raises:
        InputError: wrong shape, NaN/inf, or a non-positive focal length (one line naming the row).
    """
    k = np.asarray(intrinsics)
    if k.ndim == 1:
        k = k[None]
    if k.ndim != 2 or k.shape[1] != 4 or k.shape[0] < 1:
        raise InputError(f"{source}: expected intrinsics of shape [N, 4] (fx, fy, cx, cy), got {list(np.shape(intrinsics))}")
    k = k.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(k).all(axis=1))
    if bad.size:
        raise InputError(f"{source}: row {bad[0]} contains NaN or inf")
    bad = np.flatnonzero((k[:, 0] <= 0) | (k[:, 1] <= 0))
    if bad.size:
        raise InputError(f"{source}: row {bad[0]} has a non-positive focal length {k[bad[0], :2].tolist()}")
    return k


def load_poses(path: str | Path) -> np.ndarray:
    """``poses.npy`` -> validated float64 [N, 4, 4] (:func:`check_poses`; errors name the file)."""
    return check_poses(_load_npy(path), str(path))


def load_intrinsics(path: str | Path) -> np.ndarray:
    """``intrinsics.npy`` -> validated float64 [N, 4] (:func:`check_intrinsics`; errors name the file)."""
    return check_intrinsics(_load_npy(path), str(path))


def frame_counts(num_pose_rows: int, frame_num: int, frames_per_chunk: int = 4) -> tuple[int, int, int]:
    """(pose rows kept, latent frames, video frames) of a run (spec §10.1).

    Pose rows usable: ``P = ((N - 1) // 4) * 4 + 1``; ``frame_num = min(((frame_num - 1) // 4) * 4 + 1, P)``
    rows are kept; latent frames ``(frame_num - 1) // 4 + 1`` rounded down to a multiple of the chunk
    size; video frames ``4 (lat_f - 1) + 1``. E.g. 140 rows, 137 requested -> (137, 32, 125).

    Raises:
        InputError: fewer rows or frames than one chunk needs.
    """
    usable = ((num_pose_rows - 1) // 4) * 4 + 1
    kept = min(((frame_num - 1) // 4) * 4 + 1, usable)
    lat_f = ((kept - 1) // 4 + 1) // frames_per_chunk * frames_per_chunk
    if kept < 1 or lat_f < 1:
        raise InputError(f"{num_pose_rows} pose rows and {frame_num} requested frames give no full chunk of "
                         f"{frames_per_chunk} latent frames (need {4 * (frames_per_chunk - 1) + 1} frames)")
    return kept, lat_f, 4 * (lat_f - 1) + 1


def latent_grid(image_hw: tuple[int, int], max_area: int) -> tuple[int, int]:
    """Latent (lat_h, lat_w) for an image of (H, W) pixels at ``max_area`` (e.g. 480*832) (spec §10.1):
    with ``r = H / W`` (float64, computed first: the rounding matters), ``lat_h = floor(floor(sqrt(max_area r)
    / 8) / 2) * 2`` and ``lat_w = floor(floor(sqrt(max_area / r) / 8) / 2) * 2``. A 480x832 or 16:9 image at
    480*832 gives (58, 104), i.e. 464x832 pixels (spec §15.5); 16:9 at 720*1280 gives (90, 160)."""
    h, w = image_hw
    ratio = h / w
    lat_h = int(np.floor(np.floor(np.sqrt(max_area * ratio) / 8) / 2) * 2)
    lat_w = int(np.floor(np.floor(np.sqrt(max_area / ratio) / 8) / 2) * 2)
    return lat_h, lat_w


def _quaternions(r: np.ndarray) -> np.ndarray:
    """Rotation matrices [N, 3, 3] -> unit quaternions [N, 4] (w, x, y, z), each flipped into the
    hemisphere of its predecessor so that slerp takes the short arc."""
    q = np.empty((len(r), 4))
    for n, m in enumerate(r):
        tr = np.trace(m)
        if tr > 0:
            s = 2 * np.sqrt(tr + 1)
            q[n] = [s / 4, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
        else:
            i = int(np.argmax(np.diag(m)))
            j, k = (i + 1) % 3, (i + 2) % 3
            s = 2 * np.sqrt(1 + m[i, i] - m[j, j] - m[k, k])
            q[n, 0] = (m[k, j] - m[j, k]) / s
            q[n, 1 + i] = s / 4
            q[n, 1 + j] = (m[j, i] + m[i, j]) / s
            q[n, 1 + k] = (m[k, i] + m[i, k]) / s
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    for n in range(1, len(q)):
        if np.dot(q[n - 1], q[n]) < 0:
            q[n] = -q[n]
    return q


def _rotation(q: np.ndarray) -> np.ndarray:
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def _slerp(q0: np.ndarray, q1: np.ndarray, u: float) -> np.ndarray:
    dot = float(np.clip(np.dot(q0, q1), -1.0, 1.0))
    theta = np.arccos(dot)
    if theta < 1e-8:
        return (1 - u) * q0 + u * q1
    return (np.sin((1 - u) * theta) * q0 + np.sin(u * theta) * q1) / np.sin(theta)


def resample_poses(c2ws: np.ndarray, latent_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """Resample L poses [L, 4, 4] at ``tau = linspace(0, L - 1, latent_frames)`` (spec §10.3 step 1).

    Translation is interpolated linearly, rotation by slerp between neighbouring rows. Returns
    (tau float64 [latent_frames], poses float64 [latent_frames, 4, 4]).
    """
    c2ws = np.asarray(c2ws, dtype=np.float64)
    tau = np.linspace(0, len(c2ws) - 1, latent_frames)
    quats = _quaternions(c2ws[:, :3, :3])
    out = np.tile(np.eye(4), (latent_frames, 1, 1))
    for k, t in enumerate(tau):
        i = min(int(np.floor(t)), len(c2ws) - 2) if len(c2ws) > 1 else 0
        u = t - i
        j = min(i + 1, len(c2ws) - 1)
        out[k, :3, :3] = _rotation(_slerp(quats[i], quats[j], u))
        out[k, :3, 3] = (1 - u) * c2ws[i, :3, 3] + u * c2ws[j, :3, 3]
    return tau, out


def _inverse(m: np.ndarray) -> np.ndarray:
    """SE(3) inverse [..., 4, 4]: ``[R^T | -R^T t]``."""
    out = np.tile(np.eye(4), m.shape[:-2] + (1, 1))
    rt = np.swapaxes(m[..., :3, :3], -1, -2)
    out[..., :3, :3] = rt
    out[..., :3, 3] = -(rt @ m[..., :3, 3:4])[..., 0]
    return out


def relative_framewise(c2ws: np.ndarray) -> np.ndarray:
    """Frame-to-frame motion [F, 4, 4] with whole-trajectory translation normalisation (spec §10.3 steps 2-3).

    ``A_k = C_0^-1 C_k`` (A_0 = I), ``B_0 = I``, ``B_k = A_{k-1}^-1 A_k``: the motion from latent frame
    k-1 to k in camera k-1's axes; then every translation is divided by ``max_k |t(B_k)|`` (unless 0).
    """
    c2ws = np.asarray(c2ws, dtype=np.float64)
    a = _inverse(c2ws[0]) @ c2ws
    a[0] = np.eye(4)
    b = np.tile(np.eye(4), (len(c2ws), 1, 1))
    b[1:] = _inverse(a[:-1]) @ a[1:]
    scale = np.linalg.norm(b[:, :3, 3], axis=1).max()
    if scale > 0:
        b[:, :3, 3] /= scale
    return b


def scale_intrinsics(row: np.ndarray, pixel_hw: tuple[int, int]) -> np.ndarray:
    """[fx, fy, cx, cy] from a 480x832 frame to ``pixel_hw`` = (h, w): x terms times w/832, y terms
    times h/480 (spec §10.3 step 4; no crop offsets)."""
    h, w = pixel_hw
    sy, sx = h / INTRINSICS_HW[0], w / INTRINSICS_HW[1]
    fx, fy, cx, cy = np.asarray(row, dtype=np.float64)
    return np.array([fx * sx, fy * sy, cx * sx, cy * sy])


def ray_embedding(motion: np.ndarray, k: np.ndarray, pixel_hw: tuple[int, int]) -> torch.Tensor:
    """Per-pixel ``[t(B) | R(B) d]`` folded 8x8 into channels (spec §10.3 steps 5-6).

    Args:
        motion: relative poses B [F, 4, 4] (:func:`relative_framewise`).
        k: scaled intrinsics [fx, fy, cx, cy] (:func:`scale_intrinsics`).
        pixel_hw: (h, w), multiples of 8.
    Returns:
        float32 [1, 384, F, h/8, w/8]: channel ``c*64 + 8 dy + dx`` of latent cell (i, j) is
        component c of pixel (8i + dy, 8j + dx).
    """
    h, w = pixel_hw
    fx, fy, cx, cy = k
    v, u = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64), indexing="ij")
    d = np.stack([(u + 0.5 - cx) / fx, (v + 0.5 - cy) / fy, np.ones_like(u)], axis=-1)
    d /= np.linalg.norm(d, axis=-1, keepdims=True)  # [h, w, 3]
    dirs = np.einsum("fab,hwb->fhwa", motion[:, :3, :3], d)
    origin = np.broadcast_to(motion[:, None, None, :3, 3], dirs.shape)
    emb = np.concatenate([origin, dirs], axis=-1)  # [F, h, w, 6]
    f = len(motion)
    emb = emb.reshape(f, h // 8, 8, w // 8, 8, 6).transpose(5, 2, 4, 0, 1, 3).reshape(1, 384, f, h // 8, w // 8)
    import torch

    return torch.from_numpy(np.ascontiguousarray(emb)).float()


def camera_embedding(poses: np.ndarray, intrinsics: np.ndarray, latent_frames: int,
                     pixel_hw: tuple[int, int]) -> torch.Tensor:
    """Camera tensor [1, 384, latent_frames, h/8, w/8] float32 from the kept pose rows (spec §10.3).

    Args:
        poses: camera-to-world [L, 4, 4], the rows kept by :func:`frame_counts` (the first L).
        intrinsics: [N, 4] in 480x832 pixels; only row 0 is used.
        latent_frames: lat_f.
        pixel_hw: (h, w) = 8 * latent grid.
    Raises:
        InputError: invalid poses or intrinsics (:func:`check_poses`, :func:`check_intrinsics`), or a
            pixel size that is not a multiple of 8.
    """
    if pixel_hw[0] % 8 or pixel_hw[1] % 8:
        raise InputError(f"camera embedding: pixel size {pixel_hw} must be a multiple of 8")
    poses, intrinsics = check_poses(poses), check_intrinsics(intrinsics)
    _, resampled = resample_poses(poses, latent_frames)
    return ray_embedding(relative_framewise(resampled), scale_intrinsics(intrinsics[0], pixel_hw), pixel_hw)


class CameraTrack:
    """The camera of a whole rollout, embedded chunk by chunk (spec §10.3).

    Steps 1-3 (resampling to latent frames, frame-to-frame motion, translation normalisation over
    the whole trajectory) need every pose first and are done here once; steps 5-6 (the per-pixel
    rays) are per latent frame, so :meth:`chunk` makes only the frames a chunk reads (the whole
    rollout's tensor at 464x832 is 9.3 MB per latent frame). ``chunk(a, f)`` equals
    ``camera_embedding(...)[:, :, a:a+f]``.

    Args:
        c2w: camera-to-world poses [L, 4, 4] of the pixel frames (the kept rows, spec §10.1).
        intrinsics: [N, 4] in 480x832 pixels (row 0 used), or None for :data:`DEFAULT_INTRINSICS`.
        latent_frames: lat_f.
        pixel_hw: (h, w), multiples of 8.
    Attributes:
        latent_poses: float64 [lat_f, 4, 4] resampled camera-to-world pose of each latent frame (what
            cache writers get, :meth:`~worldtrace_cli.memory.base.CacheWriter.set_poses`).
        motion: float64 [lat_f, 4, 4] normalised frame-to-frame motion; k: scaled [fx, fy, cx, cy].
    Raises:
        InputError: invalid poses or intrinsics, or a pixel size that is not a multiple of 8.
    """

    def __init__(self, c2w: np.ndarray, intrinsics: np.ndarray | None, latent_frames: int,
                 pixel_hw: tuple[int, int]):
        if pixel_hw[0] % 8 or pixel_hw[1] % 8:
            raise InputError(f"camera embedding: pixel size {pixel_hw} must be a multiple of 8")
        k = check_intrinsics(DEFAULT_INTRINSICS if intrinsics is None else intrinsics)
        _, self.latent_poses = resample_poses(check_poses(c2w), latent_frames)
        self.motion = relative_framewise(self.latent_poses)
        self.k = scale_intrinsics(k[0], pixel_hw)
        self.pixel_hw = pixel_hw

    @property
    def num_frames(self) -> int:
        """Latent frames covered."""
        return len(self.motion)

    def chunk(self, start: int, frames: int) -> "torch.Tensor":
        """Camera tensor of latent frames ``start .. start+frames-1``: float32 [1, 384, frames, h/8, w/8]."""
        return ray_embedding(self.motion[start:start + frames], self.k, self.pixel_hw)


class StreamingCamera:
    """The camera of a run whose poses arrive chunk by chunk (a live session, and every run whose
    actions drive the camera, so that a recorded session replays with ``generate`` to the same frames).

    Spec §10.3 with two steps made causal: the latent frames' poses are taken as given (the motion
    model's pose of the pixel frame each latent frame shows, where the spec's resampling at
    ``linspace(0, L - 1, lat_f)`` lands exactly, L = 4 lat_f - 3), and the frame-to-frame translations
    are divided by a fixed ``translation_scale`` instead of the largest one of the whole trajectory:
    the motion model's step per latent frame (4 pixel frames of walking), which is that largest one
    for every trajectory that walks a whole latent frame.

    Args:
        intrinsics: [N, 4] in 480x832 pixels (row 0 used), or None for :data:`DEFAULT_INTRINSICS`.
        pixel_hw: (h, w), multiples of 8.
        translation_scale: the divisor of every frame-to-frame translation (> 0).
    Raises:
        InputError: invalid intrinsics or a pixel size that is not a multiple of 8.
    """

    def __init__(self, intrinsics: np.ndarray | None, pixel_hw: tuple[int, int], translation_scale: float):
        if pixel_hw[0] % 8 or pixel_hw[1] % 8:
            raise InputError(f"camera embedding: pixel size {pixel_hw} must be a multiple of 8")
        k = check_intrinsics(DEFAULT_INTRINSICS if intrinsics is None else intrinsics)
        self.k, self.pixel_hw, self.scale = scale_intrinsics(k[0], pixel_hw), pixel_hw, float(translation_scale)

    def motion(self, c2w: np.ndarray, start: int, frames: int) -> np.ndarray:
        """Frame-to-frame motion B [frames, 4, 4] of latent frames ``start ..`` from the camera-to-world
        poses ``c2w`` [N, 4, 4] of latent frames 0 .. N-1 (N >= start + frames): ``B_k = C_{k-1}^-1 C_k``
        (the motion from frame k-1 to k in camera k-1's axes; B_0 = I), translations divided by the scale."""
        c2w = np.asarray(c2w, dtype=np.float64)
        before = c2w[start - 1:start + frames - 1] if start else np.concatenate([c2w[:1], c2w[:frames - 1]])
        b = _inverse(before) @ c2w[start:start + frames]
        if start == 0:
            b[0] = np.eye(4)
        b[:, :3, 3] /= self.scale
        return b

    def chunk(self, c2w: np.ndarray, start: int, frames: int) -> "torch.Tensor":
        """Camera tensor of latent frames ``start .. start+frames-1``: float32 [1, 384, frames, h/8, w/8]."""
        return ray_embedding(self.motion(c2w, start, frames), self.k, self.pixel_hw)
