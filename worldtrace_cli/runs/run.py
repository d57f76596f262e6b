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


class Restored:
    """What a saved run continues from (a resume state, a saved or forked session): ``parts`` (the
    :meth:`Run.parts` dict), ``next_chunk``, and optionally the saved ``progress`` (``{"totals", "peak"}``),
    ``command`` (the argv that started the run) and ``refuse``: ``exc -> Exception``, the error a state
    that does not fit becomes (None: the KeyError / ValueError / TypeError itself)."""

    def __init__(self, parts: dict, next_chunk: int, progress: dict | None = None, command: list | None = None,
                 refuse=None):
        self.parts, self.next_chunk, self.progress, self.command = parts, int(next_chunk), progress, command
        self.refuse = refuse


class Run:
    """One run of one backbone through one writer, whole when constructed: conditioned, its rollout built,
    a saved state restored (``restored``), its run folder's sinks (``folder``) and its chunk loop
    open. Then :meth:`advance` once per chunk (fed by :attr:`feed`), :meth:`close`, :meth:`summary`.
    Nothing outside writes its fields; ``generate``, resumed runs, sessions (opened, loaded, forked)
    and ``bench speed`` are all built by this constructor.

    Args:
        pipeline: a loaded :class:`~worldtrace_cli.engine.base.PipelineBase` serving ``cfg``.
        cfg: the run's :class:`~worldtrace_cli.config.RunConfig`.
        plan: its :class:`~worldtrace_cli.trajectory.ActionPlan` (a session's grows chunk by chunk;
            the same object throughout).
        seed: the resolved noise seed; image_label: what the run started from (an image path,
            ``world:N``, ``prompts``); world_seed: loopworld's world, or None.
        conditioning: the :class:`~worldtrace_cli.engine.base.RunConditioning` to condition on
            (``pipeline.condition``, timed in :attr:`cond_s`), or ``conditioned``: a prepared one to share
            (a fork's parent's, ``bench speed``'s writers).
        truth: ground-truth frames for the metrics (loopworld), or None.
        feed: the run's :class:`~worldtrace_cli.engine.feed.ConditioningFeed` (default
            ``pipeline.feed(plan, conditioned)``; a session passes the one its ground truth reads poses from).
        prefix: a real video the run continues (:class:`~worldtrace_cli.continuation.Prefix`), or None:
            its frames are encoded and committed as the first chunks, and the metrics score the chunks
            after it against its reference.
        restored: a :class:`Restored` state to continue from (its parts loaded into the fresh parts
            before the loop is built: the decoder's state is read when the loop is), or None.
        records: the records so far (a resumed run's, cut back to its saved chunk; a fork's parent's).
        folder: a prepared :class:`~worldtrace_cli.runs.RunFolder` to write into (video, ``chunks.jsonl``,
            the bar with ``show``, ``cache_timeline.png`` at :meth:`close`), or None; start: the first chunk
            generated now (a resume's: its video goes to ``video.part.mp4``).
        overlap: decode one chunk behind generation; gate: a sharded run's announcer.
        decode, keep: ``bench speed``'s sinks off (no decode; records not finished nor kept).
        warnings: what the run told the user already; command: the argv that started it (default
            ``sys.argv``, a restored state's own); started: ``time.time()`` at its start (default now);
            resumed_by: a resumed run's argv; account: whether the summary splits the wall clock into phases.
        on_conditioned: called once the conditioning is ready, before the rollout is built (``generate``
            resets the CUDA peak there, so the chunks' peaks leave the encoders out), or None.
    Attributes:
        writer, decoder, scorer, conditioned, rollout, feed, sinks (None without a folder), loop,
        records, progress (:func:`~worldtrace_cli.engine.tally.fresh_progress`, or the restored one),
        cond_s, warnings (+ a prompt cut to the encoder's 512 tokens), resumed_by, resumed_at (the restored
        chunk, else None), account, command, started.
    Raises:
        InputError: what ``pipeline.condition`` refuses. KeyError / ValueError / TypeError: a restored
            state that does not fit (nothing is left open).
    """

    def __init__(self, pipeline, cfg, plan, *, seed: int, image_label: str, conditioning=None, conditioned=None,
                 world_seed: int | None = None, truth=None, feed=None, prefix=None, restored: Restored | None = None,
                 records: list | None = None, folder=None, start: int = 0, show: bool = False, overlap: bool = False,
                 gate=None, decode: bool = True, keep: bool = True, warnings=(), command: list[str] | None = None,
                 started: float | None = None, resumed_by: list | None = None, account: bool = False,
                 on_conditioned=None):
        from ..engine.loop import ChunkLoop
        from ..engine.tally import fresh_progress
        from ..metrics import OnlineMetrics

        self.pipeline, self.cfg, self.plan = pipeline, cfg, plan
        self.seed, self.image_label, self.world_seed = seed, image_label, world_seed
        self.writer = pipeline.build_writer(cfg.memory)
        self.decoder = pipeline.decoder() if decode else None
        self.prefix = prefix
        self.scorer = OnlineMetrics(cfg.metrics, pipeline.world.clip if cfg.metrics == "all" else None, truth,
                                    None if prefix is None else prefix.reference,
                                    0 if prefix is None else prefix.plan.chunks, pipeline.preset.frames_per_chunk)
        self.warnings, self.cond_s = list(warnings), 0.0
        t0 = time.perf_counter()
        self.conditioned = pipeline.condition(conditioning) if conditioned is None else conditioned
        prefix_latents = None if prefix is None else pipeline.encode_prefix(prefix.frames)
        if conditioned is None:
            self.cond_s = time.perf_counter() - t0
        if on_conditioned is not None:
            on_conditioned()
        self.warnings += [f"prompt {p[:40]!r}...: longer than the text encoder's 512 tokens, truncated to them "
                          f"(shorten it to keep all of it)" for p in getattr(self.conditioned, "truncated", None) or []]
        self.feed = pipeline.feed(plan, self.conditioned) if feed is None else feed
        # fed by its feed, one request per chunk; rows: a camera track's length (explicit poses)
        self.rollout = pipeline.rollout(self.writer, self.conditioned, seed=seed, rows=plan.num_frames)
        if cfg.attention_stats:
            self.rollout.measure_attention(cfg.attention_queries)
        self.rollout.set_prefix(prefix_latents)
        self.records: list[dict] = [] if records is None else records
        self.progress = fresh_progress()
        self.command = list(sys.argv) if command is None else list(command)
        self.resumed_at = None
        if restored is not None:
            self._restore(restored)
        self.started = time.time() if started is None else started
        self.resumed_by, self.account = resumed_by, account
        self.sinks = None
        if folder is not None:
            from .sinks import RunSinks

            self.sinks = RunSinks(folder, cfg.preset, plan, self.scorer, self.records, self.progress, start, show,
                                  self.writer.name)
        # after any decoder restore: DecodePipeline reads the decoder's state when built
        self.loop = ChunkLoop(self.rollout, self.decoder, pipeline.device, self.scorer, plan, overlap=overlap,
                              sinks=self.sinks, records=self.records, progress=self.progress, gate=gate, keep=keep)

    def _restore(self, restored: Restored) -> None:
        state = restored.parts
        try:
            self.writer.load_state_dict(state["writer"])
            self.rollout.restore(state["action_caches"], restored.next_chunk)
            self.decoder.load_state(state["decoder"])
            self.scorer.load_state_dict(state["metrics"])
        except (KeyError, ValueError, TypeError) as exc:
            if restored.refuse is None:
                raise
            raise restored.refuse(exc) from None
        if restored.progress is not None:
            self.progress = restored.progress
        self.command = list(restored.command or []) or self.command
        self.resumed_at = restored.next_chunk

    @property
    def run_dir(self):
        """The run folder's path (``folder``), or None for a run that writes no folder."""
        return None if self.sinks is None else self.sinks.folder.path

    # -- running it ------------------------------------------------------------------------------
    def advance(self, request=None) -> list:
        """Generate the next chunk from ``request`` (None: :attr:`feed`'s request for it); returns the
        chunks decoded now, written (:meth:`~worldtrace_cli.engine.loop.ChunkLoop.advance`)."""
        return self.loop.advance(self.feed.request(self.rollout.chunk) if request is None else request)

    def flush(self) -> list:
        """Wait for every chunk still decoding; returns them, written."""
        return self.loop.flush()

    @property
    def tally(self):
        """What the run made so far (records, seconds per phase, peaks)."""
        return self.loop.tally

    def close(self, failing: bool = False) -> None:
        """Close the chunk loop: decode worker, video, records, timeline. With ``failing`` a closing
        error is logged, not raised."""
        self.loop.close(failing)

    # -- its state -------------------------------------------------------------------------------
    def parts(self) -> dict:
        """What a resume state or a saved session holds of the run: the writer's memory, the backbone's
        action caches, the decoder's causal cache, the metric accumulators (nested dicts of tensors);
        a :class:`Restored` of them continues it."""
        return {"writer": self.writer.state_dict(), "action_caches": self.rollout.state.state_dict(),
                "decoder": self.decoder.state(), "metrics": self.scorer.state_dict()}

    def summary(self, status: str, warnings=()) -> dict:
        """The run's ``summary.json`` document with ``status`` (complete, stopped, failed, aborted):
        :func:`~worldtrace_cli.runs.summary.run_summary`; ``warnings`` are added after :attr:`warnings`."""
        from .summary import run_summary

        return run_summary(status, self, [*self.warnings, *warnings])


__all__ = ["Restored", "Run"]
