"""Run outputs: the streaming MP4, per-chunk JSONL records, summary JSON and the run folder.

Everything here is written so that a run killed at any moment leaves valid files: the video is
fragmented MP4 encoded by a separate ffmpeg process, JSONL records are fsync'ed one by one, and
JSON summaries are replaced atomically.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path, PurePath

import imageio_ffmpeg
import numpy as np

from .errors import OutputError

def cache_folder(cache: str) -> str:
    """Folder name of a cache spec (run folders of generate, compare, loopbench): ``mixed:2`` ->
    ``mixed-2`` (``:`` is awkward in paths)."""
    return cache.replace(":", "-")


_GOP_FRAMES = 12  # one keyframe (= one MP4 fragment) per 12 pixel frames, about a chunk


def _reason(err: OSError) -> str:
    return err.strerror or str(err)


def tail_words(text, max_chars: int = 300) -> str:
    """The end of ``text`` with whitespace collapsed, at most ``max_chars`` long, cut at a word
    boundary and marked with a leading ``...`` when cut (ffmpeg's reason comes last)."""
    text = " ".join(str(text).split())
    if len(text) <= max_chars:
        return text
    cut = text[-(max_chars - 4):]
    space = cut.find(" ")
    return "... " + (cut[space + 1:] if 0 <= space < len(cut) - 1 else cut)


@contextmanager
def atomic_path(path: str | Path):
    """Write a file under a temporary name, then rename it over ``path``.

    Yields a path beside ``path`` (same folder and suffix, so writers that infer the format from
    the name work). When the block succeeds the file is fsync'ed and renamed to ``path``; when it
    fails the temporary file is removed. A reader never finds a zero-byte or torn file at ``path``
    (disk full, a killed process): it finds the old file or the new one.

    Raises:
        OutputError: an OSError while writing or renaming (disk full, permissions), naming ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        raise OutputError(f"cannot write {path}: {_reason(err)}") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


# --------------------------------------------------------------------------- video


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
    Raises OutputError when the file cannot be created or ffmpeg fails while writing or closing.
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
        try:
            # Fail here with a clear message rather than later inside ffmpeg.
            self.path.open("wb").close()
        except OSError as err:
            raise OutputError(f"cannot write video {self.path}: {_reason(err)}") from None
        self._log = tempfile.TemporaryFile()  # ffmpeg's messages, quoted when it fails
        rate = Fraction(fps).limit_denominator(1001)
        cmd = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-loglevel", "warning", "-y",
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


def _tail(err: Exception, max_chars: int = 300) -> str:
    # ffmpeg's own reason comes last, after its banner.
    return tail_words(err, max_chars)


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise OutputError(f"cannot read video {path}: no such file")
    return path


# --------------------------------------------------------------------------- JSON


def to_jsonable(obj):
    """Plain-JSON copy of ``obj``: numpy/torch scalars and arrays become numbers and lists,
    paths strings, dataclasses dicts, tuples lists; NaN and +-inf become null (JSON has none).
    Raises TypeError for any other type."""
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k if isinstance(k, str) else str(to_jsonable(k)): to_jsonable(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, (np.generic, np.ndarray)):
        return to_jsonable(obj.tolist())
    if hasattr(obj, "detach") and hasattr(obj, "tolist"):  # torch tensor
        return to_jsonable(obj.detach().cpu().tolist())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    raise TypeError(f"cannot write a {type(obj).__name__} to JSON")


def _dumps(obj, indent: int | None = None) -> str:
    return json.dumps(to_jsonable(obj), indent=indent, allow_nan=False, ensure_ascii=False)


class JsonlWriter:
    """One JSON object per line, flushed and fsync'ed per record, so a killed run keeps every
    record it finished.

    ``append=True`` continues an existing file; a record cut off by a previous crash is removed
    first, so the new records start on a line of their own. Raises OutputError (naming the path)
    when the file cannot be opened or written (e.g. disk full).
    """

    def __init__(self, path: str | Path, append: bool = False):
        self.path = Path(path)
        self.records_written = 0
        try:
            if append and self.path.exists():
                _drop_partial_line(self.path)
            self._file = self.path.open("a" if append else "w", encoding="utf-8")
        except OSError as err:
            raise OutputError(f"cannot write {self.path}: {_reason(err)}") from None

    def write(self, record: Mapping) -> None:
        """Append one record (a mapping; values converted by :func:`to_jsonable`)."""
        if not isinstance(record, Mapping):
            raise TypeError(f"a JSONL record must be a mapping, got {type(record).__name__}")
        line = _dumps(record) + "\n"
        try:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as err:
            raise OutputError(f"cannot write {self.path}: {_reason(err)}") from None
        self.records_written += 1

    def close(self) -> None:
        """Close the file. Idempotent."""
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drop_partial_line(path: Path, block_bytes: int = 65536) -> None:
    """Cut a file back after its last newline, dropping a record a crash interrupted."""
    with path.open("r+b") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        cut, pos = 0, end
        while pos > 0:
            step = min(block_bytes, pos)
            pos -= step
            f.seek(pos)
            newline = f.read(step).rfind(b"\n")
            if newline >= 0:
                cut = pos + newline + 1
                break
        f.truncate(cut)


def read_jsonl_checked(path: str | Path) -> tuple[list[dict], bool]:
    """(records of a JSONL file in order, ``torn``): a cut-off last line (a killed writer: no newline
    after it and not valid JSON) is dropped and reported as ``torn``.

    Raises:
        OutputError: a missing or unreadable file.
        FolderInconsistent: a malformed line other than the last (names the file and line).
    """
    from .errors import FolderInconsistent

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise OutputError(f"cannot read {path}: {_reason(err)}") from None
    lines = data.split(b"\n")
    records, torn = [], False
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            if number == len(lines):  # no newline after it: cut off mid-write
                torn = True
                break
            raise FolderInconsistent(f"{path}:{number}: not a JSON record") from None
        if not isinstance(record, dict):
            raise FolderInconsistent(f"{path}:{number}: expected a JSON object")
        records.append(record)
    return records, torn


def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a JSONL file, in order; a torn last line is dropped (:func:`read_jsonl_checked`)."""
    return read_jsonl_checked(path)[0]


def write_jsonl_atomic(path: str | Path, records: list[dict]) -> None:
    """Replace a JSONL file by ``records`` (temporary file, fsync, rename). Raises OutputError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write("".join(_dumps(r) + "\n" for r in records))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {path}: {_reason(err)}") from None


def write_json_atomic(path: str | Path, obj, indent: int = 2) -> None:
    """Write ``obj`` as JSON (via :func:`to_jsonable`) to a temporary file in the same folder,
    fsync it, then rename it over ``path``: readers see the old file or the new, never half.
    Raises OutputError on any OSError."""
    path = Path(path)
    text = _dumps(obj, indent=indent) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the folder itself is the problem; the message below says so
            pass
        raise OutputError(f"cannot write {path}: {_reason(err)}") from None


def _ignore_stop_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _ffmpeg_copy(args: list[str], what: str) -> None:
    """Run imageio-ffmpeg's ffmpeg with stream copy arguments; OutputError with its message on failure."""
    cmd = [imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-y", *args]
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
