"""Live sessions: a world model driven one chunk at a time from Python (``worldtrace play`` too).

A :class:`Session` is the library face of ``worldtrace generate``: the same pipeline, cache writer,
:class:`~worldtrace_cli.rollout.Rollout`, :class:`~worldtrace_cli.rollout.DecodePipeline`, metrics
and run-folder sinks, but the actions arrive chunk by chunk instead of from a trajectory file::

    import worldtrace_cli as wt
    s = wt.open("loopworld", cache="landmark", record="runs/live")
    frames, record = s.step("forward")          # uint8 [9, 96, 176, 3] and its chunks.jsonl record
    frames, record = s.step("forward+camera_l")  # uint8 [12, 96, 176, 3]
    s.close()                                    # runs/live: video.mp4, chunks.jsonl, summary.json, trajectory.yaml

For the same actions, seed and world a session decodes the frames ``generate`` decodes (the same
``frames_sha256`` chunk for chunk): chunk c reads only the action rows up to its own (MG2 spec §11),
the start image's conditioning latents are causal in the frame count (encoded once for the
longest rollout, 31 latent frames), and noise depends only on (seed, chunk). The trajectory a
session wrote (``trajectory.yaml``) replays it with ``worldtrace generate``.

Only MG2-architecture presets (loopworld, tiny*, mg2-*) run as sessions; LingBot-World runs through
``generate``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .errors import InputError, TrajectoryError

log = logging.getLogger("worldtrace")

SESSION_STATE_VERSION = 1
CONDITION_CHUNKS = 11  # 33 latent frames: the conditioning encodes its maximum, 31, once (causal: exact)


@dataclass
class StepResult:
    """One chunk of a session: ``frames`` uint8 [T, H, W, 3] (T = 9 for chunk 0, 12 after, MG2's
    pixel frames), ``record`` the chunk's ``chunks.jsonl`` record (dict). Unpacks as
    ``frames, record = session.step(...)``."""

    frames: np.ndarray
    record: dict

    def __iter__(self):
        return iter((self.frames, self.record))


def _rows_of(actions, mode: str, rows: int) -> tuple[str, list[dict], list[tuple]]:
    """Parse one chunk's actions with the trajectory parser (:func:`~worldtrace_cli.trajectory.parse_trajectory`).

    Args:
        actions: action words (``"forward"``, ``"forward+camera_l"``: macros joined by ``+``), a dict
            ``{"keys": "WA" | ["W", "A"], "mouse": [pitch, yaw]}``, or a list of ``rows`` of those
            (one per pixel frame).
        mode: the preset's action mode; rows: pixel frames of the chunk (9 for chunk 0, else 12).
    Returns:
        (display name joined by ``>``, trajectory segments as YAML dicts with ``frames``,
        per-row ``(keyboard tuple, mouse tuple | None)``).
    Raises:
        InputError: the actions' one-line problem (an unknown word, contradicting keys, a list of
            the wrong length).
    """
    from .trajectory import parse_trajectory

    if isinstance(actions, (list, tuple)):
        if len(actions) != rows:
            raise InputError(f"step: a list of actions gives one per pixel frame: this chunk has {rows}, "
                             f"got {len(actions)}")
        items = list(actions)
    else:
        items = [actions]
    segments: list[dict] = []
    for item in items:
        if isinstance(item, str):
            seg = {"action": item}
        elif isinstance(item, dict) and set(item) <= {"keys", "mouse"} and item:
            keys = item.get("keys", [])
            seg = {"keys": list(keys) if isinstance(keys, str) else keys} if "keys" in item else {}
            if "mouse" in item:
                seg["mouse"] = item["mouse"]
        else:
            raise InputError(f"step: actions must be action words (e.g. 'forward+camera_l'), a dict with keys/mouse, "
                             f"or a list of them per pixel frame; got {str(item)[:80]!r}")
        if segments and segments[-1]["seg"] == seg:
            segments[-1]["frames"] += 1 if len(items) > 1 else 0
        else:
            segments.append({"seg": seg, "frames": 1 if len(items) > 1 else rows})
    doc = {"mode": mode, "segments": [{**s["seg"], "frames": s["frames"]} for s in segments]}
    try:
        traj = parse_trajectory(json.dumps(doc), source="step")
    except TrajectoryError as exc:  # "step:1: segments[0].action: problem" -> "step: actions: problem"
        message = str(exc).split(": ", 2)[-1]
        raise InputError(f"step: actions {str(actions)[:80]!r}: {message}") from None
    per_row: list[tuple] = []
    names: list[str] = []
    for seg in traj.segments:
        per_row += [(seg.keyboard, seg.mouse)] * seg.num_frames
        if not names or names[-1] != seg.action:
            names.append(seg.action)
    return ">".join(names), doc["segments"], per_row


def _merge_segments(chunks: list[list[dict]]) -> list[dict]:
    """Trajectory segments of every chunk so far, neighbours with the same action merged."""
    out: list[dict] = []
    for segs in chunks:
        for seg in segs:
            body = {k: v for k, v in seg.items() if k != "frames"}
            if out and {k: v for k, v in out[-1].items() if k != "frames"} == body:
                out[-1]["frames"] += seg["frames"]
            else:
                out.append(dict(seg))
    return out


def _clone_tree(parts: dict) -> dict:
    """An independent copy of nested state dicts (every tensor cloned on its device), through the
    resume state's own packing (:func:`~worldtrace_cli.state.pack`), so a fork copies exactly what a
    save would."""
    from .state import pack, unpack

    tensors: dict = {}
    tree = {name: pack(value, tensors, prefix=f"{name}.") for name, value in parts.items()}
    cloned = {k: v.clone() for k, v in tensors.items() if isinstance(k, str)}
    return {name: unpack(t, cloned) for name, t in tree.items()}


class _MemoTruth:
    """A :class:`~worldtrace_cli.world.truth.GroundTruth` whose latest rendered frame range is kept, so
    the metrics and :meth:`Session.truth` render a chunk's true frames once (attributes delegate)."""

    def __init__(self, truth):
        self._truth, self._last = truth, (None, None)

    def __getattr__(self, name):
        return getattr(self._truth, name)

    def __setattr__(self, name, value):
        if name in ("_truth", "_last"):
            object.__setattr__(self, name, value)
        else:  # poses, as the session grows them
            setattr(self._truth, name, value)
            object.__setattr__(self, "_last", (None, None))

    def frames(self, start: int, end: int):
        """uint8 [end - start, H, W, 3]: the true pixel frames ``start .. end - 1`` (the last range kept)."""
        if self._last[0] != (start, end):
            self._last = ((start, end), self._truth.frames(start, end))
        return self._last[1]


class Session:
    """A live rollout: actions in, decoded frames and chunk records out, one chunk per :meth:`step`.

    Build one with :func:`open` (or :meth:`load`); every chunk goes through the same code as
    ``worldtrace generate`` (Rollout, DecodePipeline, :func:`~worldtrace_cli.jobs.sinks.finish_record`).
    Not thread-safe: call it from one thread at a time (``worldtrace play`` runs each session's
    steps on one worker thread).

    Args:
        pipeline: a loaded MG2 :class:`~worldtrace_cli.runtime.PipelineBase` serving ``cfg``.
        cfg: the session's :class:`~worldtrace_cli.config.RunConfig` (its ``trajectory`` and
            ``output`` are the recording's; ``chunks`` is unused).
        record: a run folder to record into (video.mp4, chunks.jsonl, summary.json,
            trajectory.yaml, cache_timeline.png), or None.
    Attributes:
        chunk: chunks generated so far; records: the chunks.jsonl records this object generated
            (a fork starts with its parent's; a loaded session with none); preset, pipeline, cfg.
    Raises:
        InputError: a LingBot-World preset (sessions run MG2 models); OutputError / FolderBusy: the
            record folder cannot be used (see :meth:`~worldtrace_cli.runs.RunFolder.prepare`).
    """

    def __init__(self, pipeline, cfg, record: str | Path | None = None):
        from .actions import ActionPlan, MODES
        from .metrics import OnlineMetrics

        if cfg.preset.is_lingbot:
            raise InputError(f"preset {cfg.preset.name}: sessions run MG2-architecture models; LingBot-World runs "
                             f"with worldtrace generate")
        self.pipeline, self.cfg, self.preset = pipeline, cfg, cfg.preset
        self.spec = MODES[self.preset.mode]
        self.writer = pipeline.build_writer(cfg.memory)
        self.plan = ActionPlan(self.preset.mode, 0, self._empty_keyboard(), self._empty_mouse(), [], [], [],
                               self.preset.frames_per_chunk)
        self._segments: list[list[dict]] = []
        self.records: list[dict] = []
        self._last_record: dict | None = None
        self.rollout = self.truth_source = self._conditioned = None
        self.decoder = pipeline.decoder()
        self.scorer = OnlineMetrics(cfg.metrics, pipeline.world.clip if cfg.metrics == "all" else None, None)
        self._loop = None
        self._stack = ExitStack()
        self.folder = self._sinks = None
        self._started = time.time()
        self._closed = False
        self._progress = {"totals": {}, "peak": {"rss_bytes": 0, "gpu_peak_bytes": 0}}
        if record is not None:
            from .runs import RunFolder

            self.folder = RunFolder(Path(record).resolve())
            self._stack.enter_context(self.folder.lock("session"))
            try:
                self.folder.prepare(cfg.overwrite)
            except BaseException:
                self._stack.close()
                raise
            self.cfg = cfg = replace(cfg, output=self.folder.path, trajectory=self.folder.path / "trajectory.yaml")

    # -- actions --------------------------------------------------------------------------------
    def _empty_keyboard(self):
        import torch

        return torch.zeros(0, self.spec.keyboard_dim, dtype=torch.float32)

    def _empty_mouse(self):
        import torch

        return torch.zeros(0, 2, dtype=torch.float32) if self.spec.mouse else None

    def _append(self, name: str, segments: list[dict], per_row: list[tuple]) -> None:
        """Add one chunk's action rows to the plan (keyboard [R, kd], mouse [R, 2] float32)."""
        import torch

        kb = torch.tensor([k for k, _ in per_row], dtype=torch.float32)
        self.plan.keyboard = torch.cat([self.plan.keyboard, kb])
        if self.plan.mouse is not None:
            self.plan.mouse = torch.cat([self.plan.mouse, torch.tensor([m for _, m in per_row], dtype=torch.float32)])
        self.plan.num_chunks += 1
        self.plan.chunk_actions.append(name)
        self._segments.append(segments)

    def _drop_last(self) -> None:
        """Undo :meth:`_append` (a chunk that failed is not part of the session)."""
        from .actions import frames_for_chunks

        self.plan.num_chunks -= 1
        rows = frames_for_chunks(self.plan.num_chunks, self.plan.frames_per_chunk) if self.plan.num_chunks else 0
        self.plan.keyboard = self.plan.keyboard[:rows]
        if self.plan.mouse is not None:
            self.plan.mouse = self.plan.mouse[:rows]
        self.plan.chunk_actions.pop()
        self._segments.pop()

    @property
    def chunk(self) -> int:
        """Chunks generated so far (the index of the next one)."""
        return self.plan.num_chunks

    def actions_taken(self) -> list:
        """The actions of every chunk so far, each as :meth:`step` takes it (action words, or a list
        of one entry per pixel frame), so ``for a in s.actions_taken(): other.step(a)`` replays them."""
        out = []
        for segs in self._segments:
            if len(segs) == 1 and "action" in segs[0]:
                out.append(segs[0]["action"])
                continue
            rows = []
            for seg in segs:
                body = seg["action"] if "action" in seg else {k: v for k, v in seg.items() if k != "frames"}
                rows += [body] * seg["frames"]
            out.append(rows)
        return out

    def rows_next(self) -> int:
        """Pixel frames (action rows) the next chunk takes: 9 for chunk 0, 12 after (MG2)."""
        from .actions import chunk_rows

        start, end = chunk_rows(self.chunk, self.preset.frames_per_chunk)
        return end - start

    # -- the chunk loop -------------------------------------------------------------------------
    def _start(self) -> None:
        """Condition and build the rollout at the first chunk (loopworld's start view is the pose
        after the first action row, so it waits for that row)."""
        from .engine.loop import ChunkLoop
        from .jobs.sinks import RunSinks

        if self.preset.has_world and self.cfg.image is None:
            from PIL import Image

            from .world.truth import GroundTruth

            self.truth_source = _MemoTruth(GroundTruth(self.cfg.world_seed, self.plan, self.preset.height,
                                                       self.preset.width))
            self.scorer.truth = self.truth_source
            image = Image.fromarray(self.truth_source.start_image())
        else:
            from .model.conditioning import load_image

            image = load_image(self.cfg.image, (self.preset.height, self.preset.width))
        if self._conditioned is None:
            self._conditioned = self.pipeline.condition(image, CONDITION_CHUNKS)
        self.rollout = self.pipeline.rollout(self.writer, self._conditioned, self.plan.keyboard[None],
                                             None if self.plan.mouse is None else self.plan.mouse[None],
                                             self._seed())
        if self.folder is not None:
            self._sinks = RunSinks(self.folder, self.preset, self.plan, self.scorer, self.records, self._progress,
                                   0, False, self.writer.name)
        self._loop = ChunkLoop(self.rollout, self.decoder, self.pipeline.device, self.scorer, self.plan,
                               overlap=False, sinks=self._sinks, records=self.records)

    def _seed(self) -> int:
        return 0 if self.cfg.seed is None else int(self.cfg.seed)

    def _feed_actions(self) -> None:
        """Hand the rollout and writer the action rows and poses of every chunk so far."""
        dev, dt = self.pipeline.device, self.pipeline.dtype
        kb = self.plan.keyboard[None]
        mouse = None if self.plan.mouse is None else self.plan.mouse[None]
        self.rollout.keyboard = kb.to(dev, dt)
        self.rollout.mouse = None if mouse is None else mouse.to(dev, dt)
        self.writer.set_poses(self.pipeline.latent_poses(kb, mouse))
        if self.truth_source is not None:
            from .world.motion import plan_frame_poses

            self.truth_source.poses = plan_frame_poses(self.plan).numpy()

    def step(self, actions="idle") -> StepResult:
        """Generate, decode and (when recording) write the next chunk.

        Args:
            actions: the chunk's actions in the trajectory format's words: ``"forward"``,
                ``"forward+camera_l"`` (macros of the preset's mode joined by ``+``; ``idle``), a dict
                ``{"keys": "WA", "mouse": [pitch, yaw]}`` (MG2's keyboard letters, mouse in [-1, 1]),
                or a list of those, one per pixel frame (:meth:`rows_next`: 9 for chunk 0, then 12).
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
        name, segments, per_row = _rows_of(actions, self.preset.mode, self.rows_next())
        self._append(name, segments, per_row)
        try:
            if self.rollout is None:
                self._start()
            self._feed_actions()
            (out,) = self._loop.advance()  # generate's chunk loop: decoded, record finished and written
        except BaseException:
            self._drop_last()
            raise
        if self._sinks is not None:
            self._write_trajectory()
        self._last_record = out.record
        return StepResult(out.frames.numpy(), out.record)

    # -- what a person looks at -----------------------------------------------------------------
    @property
    def cache(self) -> dict | None:
        """The KV cache as the latest chunk read it: its record's ``cache`` (``writer``, ``slots``
        as runs with role (recent | summary), source latent frames, virtual positions and offsets,
        ``events`` such as landmark detections and retrievals, ``kv_bytes``); None before the first
        chunk. The next chunk's slots exist only once it begins (writers evict at ``begin_chunk``)."""
        return None if self._last_record is None else self._last_record["cache"]

    def truth(self, chunk: int | None = None) -> np.ndarray | None:
        """The true frames at the poses chunk ``chunk`` (default: the latest) showed, uint8
        [T, H, W, 3], rendered by the procedural world; None without ground truth (an ``--image``
        session, a checkpoint preset).

        Raises:
            InputError: no such chunk yet.
        """
        from .actions import chunk_rows

        c = self.chunk - 1 if chunk is None else chunk
        if not 0 <= c < self.chunk:
            raise InputError(f"truth: chunk {c} has not been generated (the session has {self.chunk})")
        if self.truth_source is None:
            return None
        return self.truth_source.frames(*chunk_rows(c, self.preset.frames_per_chunk))

    def trajectory_yaml(self) -> str:
        """The actions taken so far as a trajectory YAML that ``worldtrace generate`` replays to the
        same frames (with the preset, writer, world seed and seed named in its header comment)."""
        import yaml

        replay = self.replay_command("trajectory.yaml")
        head = (f"# Recorded by a worldtrace session: {self.chunk} chunks.\n# Replay: {replay}\n"
                f"mode: {self.preset.mode}\nseed: {self._seed()}\n")
        if not self._segments:
            return head + "segments: []\n"
        return head + yaml.safe_dump({"segments": _merge_segments(self._segments)}, sort_keys=False,
                                     default_flow_style=None)

    def replay_command(self, trajectory: str) -> str:
        """The ``worldtrace generate`` command line that replays this session from ``trajectory``."""
        m, cfg = self.cfg.memory, self.cfg
        words = ["worldtrace generate", trajectory, "--preset", self.preset.name, "--cache", m.cache]
        if cfg.checkpoint is not None:
            words += ["--checkpoint", str(cfg.checkpoint)]
        if cfg.random_weights:
            words += ["--random-weights", "--weights-seed", str(cfg.weights_seed)]
        if cfg.image is not None:
            words += ["--image", str(cfg.image)]
        elif self.preset.has_world:
            words += ["--world-seed", str(cfg.world_seed)]
        if m.budget is not None:
            words += ["--budget", str(m.budget)]
        return " ".join(words)

    def _write_trajectory(self) -> None:
        from .files import atomic_path

        with atomic_path(self.folder.path / "trajectory.yaml") as tmp:
            Path(tmp).write_text(self.trajectory_yaml())

    # -- save, load, fork ------------------------------------------------------------------------
    def _parts(self) -> dict:
        return {"writer": self.writer.state_dict(), "action_caches": self.rollout.state.state_dict(),
                "decoder": self.decoder.state(), "metrics": self.scorer.state_dict()}

    def save(self, path: str | Path) -> Path:
        """Save the session (its resume state: writer, action caches, decoder, metrics, as
        ``generate``'s resume states; plus the actions so far) into folder ``path``
        (``state.json`` + ``state.safetensors``, written atomically). Returns the folder.

        Raises:
            InputError: nothing generated yet. OutputError: the folder cannot be written.
        """
        from .state import save_state

        if self.rollout is None:
            raise InputError("save: the session has no chunk yet; step first")
        meta = {"version": SESSION_STATE_VERSION, "config": self.cfg.to_dict(), "next_chunk": self.chunk,
                "segments": self._segments, "chunk_actions": self.plan.chunk_actions, "last_record": self._last_record}
        save_state(path, meta, self._parts())
        return Path(path)

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
        from .config import RunConfig
        from .pipeline import Pipeline
        from .state import load_state, unpack

        meta, parts, tensors = load_state(path)
        if meta.get("version") != SESSION_STATE_VERSION or "segments" not in meta:
            raise InputError(f"{path}: not a worldtrace session state (version {meta.get('version')!r})")
        cfg = RunConfig.from_dict(meta["config"])
        if pipeline is None or not pipeline.serves(cfg):
            pipeline = Pipeline.from_config(cfg)
        session = cls(pipeline, cfg)
        session._replay_rows(meta["segments"], meta["chunk_actions"])
        try:
            state = {name: unpack(tree, tensors) for name, tree in parts.items()}
            session._load_parts(state)
        except (KeyError, ValueError, TypeError) as exc:
            session.close()
            raise InputError(f"{path}: session state does not fit ({type(exc).__name__}: {exc})") from None
        session._last_record = meta["last_record"]
        return session

    def _replay_rows(self, segments: list[list[dict]], names: list[str]) -> None:
        """Rebuild the plan from saved per-chunk segments (no generation), then the rollout."""
        for segs, name in zip(segments, names):
            doc = {"mode": self.preset.mode, "segments": segs}
            from .trajectory import parse_trajectory

            traj = parse_trajectory(json.dumps(doc), source="session state")
            rows = [(s.keyboard, s.mouse) for s in traj.segments for _ in range(s.num_frames)]
            self._append(name, segs, rows)
        self._start()
        self._feed_actions()

    def _load_parts(self, state: dict) -> None:
        self.writer.load_state_dict(state["writer"])
        self.rollout.state.load_state_dict(state["action_caches"])
        self.decoder.load_state(state["decoder"])
        self.scorer.load_state_dict(state["metrics"])
        self.rollout.chunk = self.plan.num_chunks

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
        if self.cfg.memory.spill_dir:
            raise InputError("fork: a writer spilling to disk (spill_dir) cannot be forked; open it without spill_dir")
        twin = Session(self.pipeline, self.cfg)
        twin._conditioned = self._conditioned
        twin._replay_rows(self._segments, self.plan.chunk_actions)
        twin._load_parts(_clone_tree(self._parts()))
        twin.records, twin._last_record = list(self.records), self._last_record
        return twin

    # -- the end ---------------------------------------------------------------------------------
    def summary(self, status: str = "complete") -> dict:
        """The session as a ``summary.json`` document (schemas/summary.schema.json)."""
        from .runs.summary import run_summary

        return run_summary(status, self.cfg, self.folder.path if self.folder else None, list(sys.argv), None,
                           self.pipeline, self.writer, self.rollout, self.scorer, self.plan, self._sinks,
                           self._started, image_label=str(self.cfg.image) if self.cfg.image else
                           f"world:{self.cfg.world_seed}", seed=self._seed(),
                           world_seed=None if self.truth_source is None else self.cfg.world_seed)

    def close(self) -> dict | None:
        """Finish the session: close the video and records, write ``summary.json`` (status
        ``complete``, every chunk generated so far) and ``trajectory.yaml``, release the folder.
        Idempotent. Returns the summary when recording, else None."""
        if self._closed:
            return None
        self._closed = True
        result = None
        try:
            if self._loop is not None:
                self._loop.close(failing=False)
            if self._sinks is not None:
                from .files import write_json_atomic

                result = self.summary("complete")
                write_json_atomic(self.folder.summary_path, result)
        finally:
            self._stack.close()
        return result

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open(preset: str = "loopworld", cache: str | None = None, *, checkpoint: str | Path | None = None,
         image: str | Path | None = None, world_seed: int = 0, seed: int = 0, device: str = "auto",
         dtype: str = "auto", compile: str = "none", rope_precision: str = "float32", metrics: str = "fast",
         random_weights: bool = False, weights_seed: int = 0, record: str | Path | None = None,
         overwrite: bool = False, pipeline=None, **writer_options) -> Session:
    """Open a live :class:`Session` (``import worldtrace_cli as wt; s = wt.open("loopworld", cache="landmark")``).

    Args:
        preset: a preset name (``worldtrace presets``) or YAML file; MG2 architecture.
        cache: the writer spec as ``--cache`` takes it (``sliding``, ``field``, ``landmark``,
            ``mixed:2``, ...); None = the model's own cache.
        checkpoint: the official MG2 folder (mg2-* presets). image: a conditioning image (loopworld
            uses its world's start view, with ground truth, unless given). world_seed: loopworld's
            world. seed: the noise seed (chunk c draws from (seed, c)).
        device, dtype, compile, rope_precision: as ``generate``'s flags. metrics: ``none`` | ``fast`` | ``all``.
        record: a run folder to record into (refused when it holds a run, unless ``overwrite``).
        pipeline: a loaded pipeline to share (``worldtrace play`` shares one between sessions).
        writer_options: ``generate``'s memory flags as keywords: ``budget``, ``summary_slots``,
            ``recent_slots``, ``landmark_threshold``, ``positions``, ``sink_frames``, ``top_k``, ...
    Raises:
        InputError: an unknown preset, writer or option, a bad image, a LingBot preset.
        CheckpointError: missing checkpoint files. OutputError / FolderBusy: the record folder.
    """
    from .config import RunConfig, default_cache, load_preset, memory_config
    from .jobs.inputs import check_image, check_writers
    from .pipeline import Pipeline

    resolved = load_preset(preset) if isinstance(preset, (str, Path)) else preset
    if resolved.is_lingbot:
        raise InputError(f"preset {resolved.name}: sessions run MG2-architecture models; LingBot-World runs with "
                         f"worldtrace generate")
    options = {**default_cache(resolved), **writer_options} if cache is None else {"cache": cache, **writer_options}
    try:
        memory = memory_config(preset=resolved, **options)
    except TypeError:
        known = ", ".join(sorted(f for f in memory_config.__code__.co_varnames if f not in ("cache", "preset")))
        raise InputError(f"open: unknown writer option among {sorted(writer_options)} (known: {known})") from None
    for name, value in (("seed", seed), ("world_seed", world_seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"open: {name} must be an integer >= 0, got {value!r}")
    if image is not None:
        check_image(image, resolved.height, resolved.width)
    elif not resolved.has_world:
        raise InputError(f"preset {resolved.name}: needs a conditioning image: open(..., image=PATH)")
    check_writers([memory], resolved)
    cfg = RunConfig(preset=resolved, trajectory=Path("<session>"), output=Path("<session>"),
                    image=None if image is None else Path(image).resolve(), seed=seed, device=device, dtype=dtype,
                    checkpoint=None if checkpoint is None else Path(checkpoint).resolve(),
                    random_weights=random_weights, weights_seed=weights_seed, world_seed=world_seed, memory=memory,
                    overwrite=overwrite, progress=False, metrics=metrics, save_every=0, rope_precision=rope_precision,
                    compile=compile)
    if pipeline is None or not pipeline.serves(cfg):
        pipeline = Pipeline.from_config(cfg)
    return Session(pipeline, cfg, record)


__all__ = ["Session", "StepResult", "open"]
