"""Compare training runs by their loss logs: a table at equal steps and a plot.

    python benchmarks/loss_curves.py LABEL=DIR/loss.jsonl [LABEL=...] [--every 100] [--window 4] -o curves.png

Reads the ``loss.jsonl`` that ``worldtrace train dit`` (and ``train vae``) write: one JSON object
per logged step with ``step`` and ``loss`` (the mean flow-matching loss over the ``log_every`` steps
before it) and ``seconds`` (wall-clock of the run so far). Prints a Markdown table of each run's
loss at every ``--every``-th step (the mean of the ``--window`` logged values ending there, so one
noisy batch does not decide a row) and its wall-clock minutes at its last step; writes a PNG of the
same smoothed curves against the optimiser step (matplotlib, Agg backend).

Errors: SystemExit with a one-line message for a missing or empty log, or a malformed argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_log(path: Path, fields: tuple[str, ...] = ("step",)) -> list[dict]:
    """The records of one ``loss.jsonl`` (dicts with ``step``, ``loss``, ``seconds`` of wall-clock),
    ordered by step. Raises SystemExit when the file is missing or empty, or when a line is not a
    JSON object holding every one of ``fields`` (the message names ``path:line``)."""
    if not path.is_file():
        sys.exit(f"{path}: no such loss log")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            missing = [f for f in fields if f not in row]
        except (ValueError, TypeError) as err:
            sys.exit(f"{path}:{n}: not a loss-log line ({err})")
        if missing:
            sys.exit(f"{path}:{n}: not a loss-log line (no {', '.join(missing)})")
        rows.append(row)
    if not rows:
        sys.exit(f"{path}: empty loss log")
    return sorted(rows, key=lambda r: r["step"])


def smoothed(rows: list[dict], window: int) -> dict[int, float]:
    """optimiser step -> mean loss of the ``window`` logged values ending at that step (fewer at the
    start of the log)."""
    out = {}
    for i, r in enumerate(rows):
        part = rows[max(0, i - window + 1): i + 1]
        out[r["step"]] = sum(p["loss"] for p in part) / len(part)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="LABEL=PATH/loss.jsonl")
    ap.add_argument("--every", type=int, default=100, help="table rows every this many steps")
    ap.add_argument("--window", type=int, default=4, help="logged values averaged per point")
    ap.add_argument("-o", "--output", type=Path, default=None, help="PNG of the curves")
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        label, sep, path = spec.partition("=")
        if not sep or not label:
            sys.exit(f"{spec!r}: expected LABEL=PATH/loss.jsonl")
        runs[label] = read_log(Path(path))
    curves = {label: smoothed(rows, args.window) for label, rows in runs.items()}
    steps = sorted({s for c in curves.values() for s in c if s % args.every == 0})
    print("| step | " + " | ".join(curves) + " |")
    print("| --- | " + " | ".join("---" for _ in curves) + " |")
    for s in steps:
        cells = [f"{c[s]:.3f}" if s in c else "" for c in curves.values()]
        print(f"| {s} | " + " | ".join(cells) + " |")
    print("| minutes | " + " | ".join(f"{rows[-1].get('seconds', float('nan')) / 60:.1f}" for rows in runs.values()) + " |")
    if args.output is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        for label, c in curves.items():
            xs = sorted(c)
            ax.plot(xs, [c[x] for x in xs], label=label)
        ax.set_xlabel("optimiser step")
        ax.set_ylabel(f"flow-matching loss (mean of {args.window} logs)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.output)
        print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
