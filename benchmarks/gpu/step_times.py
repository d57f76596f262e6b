"""Seconds per training step from loss logs written with ``--log-every 1``.

    python3 benchmarks/gpu/step_times.py RUN.jsonl [RUN.jsonl ...]

Each file is a ``loss.jsonl`` of ``worldtrace train dit|vae`` (one JSON line per logged step with
``step`` and ``seconds``: wall-clock seconds since that invocation started, after the model, data
and any resumed state were loaded). Prints a markdown table, one row per file (named by the file's
stem, e.g. ``precision-bf16``): steps logged, the first step's seconds (allocation, kernel
selection, first shard loads), and the seconds per step after it (mean and median over
consecutive lines, so only a log of every step gives per-step times; a coarser log gives the mean
over its windows; a continued run's restarted clock is skipped). ``on-device.sh train precisions`` calls it.

Uses the standard library and ``benchmarks/loss_curves.py``'s reader only (it runs on the GPU machine
before anything is installed).

Errors: SystemExit with a one-line message for a missing or empty file, or a line that is not a
loss-log line (names the file and line).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: its loss-log reader
import loss_curves  # noqa: E402


def read_log(path: Path) -> list[tuple[int, float]]:
    """``[(step, seconds), ...]`` of a loss log in step order (read by ``benchmarks/loss_curves.py``'s
    :func:`read_log`).

    Raises:
        SystemExit: the file is missing or holds no lines, or a line lacks ``step``/``seconds``
            (the message names ``path:line``).
    """
    return [(int(r["step"]), float(r["seconds"])) for r in loss_curves.read_log(Path(path), ("step", "seconds"))]


def summarise(rows: list[tuple[int, float]]) -> dict:
    """``{"steps", "first_s", "mean_s", "median_s"}`` of one log's ``(step, seconds)`` rows: the last
    step logged; the first line's seconds per step it covers (the first step's time in a log of every
    step); and the seconds per step over later lines: total seconds / total steps between consecutive
    lines (mean) and the median of each pair's seconds per step. A continued run's lines restart
    their clock (seconds fall): the pair across the restart is left out, as is the first step of
    each later invocation. None where no pair is left."""
    pairs = [((tb - ta), (b - a)) for (a, ta), (b, tb) in zip(rows, rows[1:]) if b > a and tb >= ta]
    return {"steps": rows[-1][0], "first_s": rows[0][1] / max(rows[0][0], 1),
            "mean_s": sum(t for t, _ in pairs) / sum(n for _, n in pairs) if pairs else None,
            "median_s": statistics.median(t / n for t, n in pairs) if pairs else None}


def table(paths: list[Path]) -> str:
    """The markdown table of :func:`summarise` for each file (see the module docstring)."""
    def fmt(x):
        return "-" if x is None else f"{x:.2f}"

    lines = ["| run | steps | first step s | s/step after it (mean) | (median) |", "| --- | ---: | ---: | ---: | ---: |"]
    for p in paths:
        r = summarise(read_log(p))
        lines.append(f"| {p.stem} | {r['steps']} | {fmt(r['first_s'])} | {fmt(r['mean_s'])} | {fmt(r['median_s'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print :func:`table` of the loss logs named in ``argv`` (default ``sys.argv[1:]``).
    Raises SystemExit: no file named, or one :func:`read_log` refuses."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: step_times.py RUN.jsonl [RUN.jsonl ...]")
    print(table([Path(a) for a in args]))


if __name__ == "__main__":
    main()
