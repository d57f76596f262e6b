"""Training clips of the procedural world: random universal-mode action rows, rendered at the
poses of the one motion model (:func:`~worldtrace_cli.world.motion.frame_poses`).

Clip kinds (each a function of a numpy ``Generator``, so a seed reproduces a clip exactly):

- ``loop`` ("look away and back within the window", loopworld-measurements.md): the chunk before
  the target chunk starts at a pose P, turns away by 30-90 degrees (and/or steps aside), and the
  target chunk comes back to exactly P at its last pixel frame, so the content the target needs is
  in the cache and nowhere else;
- ``walk``: piecewise-constant random actions (walk, strafe, turn at MG2's camera step 0.1 or
  twice it, small pitch, idle), like a user's trajectory.

Rows follow MG2's layout (``trajectory/actions.py``): a clip of C chunks has 12C - 3 pixel frames and as
many action rows; pixel frame k shows the pose after rows 0..k-1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..world.motion import DEG_PER_FRAME_PER_MOUSE, frame_poses
from ..world.render import render_frames
from ..world.scene import make_world

KEYS = "WSAD"  # universal keyboard index order


@dataclass
class Clip:
    """One rendered training clip.

    Attributes:
        world_seed: the world it shows.
        keyboard: float32 [R, 4] action rows; mouse: float32 [R, 2] (pitch, yaw).
        poses: float64 [R, 4] pose of every pixel frame.
        frames: uint8 [R, H, W, 3].
    """

    world_seed: int
    keyboard: torch.Tensor
    mouse: torch.Tensor
    poses: torch.Tensor
    frames: np.ndarray


def _segments_to_rows(segments, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """[(n_rows, keys str, pitch, yaw), ...] -> keyboard [rows, 4], mouse [rows, 2] (last segment repeats)."""
    keyboard = np.zeros((rows, 4), np.float32)
    mouse = np.zeros((rows, 2), np.float32)
    r = 0
    for n, keys, pitch, yaw in segments:
        end = min(rows, r + n)
        for k in keys:
            keyboard[r:end, KEYS.index(k)] = 1.0
        mouse[r:end] = (pitch, yaw)
        r = end
        if r >= rows:
            break
    if r < rows and segments:
        n, keys, pitch, yaw = segments[-1]
        for k in keys:
            keyboard[r:, KEYS.index(k)] = 1.0
        mouse[r:] = (pitch, yaw)
    return keyboard, mouse


_MOVES = ("", "", "W", "W", "S", "A", "D", "WA", "WD")


def walk_actions(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Piecewise-constant random actions for ``rows`` pixel frames (segments of 4-24 rows)."""
    segments = []
    total = 0
    while total < rows:
        n = int(rng.integers(4, 25))
        keys = _MOVES[rng.integers(len(_MOVES))]
        yaw = float(rng.choice([0.0, 0.0, 0.1, -0.1, 0.2, -0.2]))
        pitch = float(rng.choice([0.0, 0.0, 0.0, 0.0, 0.05, -0.05]))
        segments.append((n, keys, pitch, yaw))
        total += n
    return _segments_to_rows(segments, rows)


def loop_actions(rng: np.random.Generator, rows: int, start: int, end: int,
                 max_angle_deg: float = 90.0) -> tuple[np.ndarray, np.ndarray, int]:
    """Actions for ``rows`` pixel frames whose camera is at pose P at pixel frame ``start`` and back at
    exactly P at pixel frame ``end``.

    Before ``start`` and after ``end``: random walk (:func:`walk_actions`). The loop itself:
    optionally step sideways or forward (a few rows), turn away by a random angle in [30,
    ``max_angle_deg``] degrees (either side), idle, turn back by the same rows, and step back with
    the opposite key. Translation and rotation never share a row, so the return is exact.

    Returns:
        (keyboard [rows, 4], mouse [rows, 2], end).
    Raises:
        ValueError: not ``0 <= start``, ``start + 12 <= end < rows``.
    """
    if not (0 <= start and start + 12 <= end < rows):
        raise ValueError(f"need 0 <= start, start + 12 <= end < rows, got start={start}, end={end}, rows={rows}")
    keyboard, mouse = walk_actions(rng, rows)
    span = end - start          # pixel frame k shows the pose after rows < k: rows [start, end) make the loop
    move = str(rng.choice(["", "", "A", "D", "W"]))
    n_move = int(rng.integers(3, 7)) if move else 0
    room = (span - 2 * n_move) // 2
    n_turn = int(rng.integers(min(6, room), room + 1))
    angle = rng.uniform(30.0, max_angle_deg) * rng.choice([-1.0, 1.0])
    yaw = angle / (DEG_PER_FRAME_PER_MOUSE * n_turn)
    opposite = {"A": "D", "D": "A", "W": "S"}
    segments = []
    if move:
        segments.append((n_move, move, 0.0, 0.0))
    segments += [(n_turn, "", 0.0, yaw), (span - 2 * (n_move + n_turn), "", 0.0, 0.0), (n_turn, "", 0.0, -yaw)]
    if move:
        segments.append((n_move, opposite[move], 0.0, 0.0))
    k, m = _segments_to_rows([s for s in segments if s[0] > 0], span)
    keyboard[start:end], mouse[start:end] = k, m
    return keyboard, mouse, end


def render_clip(world_seed: int, keyboard, mouse, height: int, width: int, start_pose=None,
                style: str = "procedural") -> Clip:
    """Render the frames of action rows in world ``world_seed`` (pixel frame k at the pose after rows < k).

    Args:
        keyboard: [R, 4], mouse: [R, 2] (numpy or torch); start_pose: optional (x, y, yaw, pitch);
        style: the world's style (:data:`~worldtrace_cli.world.scene.STYLES`).
    """
    keyboard = torch.as_tensor(np.asarray(keyboard), dtype=torch.float32)
    mouse = torch.as_tensor(np.asarray(mouse), dtype=torch.float32)
    start = None if start_pose is None else torch.as_tensor(start_pose, dtype=torch.float64)
    poses = frame_poses("universal", keyboard, mouse, start)
    frames = render_frames(make_world(world_seed, style=style), poses, height, width)
    return Clip(world_seed, keyboard, mouse, poses, frames)


def random_start_pose(rng: np.random.Generator) -> tuple[float, float, float, float]:
    """A start pose in the plaza: within 3 units of the origin, any heading, level."""
    r, a = 3.0 * np.sqrt(rng.random()), rng.uniform(0, 2 * np.pi)
    return (float(r * np.cos(a)), float(r * np.sin(a)), float(rng.uniform(-180, 180)), 0.0)


__all__ = ["Clip", "loop_actions", "random_start_pose", "render_clip", "walk_actions"]
