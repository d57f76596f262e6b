"""What worldtrace wrote in a run folder, so nothing of a user's is removed: the state folders' mark,
the folder's claim (``.worldtrace-run.json``, written when a folder becomes a run's) and, for folders of
versions before the claim, the run files that read as worldtrace's (docs/reliability.md). Torch-free."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

STATE_MARK = ".worldtrace-state"  # written first into every state folder: its files are worldtrace's
STATE_FILES = frozenset({"state.json", "state.safetensors", STATE_MARK})  # all a state folder ever holds


def is_state_folder(path: str | Path) -> bool:
    """True when ``path`` is a folder worldtrace may replace or remove without losing anyone's
    files: a real folder (not a link) that is empty, or holds nothing but a state's own files and
    is marked as worldtrace's (:data:`STATE_MARK`, written first, so a save killed midway is
    recognised too) or holds a ``state.json`` that reads as one (states saved before the mark). A
    user's folder holding only a ``state.safetensors`` of their own is not one. Reads only; raises
    nothing (an unreadable folder is not one)."""
    path = Path(path)
    try:
        if not path.is_dir() or path.is_symlink():
            return False
        names = set(os.listdir(path))
        if not names or (names <= STATE_FILES and STATE_MARK in names):
            return True
        if not names <= STATE_FILES or "state.json" not in names:
            return False
        doc = json.loads((path / "state.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and {"meta", "parts"} <= set(doc)


def legacy_summary(path: Path) -> bool:
    """A ``summary.json`` as worldtrace writes it (a JSON object with its ``status`` and ``totals``)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and "status" in doc and isinstance(doc.get("totals"), dict)


def legacy_records(path: Path) -> bool:
    """A ``chunks.jsonl`` as worldtrace writes it: empty, or its first line a record with a ``chunk``."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(1 << 20)
        if not first.strip():
            return path.stat().st_size == len(first)
        doc = json.loads(first)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and "chunk" in doc


def remove_state_folder(path: str | Path) -> None:
    """Remove a state folder so that a kill at any moment leaves one :func:`is_state_folder` still
    recognises: its files first, the mark (:data:`STATE_MARK`) last, then the folder. (``shutil.rmtree``
    takes them in directory order: killed after the mark went, it left tensors a later save refused to
    touch as someone else's.) Missing paths are fine; OS errors are ignored as ``rmtree``'s would be."""
    path = Path(path)
    try:
        names = sorted(os.listdir(path), key=lambda n: n == STATE_MARK)  # the mark last
    except OSError:
        return
    for name in names:
        target = path / name
        try:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink()
        except OSError:
            pass
    try:
        path.rmdir()
    except OSError:
        pass




def write_claim(path: Path, names: tuple[str, ...]) -> None:
    """Write a folder's claim ``path`` (atomically): the ``names`` a run writes there are worldtrace's from now
    on (they are all absent when it is written). Raises OSError when it cannot be written."""
    from ..outputs import write_json_atomic

    write_json_atomic(path, {"worldtrace_run": 1, "files": list(names)})


def read_claim(path: Path) -> set[str]:
    """The names a folder's claim ``path`` lists (empty without a readable claim)."""
    try:
        doc = json.loads(path.read_text())
        return set(doc["files"]) if isinstance(doc, dict) and doc.get("worldtrace_run") == 1 else set()
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def foreign_names(folder: Path, names: tuple[str, ...], state_names: tuple[str, ...], claimed: set[str],
                  summary: Path, chunks: Path) -> list[tuple[Path, str]]:
    """The ``names`` present in ``folder`` that worldtrace cannot prove it wrote, each with why: a state name
    (``state_names``) must be a state folder (:func:`is_state_folder`, its mark inside); a file must be
    ``claimed`` (the folder's claim) or, in a folder of a version before the claim, belong to a run whose
    ``summary`` or ``chunks`` reads as worldtrace's (:func:`legacy_summary`, :func:`legacy_records`).
    Reads only; raises nothing."""
    present = [name for name in names if (folder / name).exists() or (folder / name).is_symlink()]
    legacy, out = None, []
    for name in present:
        target = folder / name
        if name in state_names:
            if not is_state_folder(target):
                try:
                    held = sorted(os.listdir(target))[:3] if target.is_dir() and not target.is_symlink() else []
                except OSError:
                    held = []
                what = ("a link" if target.is_symlink() else f"a folder holding {', '.join(held)}" if held else
                        "not a folder" if not target.is_dir() else "a folder of other files")
                out.append((target, what + ", not a state worldtrace saved"))
            continue
        if target.is_symlink() or not target.is_file():
            out.append((target, "a link" if target.is_symlink() else "a folder"))
            continue
        if name in claimed:
            continue
        if legacy is None:  # a run folder written before the claim existed
            legacy = ((summary.is_file() and legacy_summary(summary)) or (chunks.is_file() and legacy_records(chunks)))
        if legacy and (target not in (summary, chunks) or
                       (legacy_summary(target) if target == summary else legacy_records(target))):
            continue
        out.append((target, "a file worldtrace did not write"))
    return out


def check_writable(path: Path) -> None:
    """Refuse an output folder that cannot be written: ``path``, or the nearest existing folder above it
    (where it would be made), fails ``os.access`` for writing (a read-only mount refuses root as well).
    Raises OutputError (exit 4)."""
    from ..errors import OutputError

    near = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    if near is not None and not os.access(near, os.W_OK | os.X_OK):
        where = "output folder" if near == path else f"{near}, where output folder {path} would be made,"
        raise OutputError(f"{where} is not writable (a read-only filesystem, or no permission)")


def refuse_foreign(foreign: list[tuple[Path, str]]) -> None:
    """Refuse a run into a folder holding :func:`foreign_names` (their first named). Raises OutputError (exit 4)."""
    from ..errors import OutputError

    if foreign:
        path, what = foreign[0]
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise OutputError(f"{path}: {what}{more}; a run writes this name and worldtrace replaces only what it "
                          f"wrote: move it away or choose another output folder")


def remove_own_result(path: Path, key: str, what: str) -> None:
    """Remove a result file a command wrote (a JSON object with ``key``: ``compare.json``'s ``modes``); a
    user's file under that name is refused, never deleted.

    Raises:
        OutputError (exit 4): the file is not one worldtrace wrote (named, with ``what`` wrote the name)."""
    from ..errors import OutputError

    if not (path.exists() or path.is_symlink()):
        return
    try:
        doc = json.loads(path.read_text())
        ours = path.is_file() and not path.is_symlink() and isinstance(doc, dict) and key in doc
    except (OSError, ValueError, UnicodeDecodeError):
        ours = False
    if not ours:
        raise OutputError(f"{path}: a file worldtrace did not write; {what} writes this name and replaces only "
                          f"what it wrote: move it away or choose another output folder")
    path.unlink()


__all__ = ["STATE_FILES", "STATE_MARK", "check_writable", "foreign_names", "refuse_foreign", "is_state_folder", "legacy_records", "legacy_summary",
           "read_claim", "remove_own_result", "remove_state_folder", "write_claim"]
