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
                 frames_per_chunk: int = 3) -> list[dict]:
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

    Args:
        tokens, slot_bytes: per slot, its tokens and its K+V bytes (all layers).
    """
    out: list[dict] = []
    last = None  # (record, last frame, last position) of the open mergeable run
    for slot, pos, n, size in zip(slots, positions, tokens, slot_bytes):
        single = len(slot.frames) == 1 and slot.time is None
        if (single and last is not None and last[0]["role"] == slot.role and last[0]["kind"] == slot.kind
                and last[0]["tokens"] == n and int(slot.frames[0]) == last[1] + 1 and pos == last[2] + 1):
            rec = last[0]
            rec["count"] += 1
            rec["frames"][-1][1] = int(slot.frames[0])
            rec["offset"][1], rec["virtual_position"][1] = pos, frame_start + pos
            rec["bytes"] += size
            last = (rec, int(slot.frames[0]), pos)
            continue
        rec = {"role": slot.role, "kind": slot.kind, "count": 1, "frames": frame_ranges(slot.frames),
               "offset": [pos, pos], "virtual_position": [frame_start + pos, frame_start + pos],
               "max_offset": frames_per_chunk - 1 - pos, "tokens": n, "bytes": size}
        out.append(rec)
        last = (rec, int(slot.frames[0]), pos) if single else None
    return out


def expand_slot_records(runs: list[dict]) -> list[dict]:
    """The per-slot view of :func:`slot_records`' runs: one dict per slot with ``role``, ``kind``,
    ``frames`` (the slot's source latent frames, a list), ``tokens``, ``offset`` and ``virtual_position``."""
    out = []
    for run in runs:
        if run["count"] == 1:
            frames = [f for first, last in run["frames"] for f in range(first, last + 1)]
            out.append({"role": run["role"], "kind": run["kind"], "frames": frames, "tokens": run["tokens"],
                        "offset": run["offset"][0], "virtual_position": run["virtual_position"][0]})
            continue
        first = run["frames"][0][0]
        for i in range(run["count"]):
            out.append({"role": run["role"], "kind": run["kind"], "frames": [first + i], "tokens": run["tokens"],
                        "offset": run["offset"][0] + i, "virtual_position": run["virtual_position"][0] + i})
    return out


__all__ = ["expand_slot_records", "frame_ranges", "slot_records"]
