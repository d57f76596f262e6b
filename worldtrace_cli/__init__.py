"""worldtrace: long-horizon video generation with addressable KV-cache memory for autoregressive video
models (Matrix-Game-2.0, LingBot-World, Self-Forcing / LongLive; other backbones by registry row).

Docstrings cite their sources by name and section: "paper §N" is the WorldTrace paper ("Addressable
Memory for Video World Models"); "MG2 spec", "LingBot spec", "Self-Forcing spec" and "WorldKV spec"
(or the file names) are docs/reference/mg2-architecture.md, lingbot-architecture.md,
selfforcing-architecture.md and worldkv.md, written from the official code; a bare "spec §N" is the
one its module (or package) docstring names. tests/test_citations.py checks that every cited section exists."""

__version__ = "0.1.0"


def open(*args, **kwargs):
    """Open a live session: :func:`worldtrace_cli.session.open` (imported on first use, so that
    ``import worldtrace_cli`` stays light)."""
    from .session import open as _open

    return _open(*args, **kwargs)


def load(path, pipeline=None):
    """A saved session: :meth:`worldtrace_cli.session.Session.load`."""
    from .session import Session

    return Session.load(path, pipeline)


__all__ = ["Session", "StepResult", "__version__", "load", "open"]


def __getattr__(name):
    """``worldtrace_cli.Session`` / ``StepResult`` without importing torch at package import."""
    if name in ("Session", "StepResult"):
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module 'worldtrace_cli' has no attribute {name!r}")
