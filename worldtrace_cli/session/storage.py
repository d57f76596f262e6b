"""Where a session writes: the ``record=`` path and the folders :meth:`~.live.Session.save` may
replace (only its own: issue 44, a save never deletes a user's folder)."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, OutputError, WorldtraceError


def check_record(record) -> None:
    """Refuse a ``record=`` value that is not a run folder's path: ``""`` (the current folder, among
    the user's files; the CLI refuses ``-o ""`` likewise).

    Raises:
        InputError: an empty path.
    """
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
    """Where :meth:`~.live.Session.save` may write: ``path`` new or an empty folder, or a saved
    session's folder with ``overwrite``; siblings ``path.tmp`` / ``path.old`` absent or state
    folders (:func:`~worldtrace_cli.runs.state.check_state_target`). Reads only. Returns the Path.

    Raises:
        InputError: an empty path. OutputError: a file, a link, a folder with other files, another
            kind of state, or a saved session without ``overwrite`` (one line naming the path).
    """
    from ..runs.state import check_state_target

    if str(path) == "":
        raise InputError("save: an empty path; name a folder (e.g. s.save('saved/here'))")
    path = Path(path)
    if path.name in ("", ".", ".."):  # "." or "..": the folder it names (with_name needs a name)
        path = path.resolve()
    if path.name == "":
        raise OutputError(f"save: {path} is the filesystem's root; name a folder (e.g. s.save('saved/here'))")
    try:
        check_state_target(path)
    except WorldtraceError as exc:
        raise type(exc)(f"save: {exc}") from None
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


__all__ = ["check_record", "check_save_target", "is_session_state"]
