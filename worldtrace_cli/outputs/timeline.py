"""``cache_timeline.png``: what a writer kept, slot by chunk (docs/outputs.md).

Rows are the cache slots in read order (summary slots on top, recent slots at the bottom), columns
are chunks; each cell is coloured by the mean source latent frame of the slot at that chunk (blank
where the slot did not exist yet) and, on small grids, numbered with how many frames an averaged
slot covers. Dashed lines mark the chunks where the trajectory reaches a waypoint (its label). Chunks in which a landmark was stored are marked with a red
triangle above the grid. With ``--attention-stats`` a second panel shows the memory being read: each
slot's share of the chunk's attention, the chunk's own share as the last row, the return chunks and
the slots that hold their first visit marked (:func:`draw_attention`). Reads only ``chunks.jsonl``
records (and the return chunks, from the trajectory), so it can be redrawn for any run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import atomic_path


LABELLED_SLOTS = 32  # slots drawn one labelled row each; more share a figure of this height


def attention_grid(records: list[dict], returns: dict[int, set[int]] | None = None):
    """The attention picture's data: ``(grid, held)`` float arrays [S + 1, C] for C records of a run made
    with ``--attention-stats``: rows are the cache slots in read order aligned at the bottom as in
    ``cache_timeline.png`` (NaN where a chunk had fewer slots or no shares), then the chunk's own share
    (the last row); ``held`` is 1 where, on a return chunk of ``returns`` (return chunk -> the latent
    frames of its first visit, :func:`~worldtrace_cli.metrics.revisit.first_visit_frames`), the slot
    holds any of those frames, else 0. None when no record has shares."""
    from .records import expand_slot_records

    if not any("attention" in r["cache"] for r in records):
        return None
    per_chunk = [expand_slot_records(r["cache"]["slots"]) for r in records]
    n_slots = max(len(s) for s in per_chunk)
    grid = np.full((n_slots + 1, len(records)), np.nan)
    held = np.zeros_like(grid)
    for col, (rec, slots) in enumerate(zip(records, per_chunk)):
        if "attention" not in rec["cache"]:
            continue
        offset = n_slots - len(slots)
        first = (returns or {}).get(rec["chunk"], set())
        for i, slot in enumerate(slots):
            grid[offset + i, col] = slot["attention"]
            held[offset + i, col] = float(bool(first.intersection(slot["frames"])))
        grid[n_slots, col] = rec["cache"]["attention"]["self"]
    return grid, held


def attention_scale(grid) -> float:
    """The colour scale's top for an :func:`attention_grid`: the largest share of a past slot (the
    chunk's own share, often near 1, would leave the slots dark; its row saturates instead)."""
    slots = grid[:-1]
    return max(1e-6, float(np.nanmax(slots))) if np.isfinite(slots).any() else 1.0


def draw_attention(ax, records: list[dict], returns: dict[int, set[int]] | None = None, vmax: float | None = None,
                   labels: bool = True):
    """Draw :func:`attention_grid` into the matplotlib axes ``ax``: slots x chunks coloured by each slot's
    share of the chunk's attention (the last row: the chunk itself), the return chunks marked by a
    white triangle above the grid and, on them, the slots holding the first visit outlined in cyan.
    ``vmax``: the colour scale's top (default: :func:`attention_scale`). Returns the image (for a colour
    bar), or None when the records hold no shares."""
    import matplotlib.patches
    import matplotlib.ticker

    from .records import expand_slot_records

    data = attention_grid(records, returns)
    if data is None:
        return None
    grid, held = data
    top = vmax if vmax is not None else attention_scale(grid)
    img = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap="inferno", interpolation="nearest", vmin=0,
                    vmax=top)
    for row, col in zip(*np.nonzero(held)):
        ax.add_patch(matplotlib.patches.Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="cyan", lw=1.5))
    back = sorted(c for c, r in enumerate(records) if r["chunk"] in (returns or {}))
    if back:
        ax.scatter(back, [-0.9] * len(back), marker="v", color="tab:cyan", s=24, clip_on=False)
    n = grid.shape[0]
    if labels:
        last = expand_slot_records(records[-1]["cache"]["slots"])
        kinds = [""] * (n - 1 - len(last)) + [s["kind"] for s in last]
        ticks = [f"{i}: {k}" for i, k in enumerate(kinds)] + ["chunk itself"]
        if n <= LABELLED_SLOTS:
            ax.set_yticks(range(n), ticks, fontsize=8)
        else:
            ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    else:
        ax.set_yticks([])
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    return img


def plot_cache_timeline(records: list[dict], path: str | Path, title: str = "",
                        returns: dict[int, set[int]] | None = None) -> Path:
    """Draw the slots x chunks picture of ``records`` (chunks.jsonl dicts) into a PNG at ``path``.

    With attention shares in the records (``--attention-stats``) a second panel below shows each
    slot's share of the chunk's attention (:func:`draw_attention`; ``returns``: return chunk -> the
    latent frames of its first visit, marked on it).

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
    attention = any("attention" in r["cache"] for r in records)
    if attention:
        width = max(width, 7.5)  # room for the panel's labels
    # one labelled row per slot up to LABELLED_SLOTS; beyond (a long `full` run has hundreds of
    # slots) the figure keeps that height: a 280-slot figure 98 inches tall took ~450 MB to draw
    height = 1.2 + 0.35 * min(max(1, n_slots), LABELLED_SLOTS)
    if attention:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(width, 2 * height + 0.6), sharex=True)
    else:
        fig, ax = plt.subplots(figsize=(width, height))
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
    if attention:
        shares = draw_attention(ax2, records, returns)
        fig.colorbar(shares, ax=ax2, label="share of the chunk's attention", extend="max")
        ax2.set_xlabel("chunk (▼ return chunks; cyan: slots holding the first visit)" if returns else "chunk")
        ax2.set_title("attention per slot (last denoising step; mean over layers, heads, queries)",
                      fontsize=10, pad=14)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
    return Path(path)


def plot_attention_comparison(runs: list[tuple[str, list[dict]]], path: str | Path,
                              returns: dict[int, set[int]] | None = None) -> Path | None:
    """``compare_attention.png``: one :func:`draw_attention` panel per writer (``runs``: (label, records)),
    stacked on one chunk axis and one colour scale, so a person sees which writer's cache is read on
    the return chunks (``returns``, marked) and which has nothing there to read. Runs without shares
    are left out; returns None (nothing written) when none has them.

    Raises:
        OutputError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(label, recs) for label, recs in runs if recs and any("attention" in r["cache"] for r in recs)]
    if not runs:
        return None
    grids = [attention_grid(recs, returns)[0] for _, recs in runs]
    top = max(attention_scale(g) for g in grids)
    chunks = max(len(recs) for _, recs in runs)
    rows = [min(g.shape[0], LABELLED_SLOTS) for g in grids]
    width = max(7.5, min(16.0, 3.5 + 0.12 * chunks))
    fig, axes = plt.subplots(len(runs), 1, figsize=(width, 0.9 * len(runs) + 0.3 * sum(rows) + 0.6), sharex=True,
                             squeeze=False, gridspec_kw={"height_ratios": rows}, layout="constrained")
    img = None
    for ax, (label, recs) in zip(axes[:, 0], runs):
        img = draw_attention(ax, recs, returns, vmax=top)
        ax.set_title(label, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("chunk (▼ return chunks; cyan: slots holding the first visit)" if returns else "chunk")
    fig.colorbar(img, ax=axes[:, 0].tolist(), label="share of the chunk's attention", extend="max")
    fig.suptitle("attention per cache slot (last denoising step; mean over layers, heads, queries)", fontsize=10)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=100)
    finally:
        plt.close(fig)
    return Path(path)
