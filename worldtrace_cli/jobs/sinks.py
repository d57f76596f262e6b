"""The stop flag that turns Ctrl-C / SIGTERM into a clean stop after the current chunk; the run
folder's sinks are :class:`~worldtrace_cli.runs.sinks.RunSinks` (re-exported here for the jobs)."""

from __future__ import annotations

import logging
import signal

log = logging.getLogger("worldtrace")


class StopFlag:
    """SIGINT/SIGTERM set :attr:`signal`, checked between chunks; a second SIGINT aborts at once
    (KeyboardInterrupt). Use as a context manager (handlers restored on exit).

    Flags nest: a signal that arrives while an inner flag is held (a LoopBench job's run inside the
    sweep's flag) is passed on to the enclosing flag when the inner one exits, so a stop asked for
    during a job's last chunk, after the job stopped looking, still stops the sweep; and an inner
    flag entered after the enclosing one heard a signal (one arriving while a run set up, before
    its own flag) starts with that signal, so the run stops after its first chunk and a second
    Ctrl-C aborts at once, as the first one's message says.

    Args:
        message: logged when the first signal arrives (what happens next).
    """

    def __init__(self, message: str = "stopping after the current chunk (Ctrl-C again to abort now)"):
        self.signal: int | None = None
        self.message = message
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no graceful stop, nothing else changes
                pass
        for handler in self._previous.values():  # a signal the enclosing flag heard counts here too
            outer = _flag_of(handler)
            if outer is not None and outer.signal is not None:
                self.signal = self.signal or outer.signal
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum
        log.info(self.message)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        outer = _flag_of(self._previous.get(self.signal))
        if self.signal is not None and outer is not None:
            outer.signal = outer.signal or self.signal  # the enclosing flag heard it too


def _flag_of(handler) -> StopFlag | None:
    """The StopFlag whose handler ``handler`` is (an enclosing flag), else None."""
    owner = getattr(handler, "__self__", None)
    return owner if isinstance(owner, StopFlag) else None


from ..runs.sinks import RunSinks  # noqa: E402  (the jobs import both from here)

__all__ = ["RunSinks", "StopFlag"]
