"""Run videos: fragmented MP4 streamed to a separate ffmpeg process (imageio-ffmpeg's binary), so a
run killed at any moment leaves a playable file; probing, reading back, truncating and joining
them. Re-exported by :mod:`worldtrace_cli.outputs`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

import imageio_ffmpeg
import numpy as np

from ..errors import OutputError
from .files import _existing, _reason, _tail, tail_words


_GOP_FRAMES = 12  # one keyframe (= one MP4 fragment) per 12 pixel frames, about a chunk


def ffmpeg_exe() -> str:
    """Path of the ffmpeg executable imageio-ffmpeg uses (``IMAGEIO_FFMPEG_EXE``, its bundled binary,
    or one on PATH). Raises OutputError, one line, when there is none (e.g. an imageio-ffmpeg
    installed without its binary). Wraps ``imageio_ffmpeg.get_ffmpeg_exe``; called before a run folder
    is touched (``generate``) and by every ffmpeg process the module starts."""
    try:
        return imageio_ffmpeg.get_ffmpeg_exe()
    except RuntimeError as err:
        raise OutputError(f"no ffmpeg executable to write the MP4 ({_tail(err)}): install imageio-ffmpeg "
                          "with its bundled binary, or set IMAGEIO_FFMPEG_EXE to an ffmpeg built with "
                          "libx264") from None


class VideoStreamWriter:
    """MP4 written chunk by chunk: H.264 (libx264), yuv420p, fragmented MP4.

    ffmpeg (the binary shipped by imageio-ffmpeg) runs as a separate process in its own session,
    fed raw RGB frames through an unbuffered pipe. Fragmented MP4 (``frag_keyframe+empty_moov+
    default_base_moof``, ``-flush_packets 1``, a keyframe every 12 frames, ``-tune zerolatency``)
    makes the file playable at every fragment boundary, so:

    - if Python dies (crash, SIGKILL), ffmpeg sees end of input and finishes the file: every frame
      handed to :meth:`write` is kept;
    - if ffmpeg dies too, the fragments already written (all but at most the last ~12 frames) play.

    Odd sizes: yuv420p needs even width and height, so an odd dimension is padded by repeating
    the last row/column; ``encoded_width``/``encoded_height`` give the stored size.

    Parameters: path of the .mp4 (truncated if it exists); width, height in pixels; fps (pixel
    frames per second); crf, the x264 quality (0 lossless .. 51 worst; 18 is visually lossless);
    pass_fds, file descriptors ffmpeg inherits (a run folder's lock: held until ffmpeg has finished
    the file, also when a killed Python left it to finish alone).
    Raises OutputError when there is no ffmpeg executable, the file cannot be created, or ffmpeg
    fails while writing or closing.
    """

    def __init__(self, path: str | Path, width: int, height: int, fps: float = 25.0,
                 crf: int = 18, pass_fds: tuple[int, ...] = ()):
        if width < 1 or height < 1:
            raise ValueError(f"video size must be positive, got {width}x{height}")
        if not fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        if not 0 <= crf <= 51:
            raise ValueError(f"crf must be in [0, 51], got {crf}")
        self.path = Path(path)
        self.width, self.height, self.fps, self.crf = width, height, fps, crf
        self.encoded_width, self.encoded_height = width + width % 2, height + height % 2
        self.frames_written = 0
        self._closed = False
        exe = ffmpeg_exe()  # before the file is touched: no empty MP4 left behind
        try:
            # Fail here with a clear message rather than later inside ffmpeg.
            self.path.open("wb").close()
        except OSError as err:
            raise OutputError(f"cannot write video {self.path}: {_reason(err)}") from None
        self._log = tempfile.TemporaryFile()  # ffmpeg's messages, quoted when it fails
        rate = Fraction(fps).limit_denominator(1001)
        cmd = [
            exe, "-hide_banner", "-loglevel", "warning", "-y",
            "-f", "rawvideo", "-pix_fmt", "rgb24",
            "-s", f"{self.encoded_width}x{self.encoded_height}", "-r", str(rate), "-i", "-",
            "-an", "-c:v", "libx264", "-preset", "veryfast", "-tune", "zerolatency",
            "-crf", str(crf), "-pix_fmt", "yuv420p", "-g", str(_GOP_FRAMES),
            "-movflags", "frag_keyframe+empty_moov+default_base_moof", "-flush_packets", "1",
            "-f", "mp4", os.path.abspath(self.path),
        ]
        # Unbuffered stdin: a frame handed to write() is in ffmpeg's pipe when write() returns.
        # A new session keeps Ctrl-C away from ffmpeg, so an interrupted run closes it cleanly.
        # It also ignores SIGINT/SIGTERM (a scheduler signalling every process): it ends only when
        # its input ends, so every frame already handed over reaches the file.
        # copies of pass_fds (same open files, so the same locks): filelock closes its own descriptors
        # in forked children, which a preexec_fn runs
        keep = [os.dup(fd) for fd in pass_fds]
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=self._log, bufsize=0, start_new_session=True,
                                          preexec_fn=_ignore_stop_signals, pass_fds=keep)
        finally:
            for fd in keep:
                os.close(fd)

    @property
    def ffmpeg_pid(self) -> int:
        """Process id of the encoding ffmpeg (it outlives a killed Python to finish the file)."""
        return self._proc.pid

    def write(self, frames) -> None:
        """Append frames: uint8 RGB [T, H, W, 3], a numpy array or a torch tensor (moved to CPU).

        Raises ValueError for a wrong dtype/shape or a closed writer, OutputError if ffmpeg
        stopped (e.g. disk full).
        """
        if self._closed:
            raise ValueError(f"video writer for {self.path} is closed")
        if hasattr(frames, "detach"):  # a torch tensor; avoids importing torch here
            frames = frames.detach().cpu().numpy()
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (
                self.height, self.width, 3):
            raise ValueError(f"expected uint8 frames [T, {self.height}, {self.width}, 3], got "
                             f"{frames.dtype} {list(frames.shape)}")
        if self.encoded_height != self.height or self.encoded_width != self.width:
            pad = ((0, 0), (0, self.encoded_height - self.height),
                   (0, self.encoded_width - self.width), (0, 0))
            frames = np.pad(frames, pad, mode="edge")
        view = memoryview(np.ascontiguousarray(frames).reshape(-1))  # flat uint8 bytes
        try:
            while view:  # a raw pipe write may be partial (e.g. interrupted by a signal)
                view = view[self._proc.stdin.write(view):]
        except OSError as err:
            raise OutputError(f"writing video {self.path} failed ({_reason(err)}): "
                              f"{self._ffmpeg_message()}") from None
        self.frames_written += frames.shape[0]

    def close(self) -> None:
        """Finish the file and wait for ffmpeg. Idempotent. Raises OutputError if ffmpeg failed."""
        if self._closed:
            return
        self._closed = True
        try:
            self._proc.stdin.close()
        except OSError:  # ffmpeg already gone: its exit status below says why
            pass
        code = self._proc.wait()
        message = self._ffmpeg_message()
        self._log.close()
        if code != 0:
            raise OutputError(f"ffmpeg failed writing {self.path} (exit {code}): {message}")

    def _ffmpeg_message(self, max_chars: int = 500) -> str:
        self._log.seek(0)
        text = self._log.read().decode("utf-8", "replace")
        return tail_words(text, max_chars) or "no message from ffmpeg"

    def __enter__(self) -> VideoStreamWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def probe_video(path: str | Path) -> dict:
    """Frame count and format of a video: ``{"frames": int, "fps": float, "width": int,
    "height": int}`` (frames counted by demuxing the whole file). Raises OutputError if it cannot
    be read."""
    path = _existing(path)
    try:
        frames, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
        reader = imageio_ffmpeg.read_frames(str(path))
        try:
            meta = next(reader)
        finally:
            reader.close()
    except (OSError, RuntimeError, StopIteration) as err:
        raise OutputError(f"cannot read video {path}: {_tail(err)}") from None
    width, height = meta["size"]
    return {"frames": int(frames), "fps": float(meta["fps"]), "width": int(width),
            "height": int(height)}


def count_video_frames(path: str | Path) -> int:
    """Pixel frames in a video, counted by demuxing it (one ffmpeg run, no decoding). Raises
    OutputError if it cannot be read."""
    path = _existing(path)
    try:
        return int(imageio_ffmpeg.count_frames_and_secs(str(path))[0])
    except (OSError, RuntimeError) as err:
        raise OutputError(f"cannot read video {path}: {_tail(err)}") from None


def read_video_frames(path: str | Path, indices=None) -> np.ndarray:
    """Decode every frame, or only the frames whose 0-based index is in ``indices`` (streamed: the
    others are never held): uint8 RGB [T, H, W, 3] in video order (indices past the end are
    skipped). Raises OutputError if it cannot be read."""
    path = _existing(path)
    keep = None if indices is None else set(int(i) for i in indices)
    try:
        reader = imageio_ffmpeg.read_frames(str(path), pix_fmt="rgb24")
        meta = next(reader)
        width, height = meta["size"]
        frames = [np.frombuffer(buf, np.uint8).reshape(height, width, 3) for i, buf in enumerate(reader)
                  if keep is None or i in keep]
    except (OSError, RuntimeError, StopIteration) as err:
        raise OutputError(f"cannot read video {path}: {_tail(err)}") from None
    if not frames:
        return np.zeros((0, height, width, 3), np.uint8)
    return np.stack(frames)


def _ignore_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _ffmpeg_copy(args: list[str], what: str) -> None:
    """Run imageio-ffmpeg's ffmpeg with stream copy arguments; OutputError with its message on failure."""
    cmd = [ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-y", *args]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise OutputError(f"ffmpeg failed to {what}: {tail_words(proc.stderr)}")


_FRAG_FLAGS = ["-movflags", "frag_keyframe+empty_moov+default_base_moof"]


def truncate_video(path: str | Path, frames: int) -> None:
    """Keep the first ``frames`` pixel frames of an MP4 in place, without re-encoding.

    Our encoder makes no B-frames (``-tune zerolatency``), so the first N packets decode to exactly
    the first N frames. ``frames == 0`` removes the file. Raises OutputError on ffmpeg failure.
    """
    path = Path(path)
    if frames <= 0:
        path.unlink(missing_ok=True)
        return
    if not path.is_file():  # nothing to cut; callers check the frame count they need
        return
    tmp = path.with_name(path.stem + ".cut" + path.suffix)
    _ffmpeg_copy(["-i", str(path), "-map", "0:v:0", "-c", "copy", "-frames:v", str(frames), *_FRAG_FLAGS, str(tmp)],
                 f"truncate {path} to {frames} frames")
    os.replace(tmp, path)


def concat_videos(parts: list[str | Path], dest: str | Path) -> None:
    """Join MP4 files made by :class:`VideoStreamWriter` with identical settings into ``dest``
    (stream copy, fragmented MP4). ``dest`` may be one of the parts. Raises OutputError."""
    parts = [Path(p) for p in parts if Path(p).is_file()]
    dest = Path(dest)
    if not parts:
        return
    if len(parts) == 1:
        if parts[0] != dest:
            os.replace(parts[0], dest)
        return
    listing = dest.with_name(dest.stem + ".concat.txt")
    quote = lambda p: "'" + str(p.resolve()).replace("'", "'\\''") + "'"  # noqa: E731 (concat-demuxer quoting)
    listing.write_text("".join(f"file {quote(p)}\n" for p in parts))
    tmp = dest.with_name(dest.stem + ".joined" + dest.suffix)
    try:
        _ffmpeg_copy(["-f", "concat", "-safe", "0", "-i", str(listing), "-c", "copy", *_FRAG_FLAGS, str(tmp)],
                     f"join {', '.join(p.name for p in parts)}")
    finally:
        listing.unlink(missing_ok=True)
    os.replace(tmp, dest)
    for p in parts:
        if p != dest:
            p.unlink(missing_ok=True)


__all__ = ["VideoStreamWriter", "concat_videos", "count_video_frames", "ffmpeg_exe", "probe_video", "read_video_frames",
           "truncate_video"]
