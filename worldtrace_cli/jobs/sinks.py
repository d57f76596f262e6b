"""Where a generate run's decoded chunks go: video, chunk records, metrics, progress bar, totals;
and the stop flag that turns Ctrl-C / SIGTERM into a clean stop after the current chunk."""

from __future__ import annotations

import hashlib
import logging
import signal
import sys
import time

log = logging.getLogger("worldtrace")


class StopFlag:
    """SIGINT/SIGTERM set :attr:`signal`, checked between chunks; a second SIGINT aborts at once
    (KeyboardInterrupt). Use as a context manager (handlers restored on exit).

    Flags nest: a signal that arrives while an inner flag is held (a LoopBench job's run inside the
    sweep's flag) is passed on to the enclosing flag when the inner one exits, so a stop asked for
    during a job's last chunk, after the job stopped looking, still stops the sweep; and an inner
    flag entered after the enclosing one heard a signal (one arriving while a run set up, before
    its own flag) starts with that signal, so the run stops after its first chunk and a second
    Ctrl-C aborts at once, as the first one's message says.

    Args:
        message: logged when the first signal arrives (what happens next).
    """

    def __init__(self, message: str = "stopping after the current chunk (Ctrl-C again to abort now)"):
        self.signal: int | None = None
        self.message = message
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no graceful stop, nothing else changes
                pass
        for handler in self._previous.values():  # a signal the enclosing flag heard counts here too
            outer = _flag_of(handler)
            if outer is not None and outer.signal is not None:
                self.signal = self.signal or outer.signal
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum
        log.info(self.message)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        outer = _flag_of(self._previous.get(self.signal))
        if self.signal is not None and outer is not None:
            outer.signal = outer.signal or self.signal  # the enclosing flag heard it too


def _flag_of(handler) -> StopFlag | None:
    """The StopFlag whose handler ``handler`` is (an enclosing flag), else None."""
    owner = getattr(handler, "__self__", None)
    return owner if isinstance(owner, StopFlag) else None


def finish_record(out, plan, waypoints: dict, scorer, frames_per_chunk: int) -> dict:
    """Complete a decoded chunk's ``chunks.jsonl`` record in place and return it: ``pixel_frames``
    ``[start, end)``, ``actions`` (the plan's display name of the chunk's actions), ``waypoints``,
    ``frames_sha256`` (of the decoded uint8 [T, H, W, 3] frames' bytes) and ``metrics``
    (``scorer.add_chunk``, in chunk order). The one place a record is finished: ``generate``'s
    :class:`RunSinks` and live sessions (:class:`~worldtrace_cli.session.Session`) both call it.

    Args:
        out: a decoded :class:`~worldtrace_cli.rollout.ChunkOutput`; plan: the ActionPlan (its
            ``chunk_actions`` cover the chunk); waypoints: chunk -> labels; scorer: OnlineMetrics.
    """
    from torch import no_grad

    from ..trajectory import chunk_rows

    c, rec = out.record["chunk"], out.record
    rec["pixel_frames"] = list(chunk_rows(c, frames_per_chunk))
    rec["actions"] = plan.chunk_actions[c]
    rec["waypoints"] = waypoints.get(c, [])
    rec["frames_sha256"] = hashlib.sha256(out.frames.numpy().tobytes()).hexdigest()
    with no_grad():
        rec["metrics"] = scorer.add_chunk(out.latents, out.frames)
    return rec


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
        self.waypoints: dict[int, list[str]] = {}
        for chunk_index, label in plan.waypoints:
            self.waypoints.setdefault(chunk_index, []).append(label)
        self.video = VideoStreamWriter(folder.video_part if start else folder.video, preset.width, preset.height,
                                       preset.fps, pass_fds=() if folder.lock_fd is None else (folder.lock_fd,))
        self.jsonl = JsonlWriter(folder.chunks, append=True)
        self.bar = tqdm(total=plan.num_chunks, initial=start, unit="chunk", file=sys.stderr, disable=not show,
                        desc=desc)

    def write(self, outs) -> None:
        """Write decoded :class:`~worldtrace_cli.rollout.ChunkOutput` s in order."""
        totals, peak = self.progress["totals"], self.progress["peak"]
        for out in outs:
            rec = out.record
            self.video.write(out.frames)
            finish_record(out, self.plan, self.waypoints, self.scorer, self.frames_per_chunk)
            self.jsonl.write(rec)
            self.records.append(rec)
            for k, v in rec["timings_s"].items():
                totals[k] = totals.get(k, 0.0) + v
            for k in peak:
                peak[k] = max(peak[k], rec["memory"].get(k, 0))
            self.bar.update(1)

    def drain(self, decode) -> None:
        """After a failure: write the chunks still in the decode pipeline (the original error is the
        one reported, a failure here only logged)."""
        try:
            self.write(decode.flush())
        except Exception as exc:
            log.warning(f"while writing the chunks before the failure: {exc}")

    def close(self, decode, failing: bool) -> None:
        """Close the decode pipeline, bar, records and video; join a resumed run's video part; draw
        the cache timeline. With ``failing`` a closing error is logged, not raised (it must not hide
        the real one)."""
        from ..outputs import concat_videos
        from ..timeline import plot_cache_timeline

        steps = ([] if decode is None else [decode.close]) + [self.bar.close, self.jsonl.close, self.video.close]
        if self.start:
            steps.append(lambda: concat_videos([self.folder.video, self.folder.video_part], self.folder.video))
        if self.records:
            steps.append(lambda: plot_cache_timeline(self.records, self.folder.timeline))
        for step in steps:
            try:
                step()
            except Exception as exc:
                if not failing:
                    raise
                log.warning(f"while stopping: {exc}")

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
