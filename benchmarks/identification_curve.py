"""Identification and GT detail against training clips seen (issue 47's curve), from `where_it_fails.py` runs.

    python benchmarks/identification_curve.py CLIPS=DIR/where-it-fails.json [CLIPS=...] \
        [--baseline LABEL=DIR/where-it-fails.json] [-o curve.png]

Each CLIPS=PATH is one checkpoint of a training run judged by ``benchmarks/where_it_fails.py``
(its ``where-it-fails.json``, or the folder holding it); CLIPS is the number of clip samples the
checkpoint's training drew (optimiser steps x batch, an integer; ``k``/``M`` suffixes allowed:
``8k``, ``1.2M``). Every checkpoint must have been judged on the same trajectory, worlds, decoys
and seed against the same truth (equal codec and control rows; else the points are not
comparable: SystemExit). A ``--baseline`` (e.g. the shipped
weights on the same world) is drawn as dashed lines and listed under the table.

Prints a Markdown table: one row per checkpoint and mode (free, clean start, teacher-forced, as
judged) with GT-PSNR (dB), GT detail, and the share of chunks identified as their own world among
itself and the decoys, by colour and by structure (%); then the codec's and the still-start-view
control's rows (the same for every checkpoint: no DiT). Writes a PNG (matplotlib, Agg): panel 1
identification by colour, panel 2 by structure, panel 3 GT detail, each against clips seen (log
axis), one line per mode, the codec and the targets (90 % / 60 %) dotted, the still of the start
view dash-dotted, chance (1 in decoys+1).

Errors: SystemExit with a one-line message for a malformed argument, a missing file, a file that
is not a where_it_fails summary, or checkpoints judged on different runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from where_it_fails import MODES  # the judged modes' names: free, clean start, teacher-forced

FIXED = ("codec", "control")
SAME = ("trajectory", "worlds", "decoys", "seed")  # what every point must share
TARGETS = {"identified": 0.9, "identified_structure": 0.6}  # issue 47's targets (free rollouts)


def clips_count(text: str) -> int:
    """'8000', '8k', '1.2M' -> clip samples (int). Raises ValueError for anything else or a negative count."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    value = float(text[:-1] if scale > 1 else text)
    if not 0 <= value < float("inf"):  # also NaN
        raise ValueError(text)
    return int(round(value * scale))


def read_summary(path: Path) -> dict:
    """The JSON of one where_it_fails run (``path`` or ``path/where-it-fails.json``): a dict with
    ``summary`` (mode -> chunks, gt_psnr, gt_detail, identified, identified_structure) and the run's
    ``trajectory``, ``worlds``, ``decoys``, ``seed``. Raises SystemExit naming the file otherwise."""
    if path.is_dir():
        path = path / "where-it-fails.json"
    if not path.is_file():
        sys.exit(f"{path}: no such where_it_fails result")
    try:
        data = json.loads(path.read_text())
        summary = data["summary"]
        for mode, row in summary.items():
            for key in ("gt_psnr", "gt_detail", "identified", "identified_structure"):
                float(row[key])
        missing = [k for k in SAME if k not in data]
        if missing:
            raise KeyError(", ".join(missing))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        sys.exit(f"{path}: not a where_it_fails.py result ({type(err).__name__}: {err})")
    data["path"] = str(path)
    return data


def parse(specs: list[str], what: str, key) -> list[tuple]:
    """'LABEL=PATH' strings -> [(key(LABEL), summary dict)]; SystemExit for a malformed one."""
    out = []
    for spec in specs:
        label, sep, path = spec.partition("=")
        try:
            if not sep or not label:
                raise ValueError
            k = key(label)
        except ValueError:
            sys.exit(f"{spec!r}: expected {what}=PATH/where-it-fails.json")
        out.append((k, read_summary(Path(path))))
    return out


def row(label: str, mode: str, s: dict) -> str:
    """One Markdown table row of a where_it_fails summary row (GT-PSNR dB, GT detail, shares in %)."""
    return (f"| {label} | {mode} | {s['gt_psnr']:.2f} | {s['gt_detail']:.2f} | "
            f"{100 * s['identified']:.0f} % | {100 * s['identified_structure']:.0f} % |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("points", nargs="+", help="CLIPS=PATH (clip samples seen = steps x batch; 8k, 1.2M allowed)")
    ap.add_argument("--baseline", action="append", default=[], help="LABEL=PATH, drawn dashed")
    ap.add_argument("-o", "--output", type=Path, default=None, help="PNG of the curves")
    args = ap.parse_args(argv)
    points = sorted(parse(args.points, "CLIPS", clips_count), key=lambda p: p[0])
    baselines = parse(args.baseline, "LABEL", str)
    first = points[0][1]
    for _, data in points[1:] + baselines:
        differ = [k for k in SAME if data[k] != first[k]]
        differ += [f"{m} row (another world style?)" for m in FIXED
                   if data["summary"].get(m) != first["summary"].get(m)]
        if differ:
            sys.exit(f"{data['path']}: judged on another {', '.join(differ)} than {first['path']}")
    modes = [m for m in MODES if any(m in d["summary"] for _, d in points)]
    print("| clips seen | mode | GT-PSNR (dB) | GT detail | identified (colour) | identified (structure) |")
    print("|---|---|---|---|---|---|")
    for clips, data in points:
        for mode in modes:
            if mode in data["summary"]:
                print(row(f"{clips:,}", mode, data["summary"][mode]))
    for label, data in baselines:
        for mode in modes:
            if mode in data["summary"]:
                print(row(label, mode, data["summary"][mode]))
    for mode in FIXED:
        if mode in first["summary"]:
            print(row("(no DiT)", mode, first["summary"][mode]))
    if args.output is not None:
        draw(points, baselines, modes, args.output, chance=1 / (len(first["decoys"]) + 1))
        print(f"wrote {args.output}", file=sys.stderr)


def draw(points, baselines, modes, output: Path, chance: float) -> None:
    """Three panels against clips seen (log axis): identification by colour, by structure, GT detail."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, NullFormatter

    panels = (("identified", "identified (colour)"), ("identified_structure", "identified (structure)"),
              ("gt_detail", "GT detail"))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=100)
    colours = dict(zip(MODES, ("tab:red", "tab:orange", "tab:blue")))
    xs = [max(c, 1) for c, _ in points]
    codec, still = (points[0][1]["summary"].get(m) for m in FIXED)
    for ax, (key, title) in zip(axes, panels):
        for mode in modes:
            pts = [(x, d["summary"][mode][key]) for x, (_, d) in zip(xs, points) if mode in d["summary"]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=colours[mode], label=mode)
            for label, data in baselines:
                if mode in data["summary"]:
                    ax.axhline(data["summary"][mode][key], color=colours[mode], ls="--", lw=1,
                               label=f"{label}: {mode}")
        if codec is not None:
            ax.axhline(codec[key], color="black", ls=":", lw=1, label="codec (the truth through the VAE)")
        if still is not None:
            ax.axhline(still[key], color="black", ls="-.", lw=0.8, label="a still of the start view")
        if key in TARGETS:
            ax.axhline(TARGETS[key], color="tab:green", ls=":", lw=1.5, label="issue 47 target (free)")
            ax.axhline(chance, color="grey", ls="-", lw=0.8, label="chance")
            ax.set_ylim(0, 1.02)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 400, 8k, 1.2M
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlabel("training clips seen (steps x batch)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    fig.savefig(output)
    plt.close(fig)


if __name__ == "__main__":
    main()
