"""Where a session writes: the ``record=`` path and the folders :meth:`~.live.Session.save` may
replace (only its own: docs/session.md, a save never deletes a user's folder)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, OutputError


def check_path(value, what: str, example: str) -> None:
    """Refuse a folder argument that is not a path (``str`` or ``os.PathLike``: an int, None, a list...)
    in one line naming the argument, before anything is touched.

    Raises:
        InputError: ``what must be a folder path ... got <type>`` (with ``example``).
    """
    import os

    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise InputError(f"{what} must be a folder path (a str or pathlib.Path, e.g. {example}), "
                         f"got {type(value).__name__} {str(value)[:40]!r}")


def check_record(record) -> None:
    """Refuse a ``record=`` value that is not a run folder's path: not a path at all, or ``""`` (the
    current folder, among the user's files; the CLI refuses ``-o ""`` likewise).

    Raises:
        InputError: not a path, or an empty one.
    """
    check_path(record, "open: record", "record='runs/live'")
    if str(record).strip() == "":
        raise InputError("open: record='' is the current folder; name a run folder (e.g. record='runs/live')")


def is_session_state(folder: Path, version: int) -> bool:
    """True when ``folder/state.json`` is a saved session's (:meth:`~.live.Session.save`): its meta
    has the session state ``version`` and ``segments``; False for another kind of state (a
    ``generate`` resume state) or an unreadable file."""
    from ..runs.state import load_meta

    try:
        meta = load_meta(folder)
    except InputError:
        return False
    return isinstance(meta, dict) and meta.get("version") == version and "segments" in meta


def check_save_target(path, overwrite: bool, version: int) -> Path:
    """The session's own checks before :meth:`~.live.Session.save` writes ``path``: a name to write
    (not empty, not the root), and a saved session there (or in ``path.old``, left by a save killed
    between its renames) replaced only with ``overwrite``. That nothing but a state folder is
    replaced at all (a user's folder, file or link at ``path``, ``path.tmp``, ``path.old``) is
    :func:`~worldtrace_cli.runs.state.save_state`'s own guard. Reads only. Returns the Path.

    Raises:
        InputError: not a path (an int, None), an empty path. OutputError: the root, another kind of
            state, or a saved session without ``overwrite`` (one line naming the path).
    """
    check_path(path, "save: path", "s.save('saved/here')")
    if str(path) == "":
        raise InputError("save: an empty path; name a folder (e.g. s.save('saved/here'))")
    path = Path(path)
    if path.name in ("", ".", ".."):  # "." or "..": the folder it names (with_name needs a name)
        path = path.resolve()
    if path.name == "":
        raise OutputError(f"save: {path} is the filesystem's root; name a folder (e.g. s.save('saved/here'))")
    old = path.with_name(path.name + ".old")  # a save killed between its two renames left the state there
    for held in (path, old):
        if not (held / "state.json").exists():
            continue
        if not is_session_state(held, version):
            raise OutputError(f"save: {held} holds a state that is not a saved session (a generate resume "
                              f"state?); save elsewhere")
        if not overwrite:
            raise OutputError(f"save: {path} already holds a saved session (save(..., overwrite=True) "
                              f"replaces it)")
    return path


def save_session_state(path, meta: dict, parts: dict, overwrite: bool) -> Path:
    """Write a session's state (``meta`` with the session's ``version``, ``parts`` its state dicts)
    into ``path`` (:func:`check_save_target`, then :func:`~worldtrace_cli.runs.state.save_state`,
    whose own guard replaces nothing but a state folder). Returns the folder.

    Raises:
        InputError / OutputError: as :func:`check_save_target` and ``save_state``, prefixed ``save:``.
    """
    from ..runs.state import save_state

    path = check_save_target(path, overwrite, meta["version"])
    try:
        save_state(path, meta, parts)
    except OutputError as exc:
        raise OutputError(f"save: {exc}") from None
    return path


def session_prefix(cfg):
    """The :class:`~worldtrace_cli.continuation.Prefix` of a session's ``cfg.prefix`` (None without one).

    Raises:
        InputError: ``truth:K`` (a world's truth needs every chunk's actions in advance: generate, compare
            and loopbench run take it), or a clip that does not fit (:func:`~worldtrace_cli.continuation.plan_prefix`)."""
    from ..continuation import load_prefix, plan_prefix

    if cfg.prefix is None:
        if cfg.prefix_chunks is not None:
            raise InputError("open: prefix_chunks needs prefix= (the real video the session continues)")
        return None
    if str(cfg.prefix).startswith("truth:"):
        raise InputError(f"open: prefix={cfg.prefix!r}: a world's true render needs every chunk's actions in advance; "
                         f"a session takes a video (generate, compare and loopbench run take truth:K)")
    try:
        return load_prefix(cfg, plan_prefix(cfg, 1 << 30))
    except InputError as exc:
        import re

        said = re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), str(exc))  # the API's words
        raise InputError(f"open: {said}") from None


__all__ = ["session_prefix", "check_path", "check_record", "check_save_target", "is_session_state", "save_session_state"]
