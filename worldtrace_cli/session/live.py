"""The :class:`Session`: a live rollout driven chunk by chunk (the package's docstring says what it is)."""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import InputError, WorldtraceError
from .actions import ActionLog, parse_chunk_actions, replay_command, trajectory_text
from .parts import MemoTruth, StepResult, clone_tree
from .text import text_chunk

log = logging.getLogger("worldtrace")

SESSION_STATE_VERSION = 1
CONDITION_CHUNKS = 11  # 33 latent frames: the conditioning encodes its maximum, 31, once (causal: exact)


class Session:
    """A live rollout: actions in, decoded frames and chunk records out, one chunk per :meth:`step`.

    Build one with :func:`open` (or :meth:`load`). A session is the same
    :class:`~worldtrace_cli.runs.run.Run` as ``worldtrace generate``'s (writer, rollout, decoder,
    metrics, chunk loop, summary), fed by calls instead of a trajectory.
    Not thread-safe: one thread at a time (``worldtrace play`` steps each on one worker thread).

    Args:
        pipeline: a loaded :class:`~worldtrace_cli.engine.base.PipelineBase` serving ``cfg`` (of a
            backbone whose registry row says it runs live).
        cfg: the session's :class:`~worldtrace_cli.config.RunConfig` (its ``trajectory`` and
            ``output`` are the recording's; ``chunks`` is unused).
        record: a run folder to record into (video.mp4, chunks.jsonl, summary.json,
            trajectory.yaml, cache_timeline.png), or None.
    Attributes:
        chunk: chunks generated so far; actions: the :class:`~.actions.ActionLog` (its ``plan`` holds
            the rows); records: the chunks.jsonl records this object generated
            (a fork starts with its parent's; a loaded session with none); run: its
            :class:`~worldtrace_cli.runs.run.Run`; preset, pipeline, cfg.
    Raises:
        InputError: a backbone that does not run live (its registry row); OutputError / FolderBusy: the
            record folder cannot be used (see :meth:`~worldtrace_cli.runs.RunFolder.prepare`).
    """

    def __init__(self, pipeline, cfg, record: str | Path | None = None, prefix=None):
        if not cfg.preset.backbone.live:
            raise InputError(f"preset {cfg.preset.name}: {cfg.preset.backbone.title} does not run live yet; it runs "
                             f"with worldtrace generate")
        self.pipeline, self.cfg, self.preset = pipeline, cfg, cfg.preset
        self.takes_prompts = cfg.preset.backbone.takes_prompts
        self.preset_ref = cfg.preset.name  # how the replay command names the preset (open: a file's path)
        self.actions = ActionLog(self.preset.mode, self.preset.frames_per_chunk)
        self.plan = self.actions.plan
        self._last_record: dict | None = None
        self.truth_source = self.feed = self.folder = None
        if prefix is None and cfg.prefix is not None:  # a loaded session's prefix: read again from its clip
            from .storage import session_prefix

            prefix = session_prefix(cfg)
        self.prefix = prefix
        self.label = (str(cfg.image) if cfg.image else f"prefix:{cfg.prefix}" if prefix is not None else
                      "prompts" if self.takes_prompts else f"world:{cfg.world_seed}")
        self.run = None  # the whole Run, built at the first chunk (loopworld's start view waits for its first row)
        self.records: list[dict] = []  # the run's own list (a fork's starts as its parent's copy)
        self._stack, self._closed = ExitStack(), False
        self._made_folder = False  # the record folder did not exist before this session, which holds its lock
        if record is not None:
            from ..runs import RunFolder

            from .storage import check_record

            check_record(record)
            self.folder = RunFolder(Path(record).resolve())
            made = not self.folder.path.exists()
            try:
                self._stack.enter_context(self.folder.lock("session"))
                self._made_folder = made  # only a holder of the lock ever removes the folder
                # refused now, changed at the first step (RunFolder.prepare in _start): a session closed
                # before its first chunk leaves an old run, or no folder at all, as it found them
                self.folder.refuse_occupied(cfg.overwrite)
            except WorldtraceError as exc:  # the CLI's words, in the API's
                self._release_folder()
                message = str(exc).replace("(use --overwrite)", "(open it with overwrite=True)")
                raise type(exc)(message.replace("use --overwrite", "use overwrite=True")) from None
            except BaseException:
                self._release_folder()
                raise
            self.cfg = replace(cfg, output=self.folder.path, trajectory=self.folder.path / "trajectory.yaml")

    @property
    def chunk(self) -> int:
        """Chunks generated so far (the index of the next one)."""
        return self.plan.num_chunks

    def actions_taken(self) -> list:
        """Every chunk's actions so far as :meth:`step` takes them (``for a in s.actions_taken(): other.step(a)``)."""
        return self.actions.taken()

    def rows_next(self) -> int:
        """Pixel frames (action rows) the next chunk takes: 9 for chunk 0, 12 after (MG2)."""
        return self.actions.rows_next()

    # -- the chunk loop -------------------------------------------------------------------------
    def _start(self, conditioned=None, restored=None) -> None:
        """Build the session's whole :class:`~worldtrace_cli.runs.run.Run` at the first chunk: conditioned
        (or given a parent's ``conditioned``), its rollout, a ``restored`` state (a loaded or forked
        session), the record folder's sinks and its chunk loop (loopworld's start view waits for its
        first row)."""
        from ..engine.base import RunConditioning
        from ..runs.run import Run

        backbone, image, truth = self.preset.backbone, None, None
        if self.folder is not None:
            self.folder.prepare(self.cfg.overwrite)  # the first chunk: now the folder becomes this run's
        self.feed = self.pipeline.feed(self.plan, conditioned)  # each chunk's rows, poses or prompt
        if self.prefix is not None and self.cfg.image is None:
            from PIL import Image

            image = Image.fromarray(self.prefix.frames[0]) if backbone.start_image else None
        elif self.preset.has_world and self.cfg.image is None:
            from PIL import Image

            from ..world.truth import GroundTruth

            self.truth_source = truth = MemoTruth(GroundTruth(self.cfg.world_seed, self.plan, self.preset.height,
                                                               self.preset.width, self.preset.world, track=self.feed.track))
            image = Image.fromarray(truth.start_image())
        elif backbone.start_image:
            from ..trajectory.images import load_image

            image = load_image(self.cfg.image, (self.preset.height, self.preset.width))
        # the most a run reads (causal: the same first frames as generate's)
        conditioning = RunConditioning.of(self.cfg, CONDITION_CHUNKS, image=image) if conditioned is None else None
        self.run = Run(self.pipeline, self.cfg, self.plan, seed=self._seed(), image_label=self.label,
                       conditioning=conditioning, conditioned=conditioned, truth=truth,
                       world_seed=None if truth is None else self.cfg.world_seed, feed=self.feed, prefix=self.prefix,
                       restored=restored, records=self.records, folder=self.folder)

    @property
    def rollout(self):
        """The run's :class:`~worldtrace_cli.engine.rollout.ChunkRollout` (None before the first chunk)."""
        return None if self.run is None else self.run.rollout

    def _seed(self) -> int:
        return 0 if self.cfg.seed is None else int(self.cfg.seed)

    def step(self, actions="idle", prompt: str | None = None) -> StepResult:
        """Generate, decode and (when recording) write the next chunk.

        Args:
            actions: the chunk's actions in the trajectory format's words: ``"forward"``,
                ``"forward+camera_l"`` (macros of the preset's mode joined by ``+``; ``idle``), a dict
                ``{"keys": "WA", "mouse": [pitch, yaw]}`` (MG2's keyboard letters, mouse in [-1, 1]),
                or a list of those, one per pixel frame (:meth:`rows_next`: 9 for chunk 0, then 12).
            prompt: text-to-video presets: the chunk's prompt (also as ``step("a lighthouse")``); none
                goes on with the last one; a new one switches (re-cached as ``cfg.prompt_switch`` says).
        Returns:
            :class:`StepResult`: ``frames`` uint8 [T, H, W, 3] on the CPU and the chunk's record
            (the dict ``generate`` writes as a chunks.jsonl line: slots, virtual positions,
            events, ``timings_s`` in seconds, ``frames_sha256``, ``metrics`` with ``gt_psnr`` in dB on
            loopworld).
        Raises:
            InputError: bad actions (nothing generated). RunError: non-finite latents (the chunk is
                dropped; the session stays at the previous chunk). OutputError: the recording failed.
        """
        if self._closed:
            raise InputError("step: the session is closed")
        if prompt is not None and not self.takes_prompts:
            raise InputError(f"step: prompt= is for text-to-video presets (preset {self.preset.name} takes actions)")
        if prompt is not None and actions != "idle":  # a prompt word and a prompt: which one was meant?
            raise InputError(f"step: a text-to-video chunk takes one prompt: step(prompt={prompt[:30]!r}) or "
                             f"step({str(actions)[:30]!r}), not both")
        name, segments, per_row = (text_chunk(self.actions, actions, prompt) if self.takes_prompts else
                                   parse_chunk_actions(actions, self.preset.mode, self.rows_next()))
        self.actions.append(name, segments, per_row)
        try:
            if self.rollout is None:
                self._start()
            # generate's chunk loop, fed this chunk's rows, poses or prompt: decoded, record finished and written
            (out,) = self.run.advance(self.feed.request(self.chunk - 1))
        except BaseException:
            self.actions.drop_last()
            if self.feed is not None:
                self.feed.drop_after(self.plan.keyboard.shape[0] if self.plan.keyboard is not None else 0)
            raise
        if self.run.sinks is not None:
            self._write_trajectory()
        self._last_record = out.record
        return StepResult(out.frames.numpy(), out.record)

    # -- what a person looks at -----------------------------------------------------------------
    @property
    def cache(self) -> dict | None:
        """The KV cache as the latest chunk read it: its record's ``cache`` (``writer``, ``slots`` as runs
        with role, source latent frames, virtual positions, offsets, ``events``, ``kv_bytes``); None
        before the first chunk. What the next chunk reads is decided when it begins (the recent window has already
        moved at the last commit; retrieval writers pick their frames at ``begin_chunk``)."""
        return None if self._last_record is None else self._last_record["cache"]

    def truth(self, chunk: int | None = None) -> np.ndarray | None:
        """The true frames at the poses chunk ``chunk`` (default: the latest) showed, uint8
        [T, H, W, 3], rendered by the procedural world; None without ground truth (an ``--image``
        session, a checkpoint preset).

        Raises:
            InputError: no such chunk yet.
        """
        from ..trajectory.actions import chunk_rows

        c = self.chunk - 1 if chunk is None else chunk
        if not 0 <= c < self.chunk:
            raise InputError(f"truth: chunk {c} has not been generated (the session has {self.chunk})")
        if self.truth_source is None:
            return None
        return self.truth_source.frames(*chunk_rows(c, self.preset.frames_per_chunk))

    def trajectory_yaml(self) -> str:
        """The actions taken so far as a trajectory YAML that ``worldtrace generate`` replays to the
        same frames (:func:`~.actions.trajectory_text`; the replay command in its header)."""
        return trajectory_text(self.preset.mode, self._seed(), self.actions.segments, self.replay_command("trajectory.yaml"))

    def replay_command(self, trajectory: str) -> str:
        """The ``worldtrace generate`` command line that replays this session from ``trajectory``."""
        return replay_command(self.cfg, trajectory, self.preset_ref)

    def _write_trajectory(self) -> None:
        from ..outputs.files import atomic_path

        with atomic_path(self.folder.path / "trajectory.yaml") as tmp:
            Path(tmp).write_text(self.trajectory_yaml())

    # -- save, load, fork ------------------------------------------------------------------------
    def save(self, path: str | Path, overwrite: bool = False) -> Path:
        """Save the session (its resume state: writer, action caches, decoder, metrics, as
        ``generate``'s resume states; plus the actions so far) into folder ``path``
        (``state.json`` + ``state.safetensors``, written atomically). Returns the folder.

        ``path`` must be new or an empty folder. A folder holding a saved session (recognised by
        its own files: nothing but ``state.json``, ``state.safetensors`` and the
        ``.worldtrace-state`` mark, a session's state) is
        replaced only with ``overwrite=True``; anything else (a file, a link, a folder with other
        files, another kind of state) is refused and left as it is, and so are the scratch
        siblings ``path.tmp`` / ``path.old`` unless they are state folders.

        Raises:
            InputError: nothing generated yet, an empty path. OutputError: ``path`` (or a sibling)
                is not the session's to replace, holds a saved session and ``overwrite`` is False,
                or cannot be written.
        """
        from .storage import save_session_state

        if self.rollout is None:
            raise InputError("save: the session has no chunk yet; step first")
        meta = {"version": SESSION_STATE_VERSION, "config": self.cfg.to_dict(), "next_chunk": self.chunk,
                "segments": self.actions.segments, "chunk_actions": self.plan.chunk_actions, "last_record": self._last_record,
                "preset_ref": self.preset_ref}
        return save_session_state(path, meta, self.run.parts(), overwrite)

    @classmethod
    def load(cls, path: str | Path, pipeline=None) -> "Session":
        """A session restored from :meth:`save` (the same next frames as the saved one would give);
        it does not record (a run folder holds a whole run from chunk 0: replay the saved session's
        :meth:`trajectory_yaml` with ``generate`` for one).

        Args:
            pipeline: a loaded pipeline to reuse when it serves the saved config (else one loads).
        Raises:
            InputError: no or an unreadable state, another version, or a state that does not fit.
        """
        from ..config import RunConfig
        from ..engine.pipeline import Pipeline
        from ..runs.run import Restored
        from ..runs.state import load_state, unpack

        from .storage import check_path
        check_path(path, "load: path", "wt.load('saved/here')")
        meta, parts, tensors = load_state(path)
        if meta.get("version") != SESSION_STATE_VERSION or "segments" not in meta:
            raise InputError(f"{path}: not a worldtrace session state (version {meta.get('version')!r})")
        cfg = RunConfig.from_dict(meta["config"])
        if pipeline is None or not pipeline.serves(cfg):
            pipeline = Pipeline.from_config(cfg)
        session = cls(pipeline, cfg)
        session.preset_ref = meta.get("preset_ref", cfg.preset.name)
        def refuse(exc):
            session.close()
            return InputError(f"{path}: session state does not fit ({type(exc).__name__}: {exc})")

        try:
            state = {name: unpack(tree, tensors) for name, tree in parts.items()}
        except (KeyError, ValueError, TypeError) as exc:
            raise refuse(exc) from None
        session._replay_rows(meta["segments"], meta["chunk_actions"], Restored(state, len(meta["segments"]),
                                                                               refuse=refuse))
        session._last_record = meta["last_record"]
        return session

    def _replay_rows(self, segments: list[list[dict]], names: list[str], restored, conditioned=None) -> None:
        """Rebuild the plan from saved per-chunk segments (no generation), then the whole run from the
        ``restored`` state (:class:`~worldtrace_cli.runs.run.Restored`)."""
        for segs, name in zip(segments, names):
            self.actions.append_saved(segs, name)
        self._start(conditioned, restored)

    def fork(self) -> "Session":
        """An independent copy of this session at this chunk: the same model (shared, read-only),
        copies of the cache writer's memory, the action caches, the decoder's causal cache and the
        metric accumulators. Stepping one never changes the other (two futures from one moment).
        The fork does not record (its parent's run folder is the parent's).

        Raises:
            InputError: nothing generated yet, or a writer spilling to disk (``spill_dir``: the
                files cannot be shared).
        """
        if self.rollout is None:
            raise InputError("fork: the session has no chunk yet; step first")
        if self.cfg.memory.options.get("spill_dir"):
            raise InputError("fork: a writer spilling to disk (spill_dir) cannot be forked; open it without spill_dir")
        from ..runs.run import Restored

        twin = Session(self.pipeline, self.cfg, prefix=self.prefix)
        twin.preset_ref = self.preset_ref
        twin.records[:], twin._last_record = self.records, self._last_record  # its run appends to this copy
        twin._replay_rows(self.actions.segments, self.plan.chunk_actions,
                          Restored(clone_tree(self.run.parts()), self.chunk), self.run.conditioned)
        return twin

    # -- the end ---------------------------------------------------------------------------------
    def summary(self, status: str | None = None) -> dict:
        """The session as a ``summary.json`` document (schemas/summary.schema.json): with or without
        ``record=``, its ``totals`` count the chunks stepped so far (``run_dir`` is None without one).
        ``status``: None = what the session is: ``open`` (it can still step; the metrics cover the chunks
        so far), ``complete`` once :meth:`close` d.

        Raises:
            InputError: before the first :meth:`step` (there is no cache to describe yet).
        """
        if self.run is None:
            raise InputError("summary: the session has no chunk yet; step first")
        return self.run.summary(status or ("complete" if self._closed else "open"))

    def close(self) -> dict | None:
        """Finish the session: close the video and records, write ``summary.json`` (status
        ``complete``, every chunk generated so far) and ``trajectory.yaml``, release the folder.
        Idempotent. Returns the summary when recording, else None."""
        if self._closed:
            return None
        self._closed = True
        result = None
        try:
            if self.run is not None:
                self.run.close(failing=False)
            if self.run is not None and self.run.sinks is not None:
                from ..outputs.files import write_json_atomic

                result = self.summary("complete")
                write_json_atomic(self.folder.summary_path, result)
        finally:
            self._release_folder()
        return result

    def _release_folder(self) -> None:
        """Release the record folder's lock; a folder this session made and never wrote a chunk
        into (closed before its first step) is removed, so it leaves nothing behind."""
        if self.folder is None or not self._made_folder or (self.run is not None and self.run.sinks is not None):
            self._stack.close()
            return
        from ..runs.folder import LOCK

        try:
            (self.folder.path / LOCK).unlink(missing_ok=True)  # while still holding it
        except OSError:
            pass
        self._stack.close()
        try:
            self.folder.path.rmdir()  # only when empty: a file someone put there meanwhile stays
        except OSError:
            pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["CONDITION_CHUNKS", "SESSION_STATE_VERSION", "Session", "StepResult"]
