"""A LingBot run's text and camera inputs, read and checked without torch (spec §10.3, §10.4, §11).

``poses.npy`` / ``intrinsics.npy`` are validated here (:func:`~.camera.load_poses`,
:func:`~.camera.load_intrinsics`: shape, NaN/inf, rigid rotations, positive focal lengths), so a
bad file is reported in a fraction of a second, before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .camera import load_intrinsics, load_poses


@dataclass(frozen=True)
class LingbotInputs:
    """A LingBot run's inputs besides the image and the actions.

    Attributes:
        prompt: the text prompt ("" when none is given: umT5 still encodes its EOS token).
        poses: float64 [N, 4, 4] camera-to-world poses (OpenCV axes), one per pixel frame, or None:
            the trajectory's actions drive the camera through the motion model.
        intrinsics: float64 [M, 4] [fx, fy, cx, cy] in 480x832 pixels (row 0 used), or None for
            :data:`~.camera.DEFAULT_INTRINSICS`.
    """

    prompt: str = ""
    poses: np.ndarray | None = None
    intrinsics: np.ndarray | None = None


def load_lingbot_inputs(prompt: str | None, poses: str | Path | None, intrinsics: str | Path | None) -> LingbotInputs:
    """Read and validate the files (paths as given: the caller resolves them).

    Raises:
        InputError: a missing or unreadable file, poses that are not [N, 4, 4] rigid camera-to-world
            matrices, or bad intrinsics (one line naming the file and the first bad row).
    """
    return LingbotInputs(prompt or "", None if poses is None else load_poses(poses),
                         None if intrinsics is None else load_intrinsics(intrinsics))
