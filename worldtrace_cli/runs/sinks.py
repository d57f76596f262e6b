"""Where a run's decoded chunks go: video, chunk records (finished by
:func:`~worldtrace_cli.engine.loop.finish_record`), metrics, progress bar, totals."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("worldtrace")


class RunSinks:
    """Writes each decoded chunk of a run: video frames (``video.mp4``, or ``video.part.mp4`` after a
    resume), online metrics, its ``chunks.jsonl`` record (fsync'ed), the progress bar, totals.

    Args:
        folder: the :class:`~worldtrace_cli.runs.RunFolder`; preset: its pixel size and fps.
        plan: the ActionPlan (actions and waypoints per chunk); scorer: OnlineMetrics.
        records: records kept from before a resume (appended to); progress: ``{"totals", "peak"}``
            (saved in resume states); start: first chunk generated now; show: progress bar on stderr.
    """

    def __init__(self, folder, preset, plan, scorer, records: list[dict], progress: dict, start: int,
                 show: bool, desc: str):
        self.frames_per_chunk = preset.frames_per_chunk
        from tqdm import tqdm

        from ..outputs import JsonlWriter, VideoStreamWriter

        self.folder, self.plan, self.scorer, self.records, self.start = folder, plan, scorer, records, start
        self.progress = progress
        self.video = VideoStreamWriter(folder.video_part if start else folder.video, preset.width, preset.height,
                                       preset.fps, pass_fds=() if folder.lock_fd is None else (folder.lock_fd,))
        self.jsonl = JsonlWriter(folder.chunks, append=True)
        self.bar = tqdm(total=plan.num_chunks, initial=start, unit="chunk", file=sys.stderr, disable=not show,
                        desc=desc)

    def write(self, outs) -> None:
        """Write decoded :class:`~worldtrace_cli.engine.rollout.ChunkOutput` s in order."""
        from ..engine.loop import finish_record

        totals, peak = self.progress["totals"], self.progress["peak"]
        for out in outs:
            rec = out.record
            self.video.write(out.frames)
            finish_record(out, self.plan, self.scorer, self.frames_per_chunk)
            self.jsonl.write(rec)
            self.records.append(rec)
            for k, v in rec["timings_s"].items():
                totals[k] = totals.get(k, 0.0) + v
            for k in peak:
                peak[k] = max(peak[k], rec["memory"].get(k, 0))
            self.bar.update(1)

    def close(self, decode, failing: bool) -> None:
        """Close the decode pipeline, bar, records and video; join a resumed run's video part; draw
        the cache timeline. With ``failing`` a closing error is logged, not raised (it must not hide
        the real one)."""
        from ..outputs import concat_videos
        from ..outputs.timeline import plot_cache_timeline

        steps = ([] if decode is None else [decode.close]) + [self.bar.close, self.jsonl.close, self.video.close]
        if self.start:
            steps.append(lambda: concat_videos([self.folder.video, self.folder.video_part], self.folder.video))
        if self.records:
            steps.append(lambda: plot_cache_timeline(self.records, self.folder.timeline, returns=self.returns()))
        for step in steps:
            try:
                step()
            except Exception as exc:
                if not failing:
                    raise
                log.warning(f"while stopping: {exc}")

    def returns(self) -> dict[int, set[int]] | None:
        """For the attention panel of ``cache_timeline.png`` (records with attention shares): each return
        chunk of the plan's revisits and the latent frames of its first visit
        (:func:`~worldtrace_cli.metrics.revisit.first_visit_frames`); None without shares."""
        if not any("attention" in r["cache"] for r in self.records):
            return None
        from ..metrics.revisit import first_visit_frames, revisit_pairs

        return first_visit_frames(self.plan, revisit_pairs(self.plan)["chunk_pairs"])

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
        # with overlap the decode runs beside the DiT: only the wait for it is on the critical path
        gen_s = sum(v for k, v in totals.items() if k != ("decode" if overlap_decode else "decode_wait"))
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


__all__ = ["RunSinks"]
