"""Per-chunk cache records of ``chunks.jsonl``: the slots a chunk read, in a form whose size does not
grow with the cache (torch-free: readers such as ``cache_timeline.png`` and ``metrics`` use it
without loading torch). Schema: ``schemas/chunk-record.schema.json``.
"""

from __future__ import annotations


def frame_ranges(frames) -> list[list[int]]:
    """Latent-frame ids (in order) as inclusive ``[first, last]`` runs of consecutive ids:
    ``[0, 1, 2, 7]`` -> ``[[0, 2], [7, 7]]``."""
    out: list[list[int]] = []
    for f in frames:
        f = int(f)
        if out and f == out[-1][1] + 1:
            out[-1][1] = f
        else:
            out.append([f, f])
    return out


def slot_records(slots, positions: list[float], frame_start: int, tokens: list, slot_bytes: list[int],
                 frames_per_chunk: int = 3, attention: list[float] | None = None) -> list[dict]:
    """JSON records of the slots read by a chunk, as *runs* so a record's size does not grow with
    the cache (chunks.jsonl grows linearly in the number of chunks for every writer, even ``full``).

    A run is ``count`` >= 1 consecutive slots of one ``role`` (summary | recent), ``kind`` and token
    count that each hold one source latent frame, frame ids and virtual positions both increasing by exactly 1 from
    slot to slot (e.g. a sliding or full window); any other slot is a run of one. Fields (one JSON
    type each, schemas/chunk-record.schema.json):

    - ``frames``: the source latent frames of the run as inclusive ``[first, last]`` ranges
      (:func:`frame_ranges`); for a run of one averaged slot, the frames it averages.
    - ``offset`` / ``virtual_position``: ``[first slot, last slot]`` (latent frames from the chunk's
      first frame / absolute index); slot i of the run is read at ``offset[0] + i``.
    - ``max_offset``: the largest query-key temporal offset any slot of the run is read at (from the
      chunk's last frame: ``frames_per_chunk - 1 - offset[0]``; compare with ``trained_offset``).
    - ``tokens``: tokens of each slot of the run (T for a whole latent frame; a WorldKV-compressed
      chunk's frames keep fewer, chosen per layer: then the mean over layers).
    - ``bytes``: K+V bytes of the run, all layers.
    - ``attention`` (with ``--attention-stats``): per slot of the run, its share of the chunk's
      attention (mean over layers and heads of the softmax mass on its keys at the last denoising
      step; the record's ``cache.attention`` has the chunk's own share and the rest).

    Args:
        tokens, slot_bytes: per slot, its tokens and its K+V bytes (all layers).
        attention: per slot, its attention share, or None (not measured).
    """
    out: list[dict] = []
    last = None  # (record, last frame, last position) of the open mergeable run
    shares = [None] * len(slots) if attention is None else attention
    for slot, pos, n, size, share in zip(slots, positions, tokens, slot_bytes, shares):
        single = len(slot.frames) == 1 and slot.time is None
        if (single and last is not None and last[0]["role"] == slot.role and last[0]["kind"] == slot.kind
                and last[0]["tokens"] == n and int(slot.frames[0]) == last[1] + 1 and pos == last[2] + 1):
            rec = last[0]
            rec["count"] += 1
            rec["frames"][-1][1] = int(slot.frames[0])
            rec["offset"][1], rec["virtual_position"][1] = pos, frame_start + pos
            rec["bytes"] += size
            if share is not None:
                rec["attention"].append(share)
            last = (rec, int(slot.frames[0]), pos)
            continue
        rec = {"role": slot.role, "kind": slot.kind, "count": 1, "frames": frame_ranges(slot.frames),
               "offset": [pos, pos], "virtual_position": [frame_start + pos, frame_start + pos],
               "max_offset": frames_per_chunk - 1 - pos, "tokens": n, "bytes": size}
        if share is not None:
            rec["attention"] = [share]
        out.append(rec)
        last = (rec, int(slot.frames[0]), pos) if single else None
    return out


def expand_slot_records(runs: list[dict]) -> list[dict]:
    """The per-slot view of :func:`slot_records`' runs: one dict per slot with ``role``, ``kind``,
    ``frames`` (the slot's source latent frames, a list), ``tokens``, ``offset``, ``virtual_position``
    and ``attention`` (its share of the chunk's attention, or None when the run did not measure it)."""
    out = []
    for run in runs:
        shares = run.get("attention") or [None] * run["count"]
        if run["count"] == 1:
            frames = [f for first, last in run["frames"] for f in range(first, last + 1)]
            out.append({"role": run["role"], "kind": run["kind"], "frames": frames, "tokens": run["tokens"],
                        "offset": run["offset"][0], "virtual_position": run["virtual_position"][0],
                        "attention": shares[0]})
            continue
        first = run["frames"][0][0]
        for i in range(run["count"]):
            out.append({"role": run["role"], "kind": run["kind"], "frames": [first + i], "tokens": run["tokens"],
                        "offset": run["offset"][0] + i, "virtual_position": run["virtual_position"][0] + i,
                        "attention": shares[i]})
    return out


def latent_pixel_frames(frame: int) -> list[int]:
    """The pixel frames latent frame ``frame`` decodes to (Wan VAE, 4x temporal): ``[0]`` for latent
    frame 0, ``[4f - 3, ..., 4f]`` after (video.mp4's frame indices)."""
    return [0] if frame == 0 else list(range(4 * frame - 3, 4 * frame + 1))


def most_read_slot(record: dict, layer: int | None = None) -> dict | None:
    """Which slot a chunk read most, and what it held: the slot of ``record`` (a chunks.jsonl record
    of a run with ``--attention-stats``) with the largest attention share (mean over layers, or in
    self-attention layer ``layer``: the record's ``slots_by_layer``), as :func:`expand_slot_records`'
    dict plus ``slot`` (its index in read order), ``share`` (that share), ``self`` (the chunk's share
    on itself, over layers or in ``layer``, for scale) and ``pixel_frames`` (the video frames its
    source latent frames decode to, :func:`latent_pixel_frames`). None when the chunk read no past slot.

    Raises:
        ValueError: the record holds no attention shares (the run was made without ``--attention-stats``),
            or none per layer (recorded before ``slots_by_layer`` existed) when ``layer`` is given.
        IndexError: ``layer`` is not one of the model's layers.
    """
    cache = record["cache"]
    if "attention" not in cache:
        raise ValueError(f"chunk {record.get('chunk')}: no attention shares in its record "
                         f"(generate with --attention-stats)")
    slots = expand_slot_records(cache["slots"])
    att = cache["attention"]
    if layer is not None:
        if "slots_by_layer" not in att:
            raise ValueError(f"chunk {record.get('chunk')}: no shares per layer in its record (made before "
                             f"worldtrace recorded them)")
        rows = att["slots_by_layer"]
        if not -len(rows) <= layer < len(rows):
            raise IndexError(f"layer {layer}: the model has {len(rows)} self-attention layers")
        shares, own = rows[layer], att["by_layer"]["self"][layer]
    else:
        shares, own = [s["attention"] for s in slots], att["self"]
    if not slots:
        return None
    i = max(range(len(slots)), key=lambda j: shares[j])
    slot = slots[i]
    return {**slot, "slot": i, "share": shares[i], "self": own,
            "pixel_frames": [p for f in slot["frames"] for p in latent_pixel_frames(f)]}


def recall_share(record: dict, frames: set[int]) -> float:
    """The share of a chunk's attention on the slots whose source latent frames are among ``frames``
    (the first visit of the place the chunk returns to): each slot's share times the fraction of its
    source frames in ``frames`` (an averaged slot counts for the part it holds of them).

    Raises:
        ValueError: the record holds no attention shares.
    """
    if "attention" not in record["cache"]:
        raise ValueError(f"chunk {record.get('chunk')}: no attention shares in its record "
                         f"(generate with --attention-stats)")
    total = 0.0
    for slot in expand_slot_records(record["cache"]["slots"]):
        if slot["frames"]:
            total += slot["attention"] * sum(f in frames for f in slot["frames"]) / len(slot["frames"])
    return total


def recall_attention(records: list[dict], revisited: dict[int, set[int]]) -> dict | None:
    """Recall attention of a run (``summary.json``'s ``attention.recall``, LoopBench): on each return
    chunk of ``revisited`` (:func:`~worldtrace_cli.metrics.revisit.first_visit_frames`), the share of its
    attention on the slots that hold latent frames of the first visit (:func:`recall_share`), and their
    mean; beside it ``expected``: the share the same slots (by their place in the cache) get on the
    run's other chunks, weighted alike, and ``lift`` = mean - expected: how much more the return chunks
    read those slots than their position alone gives them (a model that reads its memory by content
    shows a lift above 0; one that reads by position alone, 0).

    Returns:
        ``{"chunks": [return chunks], "per_chunk": [shares], "mean", "expected", "lift"}``, or None when
        no return chunk has a record with attention shares.
    """
    by_chunk = {r["chunk"]: r for r in records if "attention" in r.get("cache", {})}
    chunks = sorted(c for c in revisited if c in by_chunk)
    if not chunks:
        return None
    usual: dict[tuple[int, int], list[float]] = {}  # (slot count, slot index) -> shares on the other chunks
    for c, rec in by_chunk.items():
        if c in revisited:
            continue
        slots = expand_slot_records(rec["cache"]["slots"])
        for i, slot in enumerate(slots):
            usual.setdefault((len(slots), i), []).append(slot["attention"])
    per_chunk, expected = [], []
    for c in chunks:
        frames = revisited[c]
        slots = expand_slot_records(by_chunk[c]["cache"]["slots"])
        per_chunk.append(round(recall_share(by_chunk[c], frames), 6))
        base = 0.0
        for i, slot in enumerate(slots):
            if slot["frames"]:
                shares = usual.get((len(slots), i))
                held = sum(f in frames for f in slot["frames"]) / len(slot["frames"])
                base += held * (sum(shares) / len(shares) if shares else slot["attention"])
        expected.append(base)
    mean = sum(per_chunk) / len(per_chunk)
    base = sum(expected) / len(expected)
    return {"chunks": chunks, "per_chunk": per_chunk, "mean": round(mean, 6), "expected": round(base, 6),
            "lift": round(mean - base, 6)}


__all__ = ["expand_slot_records", "frame_ranges", "latent_pixel_frames", "most_read_slot", "recall_attention",
           "recall_share", "slot_records"]
