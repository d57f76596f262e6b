"""Actions in MG2's layout: modes and their vocabularies, trajectory data, and the per-pixel-frame
action rows a rollout reads (:func:`plan_actions`). The YAML parser is :mod:`worldtrace_cli.trajectory`
(which re-exports everything here).

Row layout (MG2 spec §11): a rollout of C chunks has N = 3C latent frames and R = 4N - 3 = 12C - 3
pixel frames, with one action row per pixel frame. Chunk 0 owns rows [0, 9); chunk c >= 1 owns
rows [12c - 3, 12c + 9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..errors import InputError

if TYPE_CHECKING:  # torch is imported lazily so that parsing a file stays light
    import torch

FIRST_CHUNK_FRAMES = 9  # pixel frames decoded from chunk 0 (1 + 4 * 2)
CHUNK_FRAMES = 12  # pixel frames decoded from every later chunk (4 * 3)
CAMERA_STEP = 0.1  # MG2's demo mouse magnitude for the camera_* macros
MAX_CHUNKS = 100_000  # bounds a trajectory's length (and the tensors plan_actions builds)
MAX_LABEL_CHARS = 64
MAX_TRAJECTORY_BYTES = 1 << 20  # 1 MiB: tens of thousands of segments; parsing it takes seconds


# --------------------------------------------------------------------------- chunk layout


def frames_for_chunks(num_chunks: int, frames_per_chunk: int = 3) -> int:
    """Pixel frames (= action rows) of a rollout of ``num_chunks`` chunks: ``12 C - 3`` (MG2); with
    ``frames_per_chunk`` F latent frames per chunk, ``4 F C - 3`` (LingBot, F = 4: ``16 C - 3``);
    0 for no chunk."""
    return 4 * frames_per_chunk * num_chunks - 3 if num_chunks > 0 else 0


def chunks_for_frames(num_frames: int, frames_per_chunk: int = 3) -> int:
    """Smallest chunk count C >= 1 whose ``4 F C - 3`` pixel frames cover ``num_frames`` rows."""
    return max(1, math.ceil((num_frames + 3) / (4 * frames_per_chunk)))


def chunk_rows(chunk: int, frames_per_chunk: int = 3) -> tuple[int, int]:
    """Pixel-frame rows ``[start, end)`` owned by ``chunk`` (0 -> (0, 9); c -> (12c-3, 12c+9) for MG2;
    with F latent frames per chunk 0 -> (0, 4F-3), c -> (4Fc-3, 4F(c+1)-3)).

    Raises ValueError for a negative chunk index.
    """
    if chunk < 0:
        raise ValueError(f"chunk index must be >= 0, got {chunk}")
    if chunk == 0:
        return 0, frames_for_chunks(1, frames_per_chunk)
    start = frames_for_chunks(chunk, frames_per_chunk)
    return start, start + 4 * frames_per_chunk


def chunk_of_row(row: int, frames_per_chunk: int = 3) -> int:
    """Chunk that owns pixel-frame row ``row`` (>= 0); row ``4 F C - 3`` gives C (the next chunk)."""
    return (row + 3) // (4 * frames_per_chunk)


# --------------------------------------------------------------------------- vocabularies


@dataclass(frozen=True)
class Macro:
    """A named action: keyboard indices pressed and the mouse axes it sets (None = untouched)."""

    keys: tuple[int, ...] = ()
    pitch: float | None = None
    yaw: float | None = None


@dataclass(frozen=True)
class ModeSpec:
    """One MG2 action vocabulary (spec §13).

    ``key_letters[i]`` is the letter of keyboard index i; ``one_hot`` means exactly one index is
    set per row (templerun); ``exclusive_keys`` are index pairs that contradict (W and S);
    ``pitch`` says whether the mouse pitch is used (gta_drive steers with yaw only).
    """

    name: str
    keyboard_dim: int
    mouse: bool
    key_letters: str
    macros: Mapping[str, Macro]
    one_hot: bool = False
    pitch: bool = True
    exclusive_keys: tuple[tuple[int, int], ...] = ()


_S = CAMERA_STEP
MODES: dict[str, ModeSpec] = {
    "universal": ModeSpec(
        name="universal", keyboard_dim=4, mouse=True, key_letters="WSAD",
        exclusive_keys=((0, 1), (2, 3)),
        macros=MappingProxyType({
            "forward": Macro(keys=(0,)), "back": Macro(keys=(1,)),
            "left": Macro(keys=(2,)), "right": Macro(keys=(3,)),
            "camera_l": Macro(yaw=-_S), "camera_r": Macro(yaw=_S),
            "camera_up": Macro(pitch=_S), "camera_down": Macro(pitch=-_S),
            "idle": Macro(),
        }),
    ),
    "gta_drive": ModeSpec(
        # MG2 steers the car with the A/D keys, which it encodes as mouse yaw.
        name="gta_drive", keyboard_dim=2, mouse=True, key_letters="WS", pitch=False,
        exclusive_keys=((0, 1),),
        macros=MappingProxyType({
            "forward": Macro(keys=(0,)), "back": Macro(keys=(1,)),
            "left": Macro(yaw=-_S), "right": Macro(yaw=_S),
            "camera_l": Macro(yaw=-_S), "camera_r": Macro(yaw=_S),
            "idle": Macro(),
        }),
    ),
    "templerun": ModeSpec(
        name="templerun", keyboard_dim=7, mouse=False, key_letters="QWSZCAD", one_hot=True,
        macros=MappingProxyType({
            "idle": Macro(keys=(0,)), "jump": Macro(keys=(1,)), "slide": Macro(keys=(2,)),
            "turn_left": Macro(keys=(3,)), "turn_right": Macro(keys=(4,)),
            "left": Macro(keys=(5,)), "right": Macro(keys=(6,)),
        }),
    ),
    # Self-Forcing / LongLive: prompt segments, no keyboard or mouse (worldtrace_cli.trajectory.prompts)
    "text": ModeSpec(name="text", keyboard_dim=0, mouse=False, key_letters="", macros=MappingProxyType({})),
}


# --------------------------------------------------------------------------- parsed records


@dataclass(frozen=True)
class Segment:
    """One trajectory segment.

    action: display name, e.g. ``"forward+camera_l"`` (``""`` for a label-only marker).
    keyboard: ``keyboard_dim`` floats in {0, 1}; mouse: ``(pitch, yaw)``, None in templerun.
    num_frames: length in pixel frames (action rows); 0 for a label-only waypoint marker.
    label: waypoint label at the segment's first row, or None; line: 1-based line in the file.
    prompt: mode ``text`` only: the segment's prompt (None: the trajectory's top-level prompt);
    ``keyboard`` is then empty and ``action`` the prompt shortened.
    """

    action: str
    keyboard: tuple[float, ...]
    mouse: tuple[float, float] | None
    num_frames: int
    label: str | None
    line: int
    prompt: str | None = None


@dataclass(frozen=True)
class Trajectory:
    """A parsed trajectory: ``source`` names the file (for messages), ``image`` is resolved
    against the file's folder, ``segments`` are in order (markers included). LingBot presets also
    read ``prompt`` (text) and ``poses`` / ``intrinsics`` (LingBot's own ``poses.npy`` /
    ``intrinsics.npy``, resolved against the file's folder like ``image``)."""

    source: str
    mode: str
    image: Path | None
    seed: int | None
    segments: tuple[Segment, ...]
    prompt: str | None = None
    poses: Path | None = None
    intrinsics: Path | None = None

    @property
    def num_frames(self) -> int:
        """Total length in pixel frames (action rows)."""
        return sum(s.num_frames for s in self.segments)

    @property
    def num_chunks(self) -> int:
        """Chunks needed to cover the rows: smallest C with ``12 C - 3 >= num_frames``."""
        return chunks_for_frames(self.num_frames)


# --------------------------------------------------------------------------- YAML node access


# --------------------------------------------------------------------------- action plan


@dataclass
class ActionPlan:
    """Per-pixel-frame action rows for a rollout of ``num_chunks`` chunks.

    keyboard: float32 [R, keyboard_dim], R = 12 * num_chunks - 3 (one row per pixel frame).
    mouse: float32 [R, 2] as (pitch, yaw), or None for templerun.
    chunk_actions: per chunk, the display names of the segments covering its rows, joined
    with '>' (e.g. ``"forward>camera_l"``).
    waypoints: (chunk index, label); a label at row r belongs to the chunk owning row r, and a
    label at r == R (the end) to chunk ``num_chunks``.
    notes: human-readable remarks (repetition past the trajectory's end, truncation).
    frames_per_chunk: latent frames per chunk of the layout (3 MG2, 4 LingBot: 16 C - 3 rows).
    prompts: mode ``text``: each chunk's segment prompt (None where the segment has none: the run's
        default prompt applies, :func:`~worldtrace_cli.jobs.inputs.prepare_inputs`); else None.
    """

    mode: str
    num_chunks: int
    keyboard: torch.Tensor
    mouse: torch.Tensor | None
    chunk_actions: list[str]
    waypoints: list[tuple[int, str]]
    notes: list[str]
    frames_per_chunk: int = 3
    prompts: list | None = None

    @property
    def num_frames(self) -> int:
        """R, the number of pixel frames (action rows)."""
        return frames_for_chunks(self.num_chunks, self.frames_per_chunk)


def plan_actions(traj: Trajectory, num_chunks: int | None = None, frames_per_chunk: int = 3) -> ActionPlan:
    """Lay a trajectory out as MG2 action rows for ``num_chunks`` chunks (default: its own).
    ``frames_per_chunk`` latent frames per chunk sets the chunk layout (4 for LingBot: chunk c owns
    16 rows, chunk 0 13; the trajectory's rows and their actions are the same either way).

    Rows past the trajectory's end (a longer run, or the tail of its last chunk) repeat its last
    segment that has a length; a shorter run truncates it and drops waypoints past the end.
    Raises InputError when num_chunks is not an integer >= 1.
    """
    import torch

    fpc = frames_per_chunk
    traj_chunks = chunks_for_frames(traj.num_frames, fpc)
    if num_chunks is None:
        num_chunks = traj_chunks
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise InputError(f"number of chunks must be an integer >= 1, got {num_chunks!r}")
    spec = MODES[traj.mode]
    total = frames_for_chunks(num_chunks, fpc)
    keyboard = torch.zeros(total, spec.keyboard_dim, dtype=torch.float32)
    mouse = torch.zeros(total, 2, dtype=torch.float32) if spec.mouse else None

    spans: list[tuple[int, int, Segment]] = []  # [start, end) rows, clipped to the rollout
    waypoints: list[tuple[int, str]] = []
    dropped: list[str] = []
    row = 0
    for seg in traj.segments:
        if seg.label is not None:
            if row <= total:
                waypoints.append((chunk_of_row(row, fpc), seg.label))
            else:
                dropped.append(f"{seg.label} (chunk {chunk_of_row(row, fpc)})")
        if seg.num_frames and row < total:
            spans.append((row, min(row + seg.num_frames, total), seg))
        row += seg.num_frames
    last = next(s for s in reversed(traj.segments) if s.num_frames)
    if row < total:
        spans.append((row, total, last))

    chunk_names: list[list[str]] = [[] for _ in range(num_chunks)]
    prompts = [None] * num_chunks if traj.mode == "text" else None
    for start, end, seg in spans:
        if prompts is not None:
            for c in range(chunk_of_row(start, fpc), chunk_of_row(end - 1, fpc) + 1):
                prompts[c] = seg.prompt
        keyboard[start:end] = torch.tensor(seg.keyboard, dtype=torch.float32)
        if mouse is not None:
            mouse[start:end] = torch.tensor(seg.mouse, dtype=torch.float32)
        for c in range(chunk_of_row(start, fpc), chunk_of_row(end - 1, fpc) + 1):
            if not chunk_names[c] or chunk_names[c][-1] != seg.action:
                chunk_names[c].append(seg.action)

    notes: list[str] = []
    if num_chunks > traj_chunks:
        notes.append(f"trajectory covers {traj_chunks} chunks; {num_chunks} requested: its last "
                     f"segment ({last.action}) repeats for {num_chunks - traj_chunks} more chunks")
    if num_chunks >= traj_chunks and row < frames_for_chunks(traj_chunks, fpc):
        notes.append(f"trajectory ends at pixel frame {row}, inside chunk {traj_chunks - 1}: its "
                     f"last segment ({last.action}) fills the remaining "
                     f"{frames_for_chunks(traj_chunks, fpc) - row} rows")
    if num_chunks < traj_chunks:
        notes.append(f"trajectory covers {traj_chunks} chunks; truncated to {num_chunks} chunks")
    if dropped:
        notes.append(f"waypoints past chunk {num_chunks} dropped: {', '.join(dropped)}")
    return ActionPlan(mode=traj.mode, num_chunks=num_chunks, keyboard=keyboard, mouse=mouse,
                      chunk_actions=[">".join(n) for n in chunk_names], waypoints=waypoints,
                      notes=notes, frames_per_chunk=fpc, prompts=prompts)


__all__ = ["ActionPlan", "CAMERA_STEP", "CHUNK_FRAMES", "FIRST_CHUNK_FRAMES", "MAX_CHUNKS", "MAX_LABEL_CHARS", "MAX_TRAJECTORY_BYTES", "MODES", "Macro", "ModeSpec", "Segment", "Trajectory", "chunk_of_row", "chunk_rows", "chunks_for_frames", "frames_for_chunks", "plan_actions"]
