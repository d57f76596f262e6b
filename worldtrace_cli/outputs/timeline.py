"""``cache_timeline.png``: what a writer kept, slot by chunk (design.md §4).

Rows are the cache slots in read order (summary slots on top, recent slots at the bottom), columns
are chunks; each cell is coloured by the mean source latent frame of the slot at that chunk (blank
where the slot did not exist yet) and, on small grids, numbered with how many frames an averaged
slot covers. Dashed lines mark the chunks where the trajectory reaches a waypoint (its label). Chunks in which a landmark was stored are marked with a red
triangle above the grid. Reads only ``chunks.jsonl`` records, so it can be redrawn for any run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import atomic_path


LABELLED_SLOTS = 32  # slots drawn one labelled row each; more share a figure of this height


def plot_cache_timeline(records: list[dict], path: str | Path, title: str = "") -> Path:
    """Draw the slots x chunks picture of ``records`` (chunks.jsonl dicts) into a PNG at ``path``.

    The PNG is written under a temporary name and renamed (:func:`~worldtrace_cli.outputs.atomic_path`),
    so a full disk never leaves a zero-byte or torn ``cache_timeline.png``.

    Raises:
        ValueError: no records. OutputError: the file cannot be written (disk full, permissions).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from .records import expand_slot_records

    if not records:
        raise ValueError("no chunk records to plot")
    per_chunk = [expand_slot_records(r["cache"]["slots"]) for r in records]
    n_slots = max(len(s) for s in per_chunk)
    grid = np.full((max(1, n_slots), len(records)), np.nan)
    covers = np.zeros_like(grid, dtype=np.int64)  # source frames per slot (an averaged slot covers several)
    kinds = [""] * n_slots
    for col, slots in enumerate(per_chunk):
        offset = n_slots - len(slots)  # align the newest slot with the bottom row
        for i, slot in enumerate(slots):
            grid[offset + i, col] = float(np.mean(slot["frames"])) if slot["frames"] else np.nan
            covers[offset + i, col] = len(slot["frames"])
            kinds[offset + i] = slot["kind"]
    width = min(16.0, 3.0 + 0.12 * len(records))
    # one labelled row per slot up to LABELLED_SLOTS; beyond (a long `full` run has hundreds of
    # slots) the figure keeps that height: a 280-slot figure 98 inches tall took ~450 MB to draw
    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.35 * min(max(1, n_slots), LABELLED_SLOTS)))
    img = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", interpolation="nearest",
                    vmin=0, vmax=max(1, 3 * len(records)))
    fig.colorbar(img, ax=ax, label="source latent frame (mean)")
    if covers.max() > 1 and len(records) <= 64 and n_slots <= 32:  # small enough to read: frames per cell
        for row, col in zip(*np.nonzero(covers > 1)):
            ax.text(col, row, str(covers[row, col]), ha="center", va="center", fontsize=6, color="white")
        ax.set_xlabel("chunk (numbers: frames a slot averages)")
    else:
        ax.set_xlabel("chunk")
    for col, rec in enumerate(records):  # the trajectory's waypoints, where the chunk reaches them
        for label in rec.get("waypoints") or []:
            ax.axvline(col, color="white", lw=0.8, ls="--", alpha=0.8)
            ax.text(col, -0.55, str(label), ha="center", va="bottom", fontsize=8, color="black",
                    fontweight="bold", clip_on=False)
    marks = [c for c, r in enumerate(records) if any(e.get("landmark") for e in r["cache"].get("events", []))]
    if marks:
        ax.scatter(marks, [-0.9] * len(marks), marker="v", color="red", s=30, clip_on=False, label="landmark stored")
        ax.legend(loc="upper right", bbox_to_anchor=(1.0, 1.35), fontsize=8, frameon=False)
    if n_slots <= LABELLED_SLOTS:
        ax.set_yticks(range(n_slots), [f"{i}: {k}" for i, k in enumerate(kinds)], fontsize=8)
    else:
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_ylabel(f"slot (of {n_slots}; kinds: {', '.join(sorted(set(kinds)))})", fontsize=8)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title(title or f"cache slots of {records[0]['cache']['writer']} ({records[0]['cache']['positions']})",
                 fontsize=10, pad=14)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
    return Path(path)
