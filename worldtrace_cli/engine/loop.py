"""The one chunk loop: generate a chunk, decode it, finish its record, write it.

``worldtrace generate`` (:mod:`worldtrace_cli.jobs.generate`) and live sessions
(:class:`~worldtrace_cli.session.Session`) both drive a :class:`ChunkLoop` with each chunk's request
(:class:`~worldtrace_cli.engine.feed.ChunkRequest`, from a :class:`~worldtrace_cli.engine.feed.ConditioningFeed`);
what differs is only where the conditioning comes from (a trajectory's plan, laid out in advance, or
the caller chunk by chunk) and the job's policy around it (resume states, Ctrl-C, the summary).
"""

from __future__ import annotations

import logging

from .record import finish_record

log = logging.getLogger("worldtrace")


class ChunkLoop:
    """Rollout step -> :class:`~worldtrace_cli.engine.decode.DecodePipeline` -> finished records
    (:func:`finish_record`) -> the run folder's sinks.

    Args:
        rollout: a :class:`~worldtrace_cli.engine.rollout.ChunkRollout` of any backbone, whose
            ``step(request)`` returns a :class:`~worldtrace_cli.engine.rollout.ChunkOutput`.
        decoder: its streaming VAE decoder; device: where generation runs (torch.device).
        scorer: :class:`~worldtrace_cli.metrics.OnlineMetrics`; plan: the ActionPlan whose
            ``chunk_actions`` name each chunk's actions (it may grow chunk by chunk).
        overlap: decode one chunk behind generation (``--overlap-decode``).
        sinks: a :class:`~worldtrace_cli.runs.sinks.RunSinks` writing the run folder (it finishes
            and keeps the records), or None: records are finished into ``records``.
        records: the list unrecorded chunks' records are appended to (None: a new list).
        progress: without sinks, the ``{"totals", "peak"}`` dict seconds and peaks are summed into
            (:func:`~worldtrace_cli.engine.tally.fresh_progress`; None: a new one).
        gate: called before each chunk (a sharded run's process 0 tells the others it makes one:
            :func:`~worldtrace_cli.engine.shard.announce`), or None.
        keep: finish and keep the records (False: ``bench speed``, its sinks off: the outputs are only
            returned, their records as the rollout and decoder left them).
        Without a ``decoder`` (None) chunks are not decoded (``frames`` None; ``keep`` must be False).
    """

    def __init__(self, rollout, decoder, device, scorer, plan, overlap: bool = False, sinks=None, records=None,
                 gate=None, progress: dict | None = None, keep: bool = True):
        from .decode import DecodePipeline

        from .tally import RunTally, fresh_progress

        self.rollout, self.scorer, self.plan, self.sinks, self.gate = rollout, scorer, plan, sinks, gate
        # what the run made so far (records, seconds per phase, peaks), with or without a folder
        self.tally = sinks if sinks is not None else RunTally(plan, [] if records is None else records,
                                                               fresh_progress() if progress is None else progress,
                                                               plan.frames_per_chunk)
        self.records, self.keep = self.tally.records, keep
        self.last = None  # the latest chunk made (its ChunkOutput; decoded or not yet)
        if decoder is None and keep:
            raise ValueError("a chunk loop that keeps its records decodes its chunks")
        # after any decoder restore (its docstring)
        self.decode = None if decoder is None else DecodePipeline(decoder, device, overlap)

    def advance(self, request=None) -> list:
        """Generate the next chunk from its ``request`` (:class:`~worldtrace_cli.engine.feed.ChunkRequest`:
        its actions, camera or prompt; None: a rollout that feeds itself); returns the chunks decoded
        now, oldest first (without overlap, that chunk; with overlap, the one before it), their records
        finished and written.

        Raises:
            whatever the rollout raises (RunError: non-finite latents, a failed compile); the chunks
            decoded before the failure are still written first. KeyboardInterrupt passes at once.
        """
        try:
            if self.gate is not None:
                self.gate()
            out = self.last = self.rollout.step(request)
        except KeyboardInterrupt:  # a second Ctrl-C: abort now, without waiting for a decode
            raise
        except BaseException:
            self.drain()
            raise
        return self._finish([out] if self.decode is None else self.decode.submit(out))

    def flush(self) -> list:
        """Wait for every chunk still decoding; returns them, written."""
        return self._finish([] if self.decode is None else self.decode.flush())

    def _finish(self, ready: list) -> list:
        if not self.keep:
            return ready
        if self.sinks is not None:
            self.sinks.write(ready)
        else:
            for out in ready:
                self.tally.add(finish_record(out, self.plan, self.scorer, self.plan.frames_per_chunk))
        return ready

    def drain(self) -> None:
        """After a failure: write the chunks still decoding (a failure here is only logged)."""
        try:
            self.flush()
        except Exception as exc:
            log.warning(f"while writing the chunks before the failure: {exc}")

    def close(self, failing: bool = False) -> None:
        """Stop the decode worker and close the sinks (video, records, timeline); with ``failing``
        a closing error is logged, not raised (it must not hide the real one)."""
        if self.sinks is not None:
            self.sinks.close(self.decode, failing)
        elif self.decode is not None:
            self.decode.close()


__all__ = ["ChunkLoop", "finish_record"]
