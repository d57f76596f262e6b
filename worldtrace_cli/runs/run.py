"""The one run object: what ``worldtrace generate`` and a live :class:`~worldtrace_cli.session.Session`
both are.

A :class:`Run` owns a loaded pipeline's cache writer, its conditioning, the rollout, the streaming
decoder, the online metrics, what the run made (its chunk records, seconds per phase and memory
peaks: :class:`~worldtrace_cli.engine.tally.RunTally`, or the run folder's
:class:`~worldtrace_cli.runs.sinks.RunSinks` that also write them) and the one chunk loop
(:class:`~worldtrace_cli.engine.loop.ChunkLoop`) over them, and it writes its own ``summary.json``
document (:func:`~worldtrace_cli.runs.summary.run_summary`). Where a chunk's conditioning comes from
is the face's business: ``generate`` feeds a run from its trajectory
(:class:`~worldtrace_cli.engine.feed.ConditioningFeed` over the plan, laid out in advance) and adds its
policy around it (resume states, Ctrl-C, the video's frame check); a session feeds it from the caller,
chunk by chunk, over a plan that grows.
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("worldtrace")


class Run:
    """One run of one backbone through one writer, built in order: :meth:`condition`, :meth:`start`
    (the rollout), optionally :meth:`record_into` (a run folder's sinks), :meth:`open_loop`; then
    :meth:`advance` once per chunk, :meth:`close`, :meth:`summary`.

    Args:
        pipeline: a loaded :class:`~worldtrace_cli.engine.base.PipelineBase` serving ``cfg``.
        cfg: the run's :class:`~worldtrace_cli.config.RunConfig`.
        plan: its :class:`~worldtrace_cli.trajectory.ActionPlan` (a session's grows chunk by chunk;
            the same object throughout).
        seed: the resolved noise seed; image_label: what the run started from (an image path,
            ``world:N``, ``prompts``); world_seed: loopworld's world, or None.
        truth: ground-truth frames for the metrics (loopworld), or None (a session sets
            ``run.scorer.truth`` at its first chunk).
        command: the argv that started the run (default ``sys.argv``); started: ``time.time()`` at
            its start (default now), for the summary's ``wall`` seconds.
        prefix: a real video the run continues (:class:`~worldtrace_cli.continuation.Prefix`), or None:
            :meth:`condition` encodes its frames, :meth:`start` commits them as the first chunks, and
            the metrics score the chunks after it against its reference.
    Attributes:
        writer, decoder, scorer: the cache writer, streaming VAE decoder, OnlineMetrics (built here).
        conditioned: the backbone's prepared conditioning (:meth:`condition`); rollout, sinks, loop:
            None until :meth:`start`, :meth:`record_into`, :meth:`open_loop`.
        records: the finished chunk records (kept in place: a fork's list is its parent's copy);
        progress: ``{"totals", "peak"}`` (:func:`~worldtrace_cli.engine.tally.fresh_progress`; a
            resume restores it). cond_s: seconds spent conditioning. warnings: what the run told the
            user once (the summary's ``warnings``). resumed_by / resumed_at / account: a resumed
            run's argv and first chunk (None when not resumed), and whether the summary splits the wall clock into phases.
    """

    def __init__(self, pipeline, cfg, plan, *, seed: int, image_label: str, world_seed: int | None = None,
                 truth=None, command: list[str] | None = None, started: float | None = None, prefix=None):
        from ..engine.tally import fresh_progress
        from ..metrics import OnlineMetrics

        self.pipeline, self.cfg, self.plan = pipeline, cfg, plan
        self.seed, self.image_label, self.world_seed = seed, image_label, world_seed
        self.writer = pipeline.build_writer(cfg.memory)
        self.decoder = pipeline.decoder()
        self.prefix, self.prefix_latents = prefix, None
        self.scorer = OnlineMetrics(cfg.metrics, pipeline.world.clip if cfg.metrics == "all" else None, truth,
                                    None if prefix is None else prefix.reference,
                                    0 if prefix is None else prefix.plan.chunks, pipeline.preset.frames_per_chunk)
        self.conditioned, self.cond_s, self.warnings = None, 0.0, []
        self.rollout = self.sinks = self.loop = None
        self.records: list[dict] = []
        self.progress = fresh_progress()
        self.command = list(sys.argv) if command is None else list(command)
        self.started = time.time() if started is None else started
        self.resumed_by, self.resumed_at, self.account = None, None, False

    # -- building it -----------------------------------------------------------------------------
    def condition(self, conditioning) -> None:
        """Prepare the backbone's conditioning once (``pipeline.condition``, one signature for every
        backbone) from a :class:`~worldtrace_cli.engine.base.RunConditioning`; its seconds are
        counted in :attr:`cond_s`, a prompt past the text encoder's 512 tokens in :attr:`warnings`."""
        t0 = time.perf_counter()
        self.conditioned = self.pipeline.condition(conditioning)
        self._encode_prefix()
        self.cond_s += time.perf_counter() - t0

    def _encode_prefix(self) -> None:
        if self.prefix is not None and self.prefix_latents is None:  # committed by the rollout's first chunks
            self.prefix_latents = self.pipeline.encode_prefix(self.prefix.frames)
        self.warnings += [f"prompt {p[:40]!r}...: longer than the text encoder's 512 tokens, truncated to them "
                          f"(shorten it to keep all of it)" for p in getattr(self.conditioned, "truncated", None) or []]

    def feeds_itself(self) -> bool:
        """Whether the rollout takes the whole run's conditioning at once (LingBot-World's explicit
        poses) instead of a request per chunk."""
        return self.pipeline.feeds_itself(self.conditioned)

    def start(self) -> None:
        """Build the rollout of :attr:`seed` through the writer, measuring its attention per cache slot
        when ``cfg`` asks (``--attention-stats``). A backbone that :meth:`feeds_itself` gets the plan's
        keyboard / mouse rows now; every other is fed one :class:`~worldtrace_cli.engine.feed.ChunkRequest`
        per :meth:`advance`. Call :meth:`condition` first."""
        whole = self.feeds_itself()
        plan = self.plan
        self.rollout = self.pipeline.rollout(self.writer, self.conditioned,
                                             plan.keyboard[None] if whole else None,
                                             plan.mouse[None] if whole and plan.mouse is not None else None,
                                             self.seed)
        if self.cfg.attention_stats:
            self.rollout.measure_attention(self.cfg.attention_queries)
        self._encode_prefix()  # a session given a parent's conditioning encodes its own prefix here
        self.rollout.set_prefix(self.prefix_latents)

    def feed(self):
        """The :class:`~worldtrace_cli.engine.feed.ConditioningFeed` over :attr:`plan` (its chunks'
        action rows, the camera's poses, prompts; it reads rows appended later too), or None when the
        rollout feeds itself."""
        from ..engine.feed import ConditioningFeed

        return None if self.feeds_itself() else ConditioningFeed(self.plan, camera=self.pipeline.preset.backbone.camera)

    def record_into(self, folder, start: int = 0, show: bool = False) -> None:
        """Write the run into ``folder`` (a prepared :class:`~worldtrace_cli.runs.RunFolder`): video,
        ``chunks.jsonl``, the progress bar (``show``), ``cache_timeline.png`` at :meth:`close`.
        ``start``: the first chunk generated now (a resume's; its video goes to ``video.part.mp4``)."""
        from .sinks import RunSinks

        self.sinks = RunSinks(folder, self.cfg.preset, self.plan, self.scorer, self.records, self.progress, start,
                              show, self.writer.name)

    def open_loop(self, overlap: bool = False, gate=None) -> None:
        """Build the chunk loop over the rollout, decoder and sinks (after any decoder restore:
        :class:`~worldtrace_cli.engine.decode.DecodePipeline` reads the decoder's state when built).
        ``overlap``: decode one chunk behind generation; ``gate``: a sharded run's announcer."""
        from ..engine.loop import ChunkLoop

        self.loop = ChunkLoop(self.rollout, self.decoder, self.pipeline.device, self.scorer, self.plan,
                              overlap=overlap, sinks=self.sinks, records=self.records, progress=self.progress,
                              gate=gate)

    @property
    def run_dir(self):
        """The run folder's path (:meth:`record_into`), or None for a run that writes no folder."""
        return None if self.sinks is None else self.sinks.folder.path

    # -- running it ------------------------------------------------------------------------------
    def advance(self, request=None) -> list:
        """Generate the next chunk from ``request`` (None: a rollout that feeds itself); returns the
        chunks decoded now, written (:meth:`~worldtrace_cli.engine.loop.ChunkLoop.advance`)."""
        return self.loop.advance(request)

    def flush(self) -> list:
        """Wait for every chunk still decoding; returns them, written."""
        return self.loop.flush()

    @property
    def tally(self):
        """What the run made so far (records, seconds per phase, peaks)."""
        if self.loop is not None:
            return self.loop.tally
        if self.sinks is not None:
            return self.sinks
        from ..engine.tally import RunTally

        return RunTally(self.plan, self.records, self.progress, self.plan.frames_per_chunk)

    def close(self, failing: bool = False) -> None:
        """Close the chunk loop (or, before it was built, the sinks): decode worker, video, records,
        timeline. With ``failing`` a closing error is logged, not raised."""
        if self.loop is not None:
            self.loop.close(failing)
        elif self.sinks is not None:
            self.sinks.close(None, failing)

    # -- its state -------------------------------------------------------------------------------
    def parts(self) -> dict:
        """What a resume state or a saved session holds of the run: the writer's memory, the backbone's
        action caches, the decoder's causal cache, the metric accumulators (nested dicts of tensors)."""
        return {"writer": self.writer.state_dict(), "action_caches": self.rollout.state.state_dict(),
                "decoder": self.decoder.state(), "metrics": self.scorer.state_dict()}

    def load_parts(self, state: dict, next_chunk: int) -> None:
        """Load :meth:`parts` saved after ``next_chunk`` chunks into this run's fresh parts (the rollout
        built by :meth:`start`). Raises KeyError / ValueError / TypeError on a state that does not fit."""
        self.writer.load_state_dict(state["writer"])
        self.rollout.state.load_state_dict(state["action_caches"])
        self.decoder.load_state(state["decoder"])
        self.scorer.load_state_dict(state["metrics"])
        self.rollout.chunk = next_chunk

    def summary(self, status: str, warnings=()) -> dict:
        """The run's ``summary.json`` document with ``status`` (complete, stopped, failed, aborted):
        :func:`~worldtrace_cli.runs.summary.run_summary`; ``warnings`` are added after :attr:`warnings`."""
        from .summary import run_summary

        return run_summary(status, self, [*self.warnings, *warnings])


__all__ = ["Run"]
