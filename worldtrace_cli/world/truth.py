"""Ground truth of a run in the procedural world: the start image and the true pixel frames.

A run of a ``world: procedural`` preset (``loopworld``) is conditioned on the world's view from the
motion model's start pose, and every generated pixel frame k has a true counterpart: the world
rendered at :func:`~worldtrace_cli.world.motion.plan_frame_poses` ``[k]``, the pose the trajectory's
actions lead to. :mod:`worldtrace_cli.metrics` scores generated frames against it (GT-PSNR, GT-SSIM).
"""

from __future__ import annotations

import numpy as np

from .motion import plan_frame_poses
from .render import render_frames, render_view
from .scene import make_world


class GroundTruth:
    """True frames of one run.

    Args:
        world_seed: the world (any integer >= 0).
        plan: the run's :class:`~worldtrace_cli.trajectory.ActionPlan` (universal mode).
        height, width: frame size in pixels.
        style: the world's style (:data:`~worldtrace_cli.world.scene.STYLES`; a preset's ``world:``);
            None = ``procedural``.
        track: a :class:`~worldtrace_cli.world.motion.PoseTrack` the run grows (a live session's), read
            as its rows arrive; None: ``plan``'s poses, computed now.
    Raises:
        ValueError: a plan whose mode has no camera model in the world (only ``universal`` walks and
            looks around freely); a negative seed (from :func:`~worldtrace_cli.world.scene.make_world`).
    """

    def __init__(self, world_seed: int, plan, height: int, width: int, style: str | None = None, track=None):
        if plan.mode != "universal":
            raise ValueError(f"the procedural world is walked in universal mode, not {plan.mode!r}")
        self.world_seed = int(world_seed)
        self.world = make_world(self.world_seed, style=style or "procedural")
        # a whole plan's poses now, or a growing run's from its PoseTrack as its rows arrive
        self.track = track
        self.poses = None if track is not None else plan_frame_poses(plan).numpy()  # float64 [R, 4]
        self.height, self.width = height, width

    def pixel_poses(self, start: int, end: int) -> np.ndarray:
        """float64 [end - start, 4]: the motion model's poses of pixel frames ``start .. end - 1``."""
        if self.track is not None:
            return self.track.pixel_range(start, end).numpy()
        return self.poses[start:end]

    def start_image(self) -> np.ndarray:
        """uint8 [H, W, 3]: the view at pixel frame 0 (the conditioning image: the start pose)."""
        start = np.zeros(4) if self.track is not None else self.poses[0]
        return render_view(self.world, start, self.height, self.width)

    def frames(self, start: int, end: int) -> np.ndarray:
        """uint8 [end - start, H, W, 3]: the true pixel frames ``start .. end - 1``."""
        return render_frames(self.world, self.pixel_poses(start, end), self.height, self.width)

    def write_video(self, path, fps: float, num_chunks: int, progress: bool = False):
        """Write the true frames of chunks ``0 .. num_chunks - 1`` as an MP4 at ``fps`` (frames per
        second), rendered and written chunk by chunk, laid out as ``generate`` lays out its video,
        under a temporary name renamed at the end (never a torn file at ``path``). Returns the path. Raises OutputError (from the video writer) when it cannot be written."""
        from tqdm import tqdm

        from ..outputs import VideoStreamWriter, atomic_path
        from ..trajectory import chunk_rows

        # under a temporary name, then renamed: an interrupted compare never leaves a torn truth panel
        with atomic_path(path) as tmp, VideoStreamWriter(tmp, self.width, self.height, fps) as video:
            for c in tqdm(range(num_chunks), unit="chunk", disable=not progress):
                video.write(self.frames(*chunk_rows(c)))
        return path


__all__ = ["GroundTruth"]
