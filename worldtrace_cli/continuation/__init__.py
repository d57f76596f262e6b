"""Continue a real video with its memory: a video prefix committed to the KV cache, and the real frames
that follow it to score the continuation against (``--prefix``, ``--prefix-chunks``, ``--reference``;
docs/continue.md).

A prefix is ``K`` whole chunks of a real clip (an MP4, a folder of frames, or ``truth:K``: the first K
chunks of a procedural world's true render). Its pixel frames are encoded by the preset's VAE
(:meth:`~worldtrace_cli.engine.base.PipelineBase.encode_prefix`) and committed chunk by chunk through
the writer with the backbone's context pass
(:meth:`~worldtrace_cli.engine.rollout.ChunkRollout.set_prefix`), so every writer sees a real past
exactly as it sees its own chunks; generation goes on after it. The reference is what the clip
shows after the prefix; each generated chunk is scored against it (PSNR / SSIM / MSE, MIND's "lcm"
group without LPIPS: :mod:`worldtrace_cli.metrics.reference`).

Everything here is torch-free and runs before a model loads, so a prefix that does not fit is a
one-line :class:`~worldtrace_cli.errors.InputError`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..trajectory.actions import frames_for_chunks

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
TRUTH = re.compile(r"^truth:(\d+)$")
MARK_RGB = (255, 140, 0)  # the border drawn on a prefix's frames in video.mp4 (orange)
MARK_PX = 2


def whole_chunk_frames(frames: int, frames_per_chunk: int) -> list[int]:
    """The pixel-frame counts of whole chunks nearest ``frames`` (for a refusal's hint): the largest
    at most ``frames`` and the next one."""
    k = max(1, (frames + 3) // (4 * frames_per_chunk))
    return [n for n in (frames_for_chunks(k, frames_per_chunk), frames_for_chunks(k + 1, frames_per_chunk)) if n > 0]


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def frame_files(folder: Path) -> list[Path]:
    """A folder's image files (``IMAGE_SUFFIXES``, any case) in natural name order (``f2`` before ``f10``)."""
    return sorted((p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES),
                  key=lambda p: _natural(p.name))


def probe_clip(path: str | Path, flag: str = "--prefix") -> dict:
    """A clip's frame count, size and frame rate without decoding it: ``{"frames", "width", "height",
    "fps"}`` (``fps`` None for a folder of frames).

    Raises:
        InputError: a missing path, a folder without image files, a file that is not a readable video
            (one line naming ``flag`` and the path).
    """
    from PIL import Image

    path = Path(path)
    if not path.exists():
        raise InputError(f"{flag} {path}: no such file or folder")
    if path.is_dir():
        files = frame_files(path)
        if not files:
            raise InputError(f"{flag} {path}: a folder without frames ({', '.join(IMAGE_SUFFIXES)} files)")
        try:
            with Image.open(files[0]) as img:
                width, height = img.size
        except OSError as exc:
            raise InputError(f"{flag} {files[0]}: not a readable image ({type(exc).__name__})") from None
        return {"frames": len(files), "width": width, "height": height, "fps": None}
    from ..errors import OutputError
    from ..outputs import probe_video

    try:
        info = probe_video(path)
    except OutputError as exc:
        raise InputError(f"{flag} {path}: not a readable video ({' '.join(str(exc).split())[:160]})") from None
    if not info["frames"]:
        raise InputError(f"{flag} {path}: a video without frames")
    return info


def read_clip(path: str | Path, height: int, width: int, frames: int | None = None,
              flag: str = "--prefix") -> tuple[np.ndarray, list[str]]:
    """The first ``frames`` (None: all) pixel frames of a clip at ``height x width``, with notes on what
    was changed: uint8 ``[T, height, width, 3]``. Frames of another size are centre-cropped to the
    preset's aspect and resized (PIL's ``ImageOps.fit``, bilinear), as a conditioning image is.

    Raises:
        InputError: as :func:`probe_clip`; a frame of another size than the first, an unreadable frame.
    """
    from PIL import Image, ImageOps

    path = Path(path)
    info = probe_clip(path, flag)
    n = info["frames"] if frames is None else min(frames, info["frames"])
    if path.is_dir():
        raw = []
        for file in frame_files(path)[:n]:
            try:
                with Image.open(file) as img:
                    raw.append(np.asarray(img.convert("RGB")))
            except OSError as exc:
                raise InputError(f"{flag} {file}: not a readable image ({type(exc).__name__})") from None
            if raw[-1].shape != raw[0].shape:
                raise InputError(f"{flag} {file}: {raw[-1].shape[1]}x{raw[-1].shape[0]} px, but the first frame is "
                                 f"{raw[0].shape[1]}x{raw[0].shape[0]}")
        clip = np.stack(raw)
    else:
        from ..outputs import read_video_frames

        clip = read_video_frames(path, indices=range(n))
    notes = []
    if clip.shape[1:3] != (height, width):
        notes.append(f"{flag} {path}: {clip.shape[2]}x{clip.shape[1]} px frames centre-cropped to the preset's aspect "
                     f"and resized to {width}x{height}")
        clip = np.stack([np.asarray(ImageOps.fit(Image.fromarray(f), (width, height), Image.BILINEAR)) for f in clip])
    return np.ascontiguousarray(clip, dtype=np.uint8), notes


@dataclass
class PrefixPlan:
    """What a run's ``--prefix`` resolves to, checked before the model loads.

    Attributes:
        source: as given (a path, or ``truth:K``); chunks: K, the chunks it covers; frames: K's pixel
            frames (``4 F K - 3``); reference: the path whose frames follow the prefix (the clip itself
            when it is longer, ``--reference``, or ``truth``), or None; reference_frames: pixel frames
            of the whole reference clip counted from frame 0 of the run (prefix included), or None
            (the world's truth: every frame); notes: what was changed (resized, another frame rate).
    """

    source: str
    chunks: int
    frames: int
    reference: str | None = None
    reference_frames: int | None = None
    notes: list = field(default_factory=list)

    @property
    def is_truth(self) -> bool:
        return TRUTH.match(self.source) is not None


def plan_prefix(cfg, num_chunks: int) -> PrefixPlan | None:
    """Resolve ``cfg.prefix`` / ``cfg.prefix_chunks`` / ``cfg.reference`` (a
    :class:`~worldtrace_cli.config.RunConfig`) for a run of ``num_chunks`` chunks, reading only the
    clips' headers. None without a prefix.

    Rules (docs/continue.md): a clip without ``--prefix-chunks`` must be whole chunks (chunk 0 takes
    ``4 F - 3`` pixel frames, each later one ``4 F``: 9, 21, 33, ... for MG2); with it, its first K
    chunks are the prefix and the frames after them the reference. ``--reference`` gives the frames
    that follow the prefix from another file (then the prefix clip must hold exactly K chunks).
    ``truth:K`` takes the first K chunks of the world's true render (presets with a world only), the
    truth is the reference. At least one chunk must be left to generate.

    Raises:
        InputError: one line naming the flag, the file and what does not fit.
    """
    spec, k_given, ref = cfg.prefix, cfg.prefix_chunks, cfg.reference
    preset = cfg.preset
    fpc = preset.frames_per_chunk
    if spec is None:
        for flag, value in (("--prefix-chunks", k_given), ("--reference", ref)):
            if value is not None:
                raise InputError(f"{flag}: needs --prefix (the real video the run continues)")
        return None
    if k_given is not None and k_given < 1:
        raise InputError(f"--prefix-chunks: must be >= 1, got {k_given}")
    spec = str(spec)
    truth = TRUTH.match(spec)
    if spec.startswith("truth:") and truth is None:
        raise InputError(f"--prefix {spec}: expected truth:K, K the chunks of the true render to commit (truth:4)")
    if truth is not None:
        if not preset.has_world:
            raise InputError(f"--prefix {spec}: preset {preset.name} has no procedural world to render the truth of "
                             f"(pass a video or a folder of frames)")
        if cfg.image is not None:
            raise InputError(f"--prefix {spec}: the world's true render starts at its own view; drop --image")
        k = int(truth.group(1))
        if k_given is not None and k_given != k:
            raise InputError(f"--prefix-chunks {k_given}: --prefix {spec} already says {k} chunks")
        if ref is not None:
            raise InputError(f"--reference: --prefix {spec} is scored against the world's truth; drop --reference")
        plan = PrefixPlan(spec, k, frames_for_chunks(k, fpc), "truth", None)
    else:
        info = probe_clip(spec)
        have = info["frames"]
        notes = []
        if info["fps"] and abs(info["fps"] - preset.fps) > 0.01 * preset.fps:
            notes.append(f"--prefix {spec}: {info['fps']:g} fps taken frame for frame (the preset's video is "
                         f"{preset.fps:g} fps; the model has no notion of seconds)")
        if k_given is None:
            k = (have + 3) // (4 * fpc)
            if k < 1 or frames_for_chunks(k, fpc) != have:
                near = " or ".join(str(n) for n in whole_chunk_frames(have, fpc))
                raise InputError(f"--prefix {spec}: {have} pixel frames is not a whole number of chunks (chunk 0 takes "
                                 f"{4 * fpc - 3}, each next {4 * fpc}: {near}); pass --prefix-chunks K to take the "
                                 f"first K chunks and score the continuation against the frames after them")
        else:
            k = k_given
            if frames_for_chunks(k, fpc) > have:
                raise InputError(f"--prefix-chunks {k}: needs {frames_for_chunks(k, fpc)} pixel frames, --prefix "
                                 f"{spec} has {have}")
        need = frames_for_chunks(k, fpc)
        reference, ref_frames = None, None
        if ref is not None:
            if have > need:
                raise InputError(f"--reference {ref}: --prefix {spec} holds {have - need} pixel frames after its {k} "
                                 f"chunks already; give one or the other as what follows the prefix")
            ref_info = probe_clip(ref, "--reference")
            reference, ref_frames = str(ref), need + ref_info["frames"]
        elif have > need:
            reference, ref_frames = spec, have
        plan = PrefixPlan(spec, k, need, reference, ref_frames, notes)
    if plan.chunks >= num_chunks:
        raise InputError(f"--prefix {spec}: covers {plan.chunks} chunks, the run has {num_chunks}: nothing is left to "
                         f"generate (--chunks N counts the prefix's chunks too: use --chunks {plan.chunks + 1} or more)")
    return plan


@dataclass
class Prefix:
    """A prefix's frames and its reference, read (before the model loads).

    Attributes:
        plan: the :class:`PrefixPlan`; frames: uint8 [plan.frames, H, W, 3], the real frames committed;
        reference: an object with ``frames(start, end)`` -> uint8 [n, H, W, 3] (pixel frames of the run,
            counted from its frame 0) and ``num_frames`` (None: unbounded), or None; sha256: of the
            frames' bytes (a resume refuses a changed prefix); notes: what was changed.
    """

    plan: PrefixPlan
    frames: np.ndarray
    reference: object
    sha256: str
    notes: list


class ClipFrames:
    """A real clip's frames as a reference: ``frames(start, end)`` of the run's pixel frames, clipped
    to the ``num_frames`` it holds."""

    def __init__(self, frames: np.ndarray):
        self.clip = frames
        self.num_frames = int(frames.shape[0])

    def frames(self, start: int, end: int) -> np.ndarray:
        return self.clip[start:min(end, self.num_frames)]


class TruthFrames:
    """A procedural world's truth (:class:`~worldtrace_cli.world.truth.GroundTruth`) as a reference."""

    def __init__(self, truth):
        self.truth, self.num_frames = truth, None

    def frames(self, start: int, end: int) -> np.ndarray:
        return self.truth.frames(start, end)


def load_prefix(cfg, plan: PrefixPlan, truth=None) -> Prefix:
    """Read a :class:`PrefixPlan`'s frames at the preset's size (``truth``: the run's
    :class:`~worldtrace_cli.world.truth.GroundTruth`, for ``truth:K``).

    Raises:
        InputError: as :func:`read_clip`; ``truth:K`` without a truth (a run given --image).
    """
    preset = cfg.preset
    h, w = preset.height, preset.width
    notes = list(plan.notes)
    if plan.is_truth:
        if truth is None:
            raise InputError(f"--prefix {plan.source}: the run has no ground truth to take the prefix from")
        frames, reference = truth.frames(0, plan.frames), TruthFrames(truth)
    else:
        whole = plan.reference == plan.source
        clip, said = read_clip(plan.source, h, w, None if whole else plan.frames)
        notes += said
        frames = clip[:plan.frames]
        reference = None
        if whole:
            reference = ClipFrames(clip)
        elif plan.reference is not None:
            after, said = read_clip(plan.reference, h, w, flag="--reference")
            notes += said
            reference = ClipFrames(np.concatenate([frames, after]))
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    return Prefix(plan, frames, reference, hashlib.sha256(frames.tobytes()).hexdigest(), notes)


def write_reference_video(cfg, folder: Path, plan) -> Path | None:
    """``folder/video.mp4``: the real clip a prefixed comparison continues (its prefix and the frames
    after it, up to the run's length), laid out as the runs' videos (``compare``'s first panel); None
    without a clip reference (no prefix, a prefix without frames after it, or ``truth:K``: the truth
    panel shows it). Raises OutputError when it cannot be written."""
    from ..outputs import VideoStreamWriter, atomic_path

    spec = plan_prefix(cfg, plan.num_chunks)
    if spec is None or spec.is_truth or spec.reference is None:
        return None
    ref = load_prefix(cfg, spec).reference
    frames = ref.frames(0, frames_for_chunks(plan.num_chunks, plan.frames_per_chunk))
    folder.mkdir(parents=True, exist_ok=True)
    preset = cfg.preset
    with atomic_path(folder / "video.mp4") as tmp, VideoStreamWriter(tmp, preset.width, preset.height, preset.fps) as video:
        video.write(frames)
    return folder / "video.mp4"


def write_frames_after(run_video: Path, dest: Path, start: int, fps: float) -> int:
    """A video's frames from pixel frame ``start`` to its end as ``dest`` (H.264, visually lossless),
    written atomically: a prefixed run's ``continuation.mp4``, a MIND submission's predicted frames
    (from ``mark_time``). Returns the frames written. Raises OutputError when ``run_video`` cannot be
    read or ``dest`` written."""
    from ..outputs import VideoStreamWriter, atomic_path, probe_video, read_video_frames

    info = probe_video(run_video)
    frames = read_video_frames(run_video, indices=range(start, info["frames"]))
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest) as tmp, VideoStreamWriter(tmp, info["width"], info["height"], fps) as video:
        video.write(frames)
    return int(len(frames))


def mark_prefix_frames(frames):
    """A copy of a prefix chunk's frames (uint8 [T, H, W, 3], numpy or torch) with a ``MARK_PX`` border in
    ``MARK_RGB``: how ``video.mp4`` shows which frames are the real clip's (records, metrics and
    ``frames_sha256`` keep the unmarked frames)."""
    out = np.array(frames.numpy() if hasattr(frames, "numpy") else frames, dtype=np.uint8, copy=True)
    m = MARK_PX
    out[:, :m], out[:, -m:], out[:, :, :m], out[:, :, -m:] = MARK_RGB, MARK_RGB, MARK_RGB, MARK_RGB
    return out


__all__ = ["ClipFrames", "MARK_RGB", "Prefix", "PrefixPlan", "TruthFrames", "frame_files",
           "load_prefix", "mark_prefix_frames", "plan_prefix", "probe_clip", "read_clip", "whole_chunk_frames",
           "write_frames_after", "write_reference_video"]
