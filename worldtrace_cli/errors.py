"""Error types and the exit codes the CLI maps them to.

Every error a user can cause derives from :class:`WorldtraceError`; the CLI prints its message
as one line on stderr and exits with its ``exit_code``. Anything else is a bug (exit 1).

Exit codes (documented in the README, section "When things go wrong"):

==== ===================================================================
0    success
1    internal error (a bug: please report it with the traceback)
2    bad input: command-line usage, trajectory file, image, preset (also one too large for the
     machine's memory), flags, a damaged resume state
3    checkpoint: missing file, wrong/missing/extra keys, shapes, dtypes
4    output: folder not writable (or its lock file), a file where a folder belongs, already holds a
     finished run, a video that lost frames while the run wrote it, disk full
5    run failure: non-finite latents, memory cap reached
6    run folder busy: another worldtrace process holds its lock (the holder is named)
7    run folder inconsistent: its records contradict each other or the video
130  stopped (Ctrl-C / SIGTERM): with a resume state saved, ``--resume`` continues it; during
     start-up nothing was generated
131  stopped without a resume state (a second Ctrl-C during a run, a stop before the first chunk)
==== ===================================================================
"""

from __future__ import annotations


class WorldtraceError(Exception):
    """Base class of user-facing errors; ``str(err)`` is the one-line message."""

    exit_code = 1


class InputError(WorldtraceError):
    """Bad user input: a trajectory, image, preset or flag value (exit code 2)."""

    exit_code = 2


class TrajectoryError(InputError):
    """A trajectory file is malformed; the message names ``file:line: field: problem``."""


class CheckpointError(WorldtraceError):
    """A checkpoint folder or state dict does not match what the model expects (exit code 3)."""

    exit_code = 3


class OutputError(WorldtraceError):
    """The output folder cannot be written or already holds a finished run (exit code 4)."""

    exit_code = 4


class Interrupted(WorldtraceError):
    """The run stopped on Ctrl-C / SIGTERM after saving a resume state (exit code 130)."""

    exit_code = 130


class RunError(WorldtraceError):
    """A generation run failed midway: non-finite latents, memory cap (exit code 5)."""

    exit_code = 5


class FolderBusy(OutputError):
    """Another process holds the run folder's lock (exit code 6); the message names the holder."""

    exit_code = 6


class FolderInconsistent(OutputError):
    """A run folder's records contradict each other or its video (exit code 7)."""

    exit_code = 7


class Aborted(WorldtraceError):
    """The run stopped without saving a resume state (exit code 131): rerun with ``--overwrite``."""

    exit_code = 131
