"""A chunk's ``chunks.jsonl`` record, built in one place (schema: ``schemas/chunk.schema.json``).

:func:`chunk_record` starts it when the rollout has generated the chunk (the cache as read, phase
seconds, latents); :func:`decode_record` adds the decode's seconds and memory (called by
:class:`~worldtrace_cli.engine.decode.DecodePipeline`); :func:`finish_record` completes it from the decoded frames
(pixel frames, actions, waypoints, ``frames_sha256``, metrics). Torch is imported only inside the
functions that use it, so the module loads without torch.
"""

from __future__ import annotations

import hashlib
import os
from typing import TYPE_CHECKING

from ..outputs.records import slot_records
from ..schemas import SCHEMA_VERSION

if TYPE_CHECKING:
    import torch

    from ..memory import CacheGeometry, CacheWriter
    from ..model.attention_stats import AttentionProbe
    from .rollout import CacheRead, PhaseTimer


def process_rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def chunk_record(writer: CacheWriter, geometry: CacheGeometry, chunk: int, frame_start: int, read: CacheRead,
                 timer: PhaseTimer, x0: torch.Tensor, probe: AttentionProbe | None = None) -> dict:
    """The ``chunks.jsonl`` record of a generated chunk (before decoding): index, latent frames
    ``[start, end)``, the cache as read (writer, scheme, :func:`slot_records`, trained and largest
    offset, KV bytes read, host bytes, events), phase seconds, memory and the latents' mean / std.
    ``read`` is what the chunk read (:func:`begin_chunk`), taken before its commit. With ``probe``
    (``--attention-stats``) each slot run carries ``attention`` (its slots' shares, mean over layers)
    and the cache ``attention`` (:func:`attention_record`)."""
    f = geometry.frames_per_chunk
    slots, tokens = read.slots, read.tokens
    token_bytes = writer.token_bytes()
    per_slot = [int(col[0]) if bool((col == col[0]).all()) else round(col.double().mean().item(), 2)
                for col in tokens.T] if len(slots) else []  # tokens per layer (mean when layers differ)
    slot_bytes = [int(col.sum()) * token_bytes for col in tokens.T] if len(slots) else []
    shares = None if probe is None else probe.shares()  # [L, S + 1]
    slot_recs = slot_records(slots, read.positions.tolist(), frame_start, per_slot, slot_bytes, f,
                             None if shares is None else [round(float(a), SHARE_DIGITS)
                                                          for a in shares[:, :-1].mean(0).tolist()])
    cache = {
        "writer": writer.name,
        "positions": writer.positions_scheme,
        "slots": slot_recs,
        "trained_offset": geometry.trained_offset,
        "slot_count": len(slots),
        "max_offset": max((s["max_offset"] for s in slot_recs), default=None),
        "kv_bytes": read.kv_bytes,
        "host_bytes": writer.host_bytes(),
        "events": writer.events(),
    }
    if probe is not None:
        cache["attention"] = attention_record(shares, slots, probe.sampled())
    return {
        "schema_version": SCHEMA_VERSION,
        "chunk": chunk,
        "latent_frames": [frame_start, frame_start + f],
        "cache": cache,
        "timings_s": {k: round(v, 6) for k, v in timer.seconds.items()},
        "memory": memory_record(timer.device),
        "latents": {"mean": round(x0.mean().item(), 6), "std": round(x0.std().item(), 6)},
    }


SHARE_DIGITS = 6  # attention shares in chunks.jsonl: 1e-6 of the chunk's attention
LAYER_SHARE_DIGITS = 5  # a slot's share in one layer ([L][S] numbers a chunk: one digit fewer)


def attention_record(shares: torch.Tensor, slots: list, sampled: dict | None) -> dict:
    """The record's ``cache.attention``: what the chunk's last denoising step read, from an
    :class:`~worldtrace_cli.model.attention_stats.AttentionProbe`'s ``shares`` float64 [L, S + 1]
    (per layer: each past slot's share of the softmax mass, then the chunk's own).

    Fields: ``pass`` (``last_denoising_step``), ``queries`` (``all``, or the seeded sample
    ``{"sampled", "of", "seed"}``), ``self`` (the chunk's own share, mean over layers), ``summary`` /
    ``recent`` (the shares of the slots of each role, mean over layers), ``by_layer``: per layer
    ``self``, ``summary``, ``recent`` (lists of L), and ``slots_by_layer``: per layer, each past slot's
    share in read order ([L][S], :data:`LAYER_SHARE_DIGITS` digits: which layers read which slot).
    The slots' own shares (mean over layers) are each slot run's ``attention``."""
    import torch

    roles = {role: torch.tensor([s.role == role for s in slots] + [False], dtype=torch.bool)
             for role in ("summary", "recent")}
    by_layer = {"self": shares[:, -1]}
    by_layer.update({role: shares[:, mask].sum(1) for role, mask in roles.items()})

    def r(x):
        return round(float(x), SHARE_DIGITS)

    return {"pass": "last_denoising_step", "queries": "all" if sampled is None else sampled,
            **{k: r(v.mean()) for k, v in by_layer.items()},
            "by_layer": {k: [r(x) for x in v.tolist()] for k, v in by_layer.items()},
            "slots_by_layer": [[round(x, LAYER_SHARE_DIGITS) for x in row] for row in shares[:, :-1].tolist()]}


def memory_record(device: torch.device) -> dict:
    """Peak GPU bytes since the last reset (cuda) and current process RSS bytes."""
    import torch

    rec = {"rss_bytes": process_rss_bytes()}
    if device.type == "cuda":
        rec["gpu_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return rec


def decode_record(record: dict, seconds: float, device, wait: float | None = None) -> None:
    """Add a chunk's decode to its record in place: ``timings_s.decode`` (seconds the decode itself
    took), ``timings_s.decode_wait`` with overlap (seconds generation waited for it: the part of the
    decode on the critical path) and ``memory`` re-read after the decode (:func:`memory_record`:
    peak GPU bytes include it). Called by :class:`~worldtrace_cli.engine.decode.DecodePipeline`."""
    timings = record["timings_s"]
    timings["decode"] = round(seconds, 6)
    if wait is not None:
        timings["decode_wait"] = round(wait, 6)
    record["memory"] = memory_record(device)


def finish_record(out, plan, scorer, frames_per_chunk: int) -> dict:
    """Complete a decoded chunk's ``chunks.jsonl`` record in place and return it: ``pixel_frames``
    ``[start, end)``, ``actions`` (the plan's display name of the chunk's actions), ``waypoints``,
    ``frames_sha256`` (of the decoded uint8 [T, H, W, 3] frames' bytes) and ``metrics``
    (``scorer.add_chunk``, in chunk order). The one place a record is finished: ``generate``'s
    :class:`~worldtrace_cli.runs.sinks.RunSinks` and live sessions (:class:`~worldtrace_cli.session.Session`), through :class:`ChunkLoop`, both call it.

    Args:
        out: a decoded :class:`~worldtrace_cli.engine.rollout.ChunkOutput`; plan: the ActionPlan (its
            ``chunk_actions`` cover the chunk; its ``waypoints`` give the chunk's labels); scorer: OnlineMetrics.
    """
    from torch import no_grad

    from ..trajectory import chunk_rows

    c, rec = out.record["chunk"], out.record
    rec["pixel_frames"] = list(chunk_rows(c, frames_per_chunk))
    rec["actions"] = plan.chunk_actions[c]
    if plan.prompts is not None:  # a text-to-video run: the chunk's whole prompt
        rec["prompt"] = plan.prompts[c]
    rec["waypoints"] = [label for chunk, label in plan.waypoints if chunk == c]
    rec["frames_sha256"] = hashlib.sha256(out.frames.numpy().tobytes()).hexdigest()
    with no_grad():
        rec["metrics"] = scorer.add_chunk(out.latents, out.frames)
    return rec
