"""Saving and restoring rollout state without pickle (resume, issue "Nothing generated is lost").

:func:`pack` turns a nested structure (dicts with string keys, lists, tuples, deques, scalars,
strings, None, paths, dtypes, devices and tensors — what every ``state_dict()`` returns) into a
JSON tree plus a flat dict of tensors; :func:`save_state` writes them as ``state.json`` +
``state.safetensors``. :func:`unpack` rebuilds the structure. No object is ever saved or created,
so a state file can never run code.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from pathlib import Path, PurePath
from typing import Any

import torch

from ..errors import InputError, OutputError
from .folder import STATE_FILES, STATE_MARK, is_state_folder, remove_state_folder  # noqa: F401  (torch-free: RunFolder removes states too)


def pack(obj: Any, tensors: dict[str, torch.Tensor], prefix: str = "t") -> Any:
    """JSON-able tree of ``obj``; tensors are moved to CPU, made contiguous and stored in ``tensors``."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        alias = ("alias", t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        key = tensors.get(alias)  # the same tensor referenced twice is stored once (and shared again)
        if key is None:
            # Views of one storage (frames of a chunk, a pinned slab's frames) are saved as they are
            # when they do not overlap (safetensors writes each view's own bytes); an overlapping
            # view is cloned, since safetensors refuses overlapping tensors. Cloning every view would
            # double a host store the size of host RAM at every save.
            start = t.storage_offset() * t.element_size()
            span = (start, start + t.numel() * t.element_size())
            spans = tensors.setdefault(("spans", t.untyped_storage().data_ptr()), [])  # type: ignore[arg-type]
            if any(lo < span[1] and span[0] < hi for lo, hi in spans):  # type: ignore[union-attr]
                t = t.clone()
            else:
                spans.append(span)  # type: ignore[union-attr]
            key = f"{prefix}{sum(isinstance(k, str) for k in tensors)}"
            tensors[key] = t
            tensors[alias] = key  # type: ignore[assignment]  (removed before saving)
        return {"__tensor__": key, "device": str(obj.device)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, PurePath):
        return {"__path__": str(obj)}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).replace("torch.", "")}
    if isinstance(obj, torch.device):
        return {"__device__": str(obj)}
    if isinstance(obj, deque):
        return {"__deque__": [pack(x, tensors, prefix) for x in obj], "maxlen": obj.maxlen}
    if isinstance(obj, tuple):
        return {"__tuple__": [pack(x, tensors, prefix) for x in obj]}
    if isinstance(obj, list):
        return [pack(x, tensors, prefix) for x in obj]
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            return {"__items__": [[pack(k, tensors, prefix), pack(v, tensors, prefix)] for k, v in obj.items()]}
        return {"__dict__": {k: pack(v, tensors, prefix) for k, v in obj.items()}}
    cls = type(obj)
    raise TypeError(f"cannot save objects of type {cls.__module__}.{cls.__qualname__} in a resume state")


def unpack(tree: Any, tensors: dict[str, torch.Tensor], device: torch.device | str | None = None) -> Any:
    """Inverse of :func:`pack`. Tensors go back to the device they came from (host stores stay on
    the host; ``cuda:N`` maps to the current CUDA device, or to CPU without one); ``device`` forces
    one device for everything."""
    if isinstance(tree, list):
        return [unpack(x, tensors, device) for x in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        t = tensors[tree["__tensor__"]]
        target = device if device is not None else tree.get("device", "cpu")
        if str(target).startswith("cuda"):
            target = "cuda" if torch.cuda.is_available() else "cpu"
        return t.to(target)
    if "__path__" in tree:
        return Path(tree["__path__"])
    if "__dtype__" in tree:
        return getattr(torch, tree["__dtype__"])
    if "__device__" in tree:
        return torch.device(tree["__device__"])
    if "__deque__" in tree:
        return deque((unpack(x, tensors, device) for x in tree["__deque__"]), maxlen=tree["maxlen"])
    if "__tuple__" in tree:
        return tuple(unpack(x, tensors, device) for x in tree["__tuple__"])
    if "__items__" in tree:
        return {unpack(k, tensors, device): unpack(v, tensors, device) for k, v in tree["__items__"]}
    if "__dict__" in tree:
        return {k: unpack(v, tensors, device) for k, v in tree["__dict__"].items()}
    raise InputError(f"resume state: unknown entry {sorted(tree)[:3]}")


def check_state_target(folder: str | Path) -> None:
    """Refuse a save that would replace or remove what :func:`save_state` did not write: ``folder``
    and its siblings ``folder.tmp`` / ``folder.old`` (the save's scratch names) must each be absent
    or a state folder (:func:`is_state_folder`). Reads only; nothing is changed.

    Raises:
        OutputError: one of them is a file, a link, or a folder with other files (named, one line).
    """
    folder = Path(folder)
    for path in (folder, folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")):
        if not (path.exists() or path.is_symlink()) or is_state_folder(path):
            continue
        what = ("a link" if path.is_symlink() else "a folder with other files" if path.is_dir()
                else "not a folder")
        role = "" if path == folder else f" (saving {folder.name} uses {path.name} as scratch)"
        raise OutputError(f"{path}: exists and is {what}, not a saved state{role}; worldtrace replaces only its "
                          f"own state folders (move it away or save elsewhere)")


def save_state(folder: str | Path, meta: dict, parts: dict[str, Any]) -> None:
    """Atomically write ``folder/state.json`` (``meta`` + packed ``parts``) and ``state.safetensors``.

    The new state is written to ``folder.tmp`` and renamed over ``folder``, so a kill during the save
    leaves the previous state intact. ``state.json`` records the sha256 of ``state.safetensors``
    (``tensors_sha256``; :func:`load_state` checks it). Both files get the mode the process's umask
    gives new files. Only state folders are ever replaced or removed (:func:`check_state_target`,
    checked before anything is written): a user's folder, file or link at ``folder``,
    ``folder.tmp`` or ``folder.old`` is refused, never deleted.

    Raises:
        OutputError: ``folder`` or a sibling is not a state folder; the state cannot be written
            (disk full, permissions): the previous one stays.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    check_state_target(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    tensors: dict[str, torch.Tensor] = {}
    tree = {name: pack(value, tensors, prefix=f"{name}.") for name, value in parts.items()}
    try:
        remove_state_folder(tmp)
        tmp.mkdir(parents=True)
        (tmp / STATE_MARK).write_bytes(b"")  # first: a kill from here on leaves a folder known as worldtrace's
        save_file({k: v for k, v in tensors.items() if isinstance(k, str)}, str(tmp / "state.safetensors"))
        doc = {"meta": meta, "parts": tree, "tensors_sha256": _sha256(tmp / "state.safetensors")}
        (tmp / "state.json").write_text(json.dumps(doc))  # mode from the umask
        # safetensors writes 0600 whatever the umask: give the tensors the mode the JSON got
        os.chmod(tmp / "state.safetensors", (tmp / "state.json").stat().st_mode & 0o777)
        os.chmod(tmp / STATE_MARK, (tmp / "state.json").stat().st_mode & 0o777)
        _commit_state(tmp, folder)
    except Exception as exc:  # disk full, permissions: the previous state stays current
        remove_state_folder(tmp)
        raise OutputError(f"{folder}: cannot save the resume state ({type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:200]})") from None


def _sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (about 1 GB/s on one core)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _commit_state(tmp: Path, folder: Path) -> None:
    for f in tmp.iterdir():  # on disk before the rename makes the state current
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    old = folder.with_name(folder.name + ".old")
    if folder.exists():  # the current state: an ``.old`` beside it is stale
        remove_state_folder(old)
        folder.rename(old)
    # (no current state: a kill between the two renames left the previous one in ``.old``, kept until now)
    tmp.rename(folder)
    remove_state_folder(old)


def load_meta(folder: str | Path) -> dict:
    """The ``meta`` of a saved state without reading its tensors. Raises InputError."""
    folder = _state_folder(Path(folder))
    try:
        return json.loads((folder / "state.json").read_text())["meta"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{folder}: resume state is unreadable ({type(exc).__name__})") from None


def _state_folder(folder: Path) -> Path:
    if (folder / "state.json").is_file():
        return folder
    old = folder.with_name(folder.name + ".old")  # killed between the two renames of save_state
    if (old / "state.json").is_file():
        return old
    raise InputError(f"{folder}: no saved state to resume from")


def load_state(folder: str | Path, remedy: str = "") -> tuple[dict, dict[str, Any], dict[str, torch.Tensor]]:
    """(meta, packed parts, tensors) of a saved state; unpack parts with :func:`unpack`. ``state.json``
    records the sha256 of ``state.safetensors`` (:func:`save_state`); a file whose bytes changed
    since (a flipped bit on disk, a partial copy) is refused, not loaded.

    Args:
        remedy: what the user can do, appended to the messages (``start again with --overwrite``).
    Raises:
        InputError: no state in the folder, a corrupt one, or tensors that fail their checksum.
    """
    from safetensors.torch import load_file

    folder = _state_folder(Path(folder))
    try:
        doc = json.loads((folder / "state.json").read_text())
        recorded = doc.get("tensors_sha256")  # states saved before the checksum was recorded have none
        if recorded is not None and recorded != _sha256(folder / "state.safetensors"):
            raise InputError(f"{folder}: resume state is damaged: state.safetensors differs from the sha256 "
                             f"recorded when it was saved{'; ' + remedy if remedy else ''}")
        tensors = load_file(str(folder / "state.safetensors"))
    except InputError:
        raise
    except Exception as exc:  # corrupt files raise many types
        raise InputError(f"{folder}: resume state is unreadable ({type(exc).__name__})"
                         f"{'; ' + remedy if remedy else ''}") from None
    return doc["meta"], doc["parts"], tensors
