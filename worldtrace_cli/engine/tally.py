"""What a run has generated so far, kept whether or not it writes a folder: :class:`RunTally` (the
finished chunk records, seconds per phase, memory peaks, the summary's ``totals``) and the one
definition of the critical path's seconds. The chunk loop (:mod:`~worldtrace_cli.engine.loop`) keeps
one; the run folder's :class:`~worldtrace_cli.runs.sinks.RunSinks` is one that also writes."""

from __future__ import annotations

import time


def critical_path_seconds(phases: dict[str, float], overlap_decode: bool) -> float:
    """The seconds on a run's critical path from its seconds per phase (``denoise``, ``context``, ``cache``,
    ``decode``, ``decode_wait``): every phase, except that with ``--overlap-decode`` the decode runs beside
    the DiT and only the wait for it counts (``decode_wait``), and without it the decode itself counts.
    One definition for ``summary.json``'s ``generate`` seconds and ``bench speed``'s s/chunk."""
    return sum(v for k, v in phases.items() if k != ("decode" if overlap_decode else "decode_wait"))


def fresh_progress() -> dict:
    """A run's progress before its first chunk: ``{"totals": {phase: seconds}, "peak": {...bytes}}``."""
    return {"totals": {}, "peak": {"rss_bytes": 0, "gpu_peak_bytes": 0}}


class RunTally:
    """What a run has generated so far, kept whether or not it writes a folder: the finished chunk
    records, seconds per phase and memory peaks (a session without ``record=`` keeps one, so its
    :meth:`~worldtrace_cli.session.live.Session.summary` counts what it made).

    Args:
        plan: the ActionPlan; records: records kept from before a resume (appended to);
        progress: ``{"totals", "peak"}`` (:func:`fresh_progress`; saved in resume states);
        frames_per_chunk: latent frames per chunk.
    """

    def __init__(self, plan, records: list[dict], progress: dict, frames_per_chunk: int):
        self.plan, self.records, self.progress, self.frames_per_chunk = plan, records, progress, frames_per_chunk

    def add(self, rec: dict) -> None:
        """Count one finished chunk record: kept, its ``timings_s`` summed, its ``memory`` peaks kept."""
        totals, peak = self.progress["totals"], self.progress["peak"]
        self.records.append(rec)
        for k, v in rec["timings_s"].items():
            totals[k] = totals.get(k, 0.0) + v
        for k in peak:
            peak[k] = max(peak[k], rec["memory"].get(k, 0))

    def max_offset(self) -> int | None:
        """The largest query-key temporal offset (latent frames) any chunk read the cache at."""
        return max((r["cache"]["max_offset"] for r in self.records if r["cache"].get("max_offset") is not None),
                   default=None)

    def totals(self, chunks: int, load_s: float, cond_s: float, overlap_decode: bool, started: float,
               device, account: bool = True) -> dict:
        """The summary's ``totals``: chunks, latent/pixel frames, seconds per phase (load, conditioning,
        denoise, context, cache, decode, generate = the critical path, wall = since this process's
        run started), s/chunk, fps, peaks. With ``account`` (a whole run whose model was loaded
        within ``wall``) also other = wall - load - conditioning - generate: importing torch and the
        libraries, building the model, checking inputs, writing outputs; left out otherwise (a
        resumed run's phases sum over its processes, a shared model loaded before ``started``)."""
        from ..trajectory import frames_for_chunks

        totals, peak = self.progress["totals"], self.progress["peak"]
        gen_s = critical_path_seconds(totals, overlap_decode)
        frames_total = frames_for_chunks(chunks, self.frames_per_chunk) if chunks else 0
        wall = time.time() - started
        return {
            "chunks": chunks,
            "latent_frames": chunks * self.frames_per_chunk,
            "pixel_frames": frames_total,
            "seconds": {"load": round(load_s, 3), "conditioning": round(cond_s, 3),
                        **{k: round(v, 3) for k, v in totals.items()}, "generate": round(gen_s, 3),
                        "wall": round(wall, 3),
                        **({"other": round(wall - load_s - cond_s - gen_s, 3)} if account else {})},
            "seconds_per_chunk": round(gen_s / chunks, 4) if chunks else None,
            "fps": round(frames_total / gen_s, 3) if gen_s else None,
            "peak_rss_bytes": peak["rss_bytes"],
            "gpu_peak_bytes": peak["gpu_peak_bytes"] if device.type == "cuda" else None,
        }


__all__ = ["RunTally", "critical_path_seconds", "fresh_progress"]
