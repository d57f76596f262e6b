"""What a session copies and shares: state trees cloned for a fork, ground truth rendered once per chunk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StepResult:
    """One chunk of a session: ``frames`` uint8 [T, H, W, 3] (T = 9 for chunk 0, 12 after, MG2's
    pixel frames), ``record`` the chunk's ``chunks.jsonl`` record (dict). Unpacks as
    ``frames, record = session.step(...)``."""

    frames: np.ndarray
    record: dict

    def __iter__(self):
        return iter((self.frames, self.record))


def clone_tree(parts: dict) -> dict:
    """An independent copy of nested state dicts (every tensor cloned on its device), through the
    resume state's own packing (:func:`~worldtrace_cli.runs.state.pack`), so a fork copies exactly what a
    save would."""
    from ..runs.state import pack, unpack

    tensors: dict = {}
    tree = {name: pack(value, tensors, prefix=f"{name}.") for name, value in parts.items()}
    cloned = {k: v.clone() for k, v in tensors.items() if isinstance(k, str)}
    return {name: unpack(t, cloned) for name, t in tree.items()}


class MemoTruth:
    """A :class:`~worldtrace_cli.world.truth.GroundTruth` whose latest rendered frame range is kept, so
    the metrics and :meth:`~worldtrace_cli.session.Session.truth` render a chunk's true frames once (attributes delegate)."""

    def __init__(self, truth):
        self._truth, self._last = truth, (None, None)

    def __getattr__(self, name):
        return getattr(self._truth, name)

    def __setattr__(self, name, value):
        if name in ("_truth", "_last"):
            object.__setattr__(self, name, value)
        else:  # poses, as the session grows them
            setattr(self._truth, name, value)
            object.__setattr__(self, "_last", (None, None))

    def frames(self, start: int, end: int):
        """uint8 [end - start, H, W, 3]: the true pixel frames ``start .. end - 1`` (the last range kept)."""
        if self._last[0] != (start, end):
            self._last = ((start, end), self._truth.frames(start, end))
        return self._last[1]


__all__ = ["MemoTruth", "StepResult", "clone_tree"]
