"""What every command shares: the log handler and the error-to-exit-code wrapper."""

from __future__ import annotations

import logging
import sys

import click

from ..errors import Aborted, Interrupted, WorldtraceError


class EchoHandler(logging.Handler):
    """Log records as ``worldtrace: message`` lines on the current stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(f"worldtrace: {record.getMessage()}", err=True)


def run_job(fn, *args, say=None, **kwargs):
    """Call ``fn``; print WorldtraceErrors as one line on stderr and exit with their code
    (:mod:`worldtrace_cli.errors`). A bare KeyboardInterrupt (one Ctrl-C before a run installed its
    own handler: while torch and the model load) exits 130, as a stop; nothing was generated, so
    nothing needs resuming. A second Ctrl-C during a run is the run's :class:`Aborted` (131).
    ``say``: instead of printing, ``say(line, code)`` (a sharded run's processes other than 0:
    :func:`~worldtrace_cli.engine.launch.note_failure`); it returns True when it printed nothing."""
    try:
        return fn(*args, **kwargs)
    except WorldtraceError as exc:
        kind = "stopped" if isinstance(exc, (Interrupted, Aborted)) else "error"
        if say is None or not say(f"{kind}: {exc}", exc.exit_code):
            click.echo(f"worldtrace: {kind}: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("worldtrace: stopped: interrupted while starting, before any chunk was generated", err=True)
        sys.exit(Interrupted.exit_code)
