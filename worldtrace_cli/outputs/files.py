"""Files a run writes that must survive a kill or a full disk: artefacts written under a temporary
name and renamed (:func:`atomic_path`), JSONL records fsync'ed one by one (:class:`JsonlWriter`) and
JSON summaries replaced atomically (:func:`write_json_atomic`). Re-exported by :mod:`worldtrace_cli.outputs`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path, PurePath


from ..errors import OutputError


def cache_folder(cache: str) -> str:
    """Folder name of a cache spec (run folders of generate, compare, loopbench): ``mixed:2`` ->
    ``mixed-2`` (``:`` is awkward in paths)."""
    return cache.replace(":", "-")


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
    if hasattr(obj, "tolist"):  # numpy scalar or array, torch tensor (no numpy import: the CLI starts faster)
        return to_jsonable((obj.detach().cpu() if hasattr(obj, "detach") else obj).tolist())
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
    from ..errors import FolderInconsistent

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


__all__ = ["JsonlWriter", "atomic_path", "cache_folder", "read_jsonl", "read_jsonl_checked", "tail_words", "to_jsonable",
           "write_json_atomic", "write_jsonl_atomic"]
