"""Where a run's decoded chunks go: video, chunk records (finished by
:func:`~worldtrace_cli.engine.loop.finish_record`), metrics, progress bar, totals."""

from __future__ import annotations

import logging
import sys

from ..engine.tally import RunTally, critical_path_seconds, fresh_progress  # noqa: F401  (re-exported)

log = logging.getLogger("worldtrace")


class RunSinks(RunTally):
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
        super().__init__(plan, records, progress, preset.frames_per_chunk)
        from tqdm import tqdm

        from ..outputs import JsonlWriter, VideoStreamWriter

        self.folder, self.scorer, self.start = folder, scorer, start
        self.video = VideoStreamWriter(folder.video_part if start else folder.video, preset.width, preset.height,
                                       preset.fps, pass_fds=() if folder.lock_fd is None else (folder.lock_fd,))
        self.jsonl = JsonlWriter(folder.chunks, append=True)
        self.bar = tqdm(total=plan.num_chunks, initial=start, unit="chunk", file=sys.stderr, disable=not show,
                        desc=desc)

    def write(self, outs) -> None:
        """Write decoded :class:`~worldtrace_cli.engine.rollout.ChunkOutput` s in order."""
        from ..engine.loop import finish_record

        for out in outs:
            rec = out.record
            if rec.get("prefix"):  # the real clip's chunks: marked in the video (not in records or metrics)
                from ..continuation import mark_prefix_frames

                self.video.write(mark_prefix_frames(out.frames))
            else:
                self.video.write(out.frames)
            finish_record(out, self.plan, self.scorer, self.frames_per_chunk)
            self.jsonl.write(rec)
            self.add(rec)
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


__all__ = ["RunSinks", "RunTally", "critical_path_seconds", "fresh_progress"]  # the tally re-exported
