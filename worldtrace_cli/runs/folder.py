"""The run folder: its file names (defined once), lock, preparation, status, consistency and truncation.

Every command that writes or reads a run (``generate``, ``--resume``, ``compare``, each ``loopbench``
job, ``metrics``, the LoopBench report) goes through :class:`RunFolder` (docs/outputs.md):

* ``video.mp4`` (fragmented MP4, appended chunk by chunk), ``chunks.jsonl`` (one record per chunk),
  ``summary.json`` (written last, atomically), ``cache_timeline.png``; ``resume/`` holds the saved
  state of a stopped run and ``video.part.mp4`` the chunks a resumed run added since.
* **One writer at a time**: :meth:`RunFolder.lock` takes an exclusive ``filelock`` (an OS-level
  ``flock`` on Unix, released by the kernel when its process dies, so a lock left by a killed
  process is simply taken over) before the folder is checked; a second process gets
  :class:`~worldtrace_cli.errors.FolderBusy` (exit 6) naming the holder. The video encoder inherits
  the lock (:attr:`RunFolder.lock_fd`), so after a SIGKILL the folder stays locked until the
  orphaned ffmpeg has finished ``video.mp4``: nobody joins or cuts a video still being written.
* **Consistency** (:meth:`RunFolder.check`): chunk ids 0..n-1 exactly once, and the video's pixel
  frames equal what the records cover; a torn last record (a killed writer) is reported as partial,
  a contradiction is :class:`~worldtrace_cli.errors.FolderInconsistent` (exit 7).
* **video.mp4 covers every record**: a resumed run appends to ``video.part.mp4`` and joins it into
  ``video.mp4`` when it finishes or stops; a part left by a killed resumed run is joined by the next
  process that takes the folder's lock or checks it (:meth:`RunFolder.join_video_part`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ..errors import FolderBusy, FolderInconsistent, InputError, OutputError

VIDEO = "video.mp4"
VIDEO_PART = "video.part.mp4"
CHUNKS = "chunks.jsonl"
SUMMARY = "summary.json"
TIMELINE = "cache_timeline.png"
CONTINUATION = "continuation.mp4"  # a prefixed run's generated frames alone (written when it completes)
STATE = "resume"
LOCK = ".worldtrace.lock"
HOLDER = ".worldtrace.lock.json"
RUN_FILES = (SUMMARY, CHUNKS, VIDEO, TIMELINE, CONTINUATION)  # a replaced run loses these (summary first)
LEFTOVERS = (STATE, STATE + ".old", STATE + ".tmp", VIDEO_PART)  # a replaced run's resume state goes too
STATE_NAMES = (STATE, STATE + ".old", STATE + ".tmp")
MANIFEST = ".worldtrace-run.json"  # written when a folder becomes a run's: the names below are then worldtrace's


log = logging.getLogger("worldtrace")


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


from .claims import (STATE_FILES, STATE_MARK, check_writable, foreign_names, is_state_folder,  # noqa: F401
                     read_claim, refuse_foreign, remove_state_folder, write_claim)


class RunFolder:
    """One run's folder (it need not exist yet).

    Args:
        path: the folder.
    Attributes:
        path, and the paths of its files: ``video`` (video.mp4), ``video_part`` (video.part.mp4),
        ``chunks`` (chunks.jsonl), ``summary_path`` (summary.json), ``timeline``
        (cache_timeline.png), ``state`` (the resume state folder).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.lock_fd: int | None = None  # while :meth:`lock` holds the lock: its file descriptor
        self.video, self.video_part = self.path / VIDEO, self.path / VIDEO_PART
        self.chunks, self.summary_path = self.path / CHUNKS, self.path / SUMMARY
        self.timeline, self.state = self.path / TIMELINE, self.path / STATE

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    # -- lock --------------------------------------------------------------------------------
    @contextmanager
    def lock(self, what: str = "generate"):
        """Hold the folder's exclusive lock for the block (creating the folder if needed).

        Raises:
            FolderBusy: another process holds it (its pid, command and start time are named).
            OutputError: the folder cannot be created, or the lock file cannot be (read-only filesystem,
                permissions).
        """
        from filelock import FileLock, Timeout

        self.make()
        lock = FileLock(str(self.path / LOCK), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise FolderBusy(f"{self.path} is in use by {self._holder()}; wait for it to finish or use "
                             f"another -o folder") from None
        except OSError as err:  # a read-only filesystem, no permission to create the lock file
            raise OutputError(f"output folder {self.path} is not writable: cannot create its lock "
                              f"{LOCK} ({_reason(err)})") from None
        # the descriptor, for the video encoder to inherit (filelock does not publish it: read defensively)
        self.lock_fd = getattr(getattr(lock, "_context", None), "lock_file_fd", None)
        info = {"pid": os.getpid(), "command": what, "argv": sys.argv,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        try:
            (self.path / HOLDER).write_text(json.dumps(info))
        except OSError:  # the lock itself is what matters; the holder note only improves messages
            pass
        try:
            try:
                self.join_video_part()  # a killed resumed run's chunks join video.mp4 first
            except OutputError as exc:  # the part stays; --overwrite or a resume still works
                log.warning(f"{self.path}: {exc}")
            yield self
        finally:
            try:
                (self.path / HOLDER).unlink(missing_ok=True)
            except OSError:
                pass
            self.lock_fd = None
            lock.release()

    def join_video_part(self) -> bool:
        """Join ``video.part.mp4`` (the chunks a resumed run added; left by a kill) into ``video.mp4``
        (stream copy, no re-encoding). Call while holding :meth:`lock`. An empty part (killed before
        its first frame) is removed. Returns True when a part was joined.

        Raises:
            OutputError: ffmpeg cannot join them (both files are left as they were).
        """
        from ..outputs import concat_videos

        if not self.video_part.is_file() or any(p == self.video_part for p, _ in self.foreign()):
            return False  # none, or a user's file under that name: left alone (prepare refuses it)
        if self.video_part.stat().st_size == 0:
            self.video_part.unlink()
            return False
        concat_videos([self.video, self.video_part], self.video)
        return True

    def settle(self) -> None:
        """Join a ``video.part.mp4`` that a killed resumed run left (:meth:`join_video_part`), when no
        process holds the folder (a running resume is left alone). Readers call it first, so
        ``video.mp4`` covers every record they read."""
        if not self.video_part.is_file():
            return
        try:
            with self.lock("settle"):  # the lock joins the part
                pass
        except (FolderBusy, OutputError):  # a run is writing the folder, or it is read-only
            pass

    def busy(self) -> str | None:
        """Who holds the folder's lock (a run still writing it), or None when nobody does. Tries the
        lock and releases it at once, writing nothing: a folder without a lock file (no worldtrace
        process ever wrote it) or whose lock cannot be opened counts as free."""
        from filelock import FileLock, Timeout

        if not (self.path / LOCK).is_file():
            return None
        lock = FileLock(str(self.path / LOCK), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            return self._holder()
        except OSError:
            return None
        lock.release()
        return None

    def _holder(self) -> str:
        try:
            info = json.loads((self.path / HOLDER).read_text())
            return (f"another worldtrace process (pid {info['pid']}, {info['command']}, since {info['since']}: "
                    f"{' '.join(info.get('argv', []))[:200]})")
        except (OSError, ValueError, KeyError, TypeError):
            return "another worldtrace process"

    # -- state of the folder -----------------------------------------------------------------
    def make(self) -> None:
        """Create the folder (and parents). Raises OutputError."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise OutputError(f"output folder {self.path} exists and is not a folder") from None
        except OSError as err:
            raise OutputError(f"cannot create output folder {self.path}: {_reason(err)}") from None

    def read_summary(self) -> dict | None:
        """``summary.json`` as a dict, or None when missing or unreadable."""
        try:
            doc = json.loads(self.summary_path.read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def is_complete(self) -> bool:
        """True when ``summary.json`` says ``"status": "complete"``."""
        return (self.read_summary() or {}).get("status") == "complete"

    def has_state(self) -> bool:
        """True when a resume state was saved (also one interrupted between its two renames)."""
        return any((self.path / name / "state.json").is_file() and is_state_folder(self.path / name)
                   for name in (STATE, STATE + ".old"))

    def holds_run(self) -> bool:
        """True when any run file is present (a finished, stopped or killed run), except for a run
        that ended before its first chunk (its summary says 0 chunks and ``chunks.jsonl`` is empty,
        e.g. ``--max-cache-gb`` reached at once): it holds nothing to lose, so a new run replaces it
        without ``--overwrite``."""
        if not any((self.path / name).exists() for name in RUN_FILES + (VIDEO_PART,)):
            return False
        summary = self.read_summary() or {}
        nothing = (summary.get("status") in ("failed", "aborted", "stopped")
                   and (summary.get("totals") or {}).get("chunks") == 0 and not self.video_part.exists()
                   and (not self.chunks.exists() or self.chunks.stat().st_size == 0))
        return not nothing

    def status(self) -> str:
        """``empty`` (no run), ``complete``, ``resumable`` (a saved state) or ``partial`` (a run
        killed or stopped without a state: its chunks are kept, it can only be redone)."""
        if self.is_complete():
            return "complete"
        if self.has_state():
            return "resumable"
        return "partial" if self.holds_run() else "empty"

    def prepare(self, overwrite: bool) -> "RunFolder":
        """Create (or reuse) the folder for a new run. Call it while holding :meth:`lock`.

        A folder holding a run (finished, or stopped: video, records or state) is refused unless
        ``overwrite``; with it the run files go, summary first (an interrupted rerun never looks
        finished), and any resume state; nothing worldtrace did not write (:meth:`foreign`, refused),
        with ``overwrite`` too. Then the folder is claimed (:data:`MANIFEST`).

        Raises:
            OutputError: the folder cannot be created or written, or holds a run.
        """
        self.make()
        self.refuse_occupied(overwrite)  # also refuses any of the names below that worldtrace did not write
        probe = self.path / f".worldtrace-write-test-{os.getpid()}"
        try:
            for name in RUN_FILES + LEFTOVERS:
                target = self.path / name
                if name in STATE_NAMES:
                    remove_state_folder(target)
                    if target.exists() or target.is_symlink():
                        raise OutputError(f"output folder {self.path} is not writable: cannot remove {target}")
                elif target.is_file():
                    target.unlink()
            probe.write_bytes(b"")
            probe.unlink()
            self._claim()
        except OSError as err:
            raise OutputError(f"output folder {self.path} is not writable: {_reason(err)}") from None
        return self

    def _claim(self) -> None:
        """Write :data:`MANIFEST` (:func:`~worldtrace_cli.runs.claims.write_claim`): from now on the run
        files and leftovers of this folder are worldtrace's, so a later ``--overwrite`` may replace them."""
        write_claim(self.path / MANIFEST, RUN_FILES + LEFTOVERS)

    def foreign(self) -> list[tuple[Path, str]]:
        """The names a run writes (run files, resume states, ``video.part.mp4``) present in the folder that
        worldtrace cannot prove it wrote, each with why (:func:`~worldtrace_cli.runs.claims.foreign_names`).
        Reads only; raises nothing."""
        return foreign_names(self.path, RUN_FILES + LEFTOVERS, STATE_NAMES, read_claim(self.path / MANIFEST),
                             self.summary_path, self.chunks)

    def refuse_occupied(self, overwrite: bool) -> None:
        """The refusals of :meth:`prepare` that read the folder without changing it (no lock, no
        torch): commands call it with their input checks, before a model loads, so a taken ``-o`` is
        reported at once; :meth:`prepare` repeats it under the lock.

        Raises:
            OutputError: the path exists and is not a folder; the folder, or the nearest existing folder
                above it, is not writable (``os.access``: a read-only mount refuses root as well); a name a
                run writes is present and was not
                written by worldtrace (:meth:`foreign`; with ``overwrite`` too: the file is named); without
                ``overwrite``, the folder holds a finished run or an unfinished one (the message says how
                to resume or replace it).
        """
        if self.path.exists() and not self.path.is_dir():
            raise OutputError(f"output folder {self.path} exists and is not a folder")
        check_writable(self.path)  # a read-only mount refuses root too
        refuse_foreign(self.foreign())  # with --overwrite too: worldtrace replaces only what it wrote
        if overwrite:
            return
        if self.is_complete():
            raise OutputError(f"output folder {self.path} already holds a finished run (use --overwrite)")
        if self.holds_run() or self.has_state():
            hint = (f"resume it with: worldtrace generate --resume {self.path}" if self.has_state()
                    else "use --overwrite to replace it")
            raise OutputError(f"output folder {self.path} holds an unfinished run ({hint})")

    def clear_state(self) -> None:
        """Remove the resume state (after the run completed): only folders that are states
        (:func:`is_state_folder`); anything else at those names is left as it is."""
        for name in STATE_NAMES:
            if is_state_folder(self.path / name):
                remove_state_folder(self.path / name)

    # -- records and video ---------------------------------------------------------------------
    def records(self) -> tuple[list[dict], bool]:
        """(records of ``chunks.jsonl`` in order, ``torn``: a cut-off last line was dropped).

        Raises:
            OutputError: the file is missing or unreadable; FolderInconsistent: a malformed line
                other than the last.
        """
        from ..outputs import read_jsonl_checked

        return read_jsonl_checked(self.chunks)

    def video_frames(self, include_part: bool = True) -> int:
        """Pixel frames in ``video.mp4`` (+ ``video.part.mp4``); 0 when there is no video."""
        from ..outputs import count_video_frames

        total = 0
        for path in (self.video, self.video_part) if include_part else (self.video,):
            if path.is_file() and path.stat().st_size:
                total += count_video_frames(path)
        return total

    def check(self, frames_for_chunks) -> dict:
        """Check that the folder's records and video agree; return what it holds.

        A ``video.part.mp4`` left by a killed resumed run is joined into ``video.mp4`` first
        (:meth:`settle`), unless a process is writing the folder (then both files are counted).

        Args:
            frames_for_chunks: ``n -> pixel frames`` of the first n chunks (the model's layout).
        Returns:
            ``{"status": complete|resumable|partial, "chunks": n, "video_frames": int, "torn_tail": bool,
            "notes": [...]}``.
        Raises:
            FolderInconsistent (exit 7): chunk ids not 0..n-1 each exactly once, a video with fewer
                frames than the records cover, a summary whose chunk count differs from the records.
            InputError: no ``chunks.jsonl`` (the folder given is not a run, or one that wrote no chunk).
        """
        if not self.chunks.is_file():
            raise InputError(f"{self.path}: no {CHUNKS} (not a run folder, or a run that wrote no chunk)")
        self.settle()
        records, torn = self.records()
        ids = [r.get("chunk") for r in records]
        if ids != list(range(len(ids))):
            seen, bad = set(), None
            for i, c in enumerate(ids):
                if c != i:
                    bad = (i, c, "repeated" if c in seen else "out of order")
                    break
                seen.add(c)
            raise FolderInconsistent(f"{self.chunks}: record {bad[0] + 1} is chunk {bad[1]!r} ({bad[2]}): the "
                                     f"records must be chunks 0..n-1 exactly once (two runs wrote this folder?)")
        frames = self.video_frames()
        need = frames_for_chunks(len(ids)) if ids else 0
        notes = []
        if frames < need:
            raise FolderInconsistent(f"{self.path}: the video has {frames} pixel frames but {len(ids)} chunk "
                                     f"records cover {need}")
        if frames > need:
            notes.append(f"the video holds {frames - need} pixel frames past the last record (a chunk written to the "
                         f"video when the run was killed)")
        if torn:
            notes.append(f"{CHUNKS} ended in a torn record (a killed writer); it was ignored")
        summary = self.read_summary()
        status = self.status()
        if summary is not None and summary.get("status") == "complete":
            want = (summary.get("totals") or {}).get("chunks")
            if want != len(ids):
                raise FolderInconsistent(f"{self.summary_path}: a complete run of {want} chunks, but {CHUNKS} holds "
                                         f"{len(ids)} records")
            if torn:
                raise FolderInconsistent(f"{self.chunks}: a complete run whose last record is torn")
        return {"status": status, "chunks": len(ids), "video_frames": frames, "torn_tail": torn, "notes": notes}

    def truncate(self, chunks: int, frames_for_chunks) -> list[dict]:
        """Cut the run back to its first ``chunks`` chunks (a resume restarts after them): joins a
        ``video.part.mp4`` left by an earlier resume, cuts the video to ``frames_for_chunks(chunks)``
        pixel frames and rewrites ``chunks.jsonl`` atomically. Returns the kept records.

        Raises:
            FolderInconsistent: the video or the records lack chunks before ``chunks``.
        """
        from ..outputs import concat_videos, probe_video, truncate_video, write_jsonl_atomic

        concat_videos([self.video, self.video_part], self.video)
        truncate_video(self.video, frames_for_chunks(chunks))
        records = [r for r in self.records()[0] if r.get("chunk", chunks) < chunks]
        have = probe_video(self.video)["frames"] if self.video.is_file() else 0
        if [r["chunk"] for r in records] != list(range(chunks)) or have != frames_for_chunks(chunks):
            raise FolderInconsistent(f"{self.path}: the video ({have} frames) or {CHUNKS} ({len(records)} records) "
                                     f"lost chunks before the saved chunk {chunks}; cannot resume exactly "
                                     f"(use --overwrite to start again)")
        write_jsonl_atomic(self.chunks, records)
        return records
