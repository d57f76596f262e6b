"""The one motion model: where the camera is after a trajectory's actions.

This is the project's single source of truth for camera poses. The procedural world
(:mod:`worldtrace_cli.world.render`) renders its ground truth at these poses, the embedded-world
training data (:mod:`worldtrace_cli.train.data`) is rendered at them, and the revisit pairing of
the loop metrics (:func:`worldtrace_cli.metrics.revisit_pairs`) and LoopBench's loop geometry use
the same numbers. MG2 itself defines no metric speeds or turn rates: for MG2 checkpoints this is a
calibration assumption (documented in ``docs/metrics.md``); for the ``loopworld`` preset it is
exact, because that model was trained on frames rendered with it.

Units: 1 unit of distance per chunk of walking (12 pixel frames); degrees for angles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..trajectory import CHUNK_FRAMES

if TYPE_CHECKING:
    from ..trajectory import ActionPlan

UNITS_PER_FRAME = 1.0 / CHUNK_FRAMES  # 1 unit of distance per chunk (12 pixel frames)
DEG_PER_FRAME_PER_MOUSE = 37.5  # |yaw| = 0.1 turns 3.75 deg per pixel frame = 45 deg per chunk
MAX_PITCH_DEG = 85.0
TEMPLERUN_TURN_DEG = 90.0


def pose_steps(mode: str, keyboard: torch.Tensor, mouse: torch.Tensor | None) -> torch.Tensor:
    """Per-row pose increments of the motion model, before integration.

    Args:
        mode: ``universal`` | ``gta_drive`` | ``templerun``.
        keyboard: [R, keyboard_dim] action rows (any float dtype); mouse: [R, 2] (pitch, yaw) or None.
    Returns:
        float64 [R, 4]: (right speed, forward speed) in units per row in the camera frame
        (normalised: unit speed for any key combination), yaw step and pitch step in degrees.
    Raises:
        ValueError: unknown mode.
    """
    keys = keyboard.to(torch.float64)
    rows = keys.shape[0]
    zeros = torch.zeros(rows, dtype=torch.float64)
    mouse = mouse.to(torch.float64) if mouse is not None else torch.stack([zeros, zeros], 1)
    if mode == "universal":
        right, forward = keys[:, 3] - keys[:, 2], keys[:, 0] - keys[:, 1]
    elif mode == "gta_drive":
        right, forward = zeros, keys[:, 0] - keys[:, 1]
    elif mode == "templerun":
        right, forward = keys[:, 6] - keys[:, 5], torch.ones(rows, dtype=torch.float64)
    else:
        raise ValueError(f"motion model: unknown mode {mode!r}")
    yaw_step = DEG_PER_FRAME_PER_MOUSE * mouse[:, 1]
    if mode == "templerun":
        turn = keys[:, 4] - keys[:, 3]  # C right, Z left
        pressed_before = torch.cat([zeros[:1], turn[:-1]])
        yaw_step = yaw_step + TEMPLERUN_TURN_DEG * turn * (turn != pressed_before)
    norm = torch.sqrt(right**2 + forward**2).clamp_min(1e-12)
    speed = UNITS_PER_FRAME / norm
    return torch.stack([right * speed, forward * speed, yaw_step, DEG_PER_FRAME_PER_MOUSE * mouse[:, 0]], 1)


def integrate(steps: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """Integrate :func:`pose_steps` rows: pose[r] is the pose after rows 0..r.

    Args:
        steps: float64 [R, 4] from :func:`pose_steps`.
        start: optional float64 [4] start pose (x, y, yaw_deg, pitch_deg); default the origin facing +y.
    Returns:
        float64 [R, 4] (x, y, yaw_deg, pitch_deg). Pitch is clamped to +-85 degrees (path-dependent).
    """
    start = torch.zeros(4, dtype=torch.float64) if start is None else start.to(torch.float64)

    def running(first, values):  # first + values[0], then + values[1], ...: the same sums in pieces as at once
        return torch.cumsum(torch.cat([first.reshape(1), values]), 0)[1:]

    yaw = running(start[2], steps[:, 2])
    pitch = running(start[3], steps[:, 3])
    if pitch.numel() and pitch.abs().max() > MAX_PITCH_DEG:  # clamping makes pitch path-dependent
        value = float(start[3])
        for r, s in enumerate(steps[:, 3].tolist()):
            value = min(MAX_PITCH_DEG, max(-MAX_PITCH_DEG, value + s))
            pitch[r] = value
    rad = torch.deg2rad(yaw)
    right, forward = steps[:, 0], steps[:, 1]
    # Camera frame -> world: forward = (sin yaw, cos yaw), right = (cos yaw, -sin yaw).
    dx = forward * torch.sin(rad) + right * torch.cos(rad)
    dy = forward * torch.cos(rad) - right * torch.sin(rad)
    return torch.stack([running(start[0], dx), running(start[1], dy), yaw, pitch], dim=1)


def dead_reckon(plan: ActionPlan) -> torch.Tensor:
    """Camera pose per action row of an ActionPlan: float64 ``[R, 4]`` = (x, y, yaw_deg, pitch_deg),
    in units of "1 chunk of walking"; ``pose[r]`` is the pose after row r's action (rows 0..r).

    Model: start at (0, 0) facing +y, yaw 0, pitch 0. Per row:

    - yaw += 37.5 * mouse_yaw degrees (|yaw| = 0.1, MG2's camera step, turns 45 deg per chunk:
      the paper's 90 deg pan is 2 chunks out, 2 back); positive = right. Pitch likewise from
      mouse_pitch (positive = up), clamped to +-85 deg. Pitch does not affect motion.
    - keys give a direction in the camera frame: universal W (0,+1) forward, S (0,-1), A (-1,0)
      strafe left, D (+1,0) strafe right; gta_drive W/S (the car turns by its yaw); templerun
      always runs forward (0,+1), plus A/D lane changes as (-+1, 0). The direction is NORMALISED
      (unit speed for any combination: the paper's ABCA diagonal is 5*sqrt(2) ~ 7 chunks), rotated
      by the yaw, and walked at 1/12 unit per pixel frame (1 unit per chunk).
    - templerun turn keys Z/C turn the heading by -90/+90 deg once per contiguous press (Temple
      Run turns snap at junctions); Q (MG2's "no move"), jump and slide add nothing to the run.
    """
    return integrate(pose_steps(plan.mode, plan.keyboard, plan.mouse))


def frame_poses(mode: str, keyboard: torch.Tensor, mouse: torch.Tensor | None,
                start: torch.Tensor | None = None) -> torch.Tensor:
    """Camera pose of every pixel frame: float64 [R, 4] for R action rows.

    MG2 reads action rows up to, not including, a frame (latent frame f, pixel frames 4f-3..4f, reads
    rows 4f-12..4f-1: MG2 spec §8), so pixel frame k shows the pose after rows 0..k-1: frame 0 is
    the start pose (the conditioning image) and frame k is :func:`integrate`'s pose[k-1].
    """
    poses = integrate(pose_steps(mode, keyboard, mouse), start)
    first = (torch.zeros(1, 4, dtype=torch.float64) if start is None else start.to(torch.float64)[None])
    return torch.cat([first, poses[:-1]])


def plan_frame_poses(plan: ActionPlan) -> torch.Tensor:
    """:func:`frame_poses` of an ActionPlan: the pose of each of its R pixel frames, float64 [R, 4]."""
    return frame_poses(plan.mode, plan.keyboard, plan.mouse)


def latent_frame_poses(pixel_poses: torch.Tensor, num_latent: int, temporal_factor: int = 4) -> torch.Tensor:
    """The pose of each latent frame from the poses of its pixel frames.

    Latent frame 0 is pixel frame 0 (the start image); latent frame f >= 1 covers pixel frames
    ``4f-3 .. 4f`` (MG2 spec §8, the Wan VAE's causal temporal factor 4) and takes the pose of its
    last pixel frame, ``4f`` (the newest view it shows), clamped to the last pixel frame given.

    Args:
        pixel_poses: float64 [R, 4] from :func:`frame_poses`.
        num_latent: latent frames wanted (N).
        temporal_factor: pixel frames per latent frame after the first (4).
    Returns:
        float64 [N, 4] (x, y, yaw_deg, pitch_deg).
    Raises:
        ValueError: no pixel poses.
    """
    if pixel_poses.shape[0] == 0:
        raise ValueError("latent_frame_poses: no pixel poses")
    index = (torch.arange(num_latent) * temporal_factor).clamp_max(pixel_poses.shape[0] - 1)
    return pixel_poses[index].to(torch.float64)


def camera_to_world(poses: torch.Tensor) -> torch.Tensor:
    """Motion-model poses as camera-to-world matrices in OpenCV axes (x right, y down, z forward).

    The world frame is the motion model's ground plane (x east, y north, units of "1 chunk of
    walking") with z up; the camera sits at height 0. Yaw turns right (clockwise seen from above)
    from +y; pitch tilts up. This is the convention of LingBot-World's ``poses.npy``
    (lingbot-architecture.md §10) and of the cache contract's poses
    (:meth:`~worldtrace_cli.memory.base.CacheWriter.set_poses`).

    Args:
        poses: float [N, 4] (x, y, yaw_deg, pitch_deg).
    Returns:
        float64 [N, 4, 4]: columns of the rotation = the camera's right, down and forward axes in
        world coordinates; last column the camera centre; bottom row (0, 0, 0, 1).
    """
    p = poses.to(torch.float64)
    yaw, pitch = torch.deg2rad(p[:, 2]), torch.deg2rad(p[:, 3])
    sy, cy, sp, cp = torch.sin(yaw), torch.cos(yaw), torch.sin(pitch), torch.cos(pitch)
    zero = torch.zeros_like(sy)
    right = torch.stack([cy, -sy, zero], 1)
    forward = torch.stack([sy * cp, cy * cp, sp], 1)
    down = torch.linalg.cross(forward, right)
    c2w = torch.zeros(p.shape[0], 4, 4, dtype=torch.float64)
    c2w[:, :3, 0], c2w[:, :3, 1], c2w[:, :3, 2] = right, down, forward
    c2w[:, 0, 3], c2w[:, 1, 3] = p[:, 0], p[:, 1]
    c2w[:, 3, 3] = 1.0
    return c2w


class PoseTrack:
    """The motion model's poses of a trajectory that grows row by row (a live session's), kept as they
    arrive: each row integrated once from the last pose (:func:`integrate`, in pieces: the same numbers
    as integrating the whole at once), so a session's step costs the same at chunk 500 as at chunk 10.

    Args:
        mode: the action mode (``universal``, ``gta_drive``, ``templerun``).
    Attributes:
        rows: action rows integrated so far.
    """

    def __init__(self, mode: str):
        self.mode = mode
        self._after = torch.zeros(64, 4, dtype=torch.float64)  # pose after rows 0..r (integrate's rows), grown x2
        self._latent = torch.zeros(16, 4, 4, dtype=torch.float64)  # camera_to_world of latent frames so far
        self.rows = self._latents = 0

    def extend_to(self, keyboard: torch.Tensor, mouse: torch.Tensor | None, rows: int) -> None:
        """Integrate rows ``self.rows .. rows - 1`` of ``keyboard`` [R, kd] / ``mouse`` [R, 2] (R >= rows)."""
        if rows <= self.rows:
            return
        lo = max(0, self.rows - 1)  # one row before: templerun's turn keys look at the row before
        steps = pose_steps(self.mode, keyboard[lo:rows], None if mouse is None else mouse[lo:rows])[self.rows - lo:]
        start = None if self.rows == 0 else self._after[self.rows - 1]
        self._after = _room(self._after, rows)
        self._after[self.rows:rows] = integrate(steps, start)
        self.rows = rows

    def truncate(self, rows: int) -> None:
        """Forget the rows from ``rows`` on (and the latent frames they reach)."""
        self.rows = min(self.rows, rows)
        self._latents = min(self._latents, 0 if rows == 0 else 1 + (rows - 1) // 4)

    def pixel_poses(self) -> torch.Tensor:
        """float64 [R, 4] pose of each pixel frame so far (:func:`frame_poses`: frame 0 the start pose)."""
        out = torch.zeros(self.rows, 4, dtype=torch.float64)
        if self.rows:
            out[1:] = self._after[:self.rows - 1]
        return out

    def pixel_range(self, start: int, end: int) -> torch.Tensor:
        """float64 [end - start, 4] poses of pixel frames ``start .. end - 1`` (the rows before ``end`` given)."""
        out = torch.zeros(end - start, 4, dtype=torch.float64)
        lo = max(start, 1)
        if end > lo:
            out[lo - start:] = self._after[lo - 1:end - 1]
        return out

    def latent_c2w(self, frames: int) -> torch.Tensor:
        """float64 [frames, 4, 4] camera-to-world pose of latent frames ``0 .. frames - 1`` (a view; latent
        frame f shows pixel frame 4f, :func:`latent_frame_poses`), each made once.

        Raises:
            ValueError: fewer rows integrated than the last frame needs.
        """
        if frames > self._latents:
            if 4 * (frames - 1) >= max(self.rows, 1):
                raise ValueError(f"latent frame {frames - 1} needs pixel frame {4 * (frames - 1)}: {self.rows} rows given")
            index = torch.arange(self._latents, frames) * 4
            pixel = torch.zeros(len(index), 4, dtype=torch.float64)
            later = index > 0
            pixel[later] = self._after[index[later] - 1]
            self._latent = _room(self._latent, frames)
            self._latent[self._latents:frames] = camera_to_world(pixel)
            self._latents = frames
        return self._latent[:frames]


def _room(buffer: torch.Tensor, rows: int) -> torch.Tensor:
    """``buffer`` with room for ``rows`` rows (doubled when short; the rows held are kept)."""
    if rows <= buffer.shape[0]:
        return buffer
    grown = torch.zeros(max(rows, 2 * buffer.shape[0]), *buffer.shape[1:], dtype=buffer.dtype)
    grown[:buffer.shape[0]] = buffer
    return grown


__all__ = ["DEG_PER_FRAME_PER_MOUSE", "PoseTrack", "MAX_PITCH_DEG", "TEMPLERUN_TURN_DEG", "UNITS_PER_FRAME", "camera_to_world",
           "dead_reckon", "frame_poses", "integrate", "latent_frame_poses", "plan_frame_poses", "pose_steps"]
