"""``cache_timeline.png``: what a writer kept, slot by chunk (design.md §4).

Rows are the cache slots in read order (summary slots on top, recent slots at the bottom), columns
are chunks; each cell is coloured by the mean source latent frame of the slot at that chunk (blank
where the slot did not exist yet). Chunks in which a landmark was stored are marked with a red
triangle above the grid. Reads only ``chunks.jsonl`` records, so it can be redrawn for any run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .outputs import atomic_path


def _centroid(frames) -> float:
    if isinstance(frames, dict):
        return (frames["first"] + frames["last"]) / 2
    return float(np.mean(frames)) if frames else float("nan")


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

    if not records:
        raise ValueError("no chunk records to plot")
    n_slots = max(len(r["cache"]["slots"]) for r in records)
    grid = np.full((max(1, n_slots), len(records)), np.nan)
    kinds = [""] * n_slots
    for col, rec in enumerate(records):
        slots = rec["cache"]["slots"]
        offset = n_slots - len(slots)  # align the newest slot with the bottom row
        for i, slot in enumerate(slots):
            grid[offset + i, col] = _centroid(slot["frames"])
            kinds[offset + i] = slot["kind"]
    width = min(16.0, 3.0 + 0.12 * len(records))
    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.35 * max(1, n_slots)))
    img = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="viridis", interpolation="nearest",
                    vmin=0, vmax=max(1, 3 * len(records)))
    fig.colorbar(img, ax=ax, label="source latent frame (mean)")
    marks = [c for c, r in enumerate(records) if any(e.get("landmark") for e in r["cache"].get("events", []))]
    if marks:
        ax.scatter(marks, [-0.9] * len(marks), marker="v", color="red", s=30, clip_on=False, label="landmark stored")
        ax.legend(loc="upper right", bbox_to_anchor=(1.0, 1.35), fontsize=8, frameon=False)
    ax.set_yticks(range(n_slots), [f"{i}: {k}" for i, k in enumerate(kinds)], fontsize=8)
    ax.set_xlabel("chunk")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title(title or f"cache slots of {records[0]['cache']['writer']} ({records[0]['cache']['positions']})",
                 fontsize=10)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
    return Path(path)
