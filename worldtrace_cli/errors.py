"""Error types and the exit codes the CLI maps them to.

Every error a user can cause derives from :class:`WorldtraceError`; the CLI prints its message
as one line on stderr and exits with its ``exit_code``. Anything else is a bug (exit 1).

Exit codes (documented in the README, section "When things go wrong"):

==== ===================================================================
0    success
1    internal error (a bug: please report it with the traceback)
2    bad input: command-line usage, trajectory file, image, preset, flags
3    checkpoint: missing file, wrong/missing/extra keys, shapes, dtypes
4    output: folder not writable, already holds a finished run, disk full
5    run failure: non-finite latents, memory cap reached
130  interrupted (Ctrl-C); the run folder is valid up to the last chunk
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
