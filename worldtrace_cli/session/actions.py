"""A session's actions: one chunk's action words parsed with the trajectory parser, the log of the
actions taken (:class:`ActionLog`), and that log laid out as trajectory segments (``trajectory.yaml``)."""

from __future__ import annotations

import json

from ..errors import InputError, TrajectoryError


def parse_chunk_actions(actions, mode: str, rows: int) -> tuple[str, list[dict], list[tuple]]:
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
    from ..trajectory import parse_trajectory

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
        elif isinstance(item, dict) and not set(item) <= {"keys", "mouse"}:
            unknown = ", ".join(repr(k) for k in sorted(map(str, set(item) - {"keys", "mouse"})))[:80]
            raise InputError(f"step: a dict action takes \"keys\" and \"mouse\"; unknown: {unknown}")
        elif isinstance(item, dict) and item:
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



class ActionLog:
    """The actions a session has taken, chunk by chunk: the rows the rollout reads (an
    :class:`~worldtrace_cli.trajectory.actions.ActionPlan` grown in place, so the chunk loop's
    reference stays valid) and each chunk's trajectory segments (for ``trajectory.yaml``, saved
    states and forks).

    Args:
        mode: the preset's action mode; frames_per_chunk: latent frames per chunk (3 for MG2).
    Attributes:
        plan: the ActionPlan (keyboard float32 [R, keyboard_dim], mouse float32 [R, 2] or None,
            one row per pixel frame; ``chunk_actions`` the chunks' display names);
        segments: per chunk, its segments as trajectory YAML dicts (with ``frames``).
    """

    def __init__(self, mode: str, frames_per_chunk: int):
        import torch

        from ..trajectory.actions import MODES, ActionPlan

        spec = MODES[mode]
        self.mode = mode
        # the rows live in buffers that double when full: the plan's are views of their first rows, so a
        # chunk's rows are written once (a step costs the same at chunk 500 as at chunk 10)
        self._keyboard = torch.zeros(64, spec.keyboard_dim, dtype=torch.float32)
        self._mouse = torch.zeros(64, 2, dtype=torch.float32) if spec.mouse else None
        self.plan = ActionPlan(mode, 0, self._keyboard[:0], None if self._mouse is None else self._mouse[:0], [], [], [],
                               frames_per_chunk, [] if mode == "text" else None)  # a text session: each chunk's prompt
        self.segments: list[list[dict]] = []

    def _rows(self, rows: int) -> None:
        """Point the plan at the first ``rows`` rows of the buffers (grown to hold them)."""
        import torch

        if rows > self._keyboard.shape[0]:
            size = max(rows, 2 * self._keyboard.shape[0])
            grown = torch.zeros(size, self._keyboard.shape[1], dtype=torch.float32)
            grown[:self._keyboard.shape[0]] = self._keyboard
            self._keyboard = grown
            if self._mouse is not None:
                mouse = torch.zeros(size, 2, dtype=torch.float32)
                mouse[:self._mouse.shape[0]] = self._mouse
                self._mouse = mouse
        self.plan.keyboard = self._keyboard[:rows]
        self.plan.mouse = None if self._mouse is None else self._mouse[:rows]

    @property
    def chunks(self) -> int:
        """Chunks whose actions are in the log."""
        return self.plan.num_chunks

    def rows_next(self) -> int:
        """Pixel frames (action rows) the next chunk takes: 9 for chunk 0, 12 after (MG2)."""
        from ..trajectory.actions import chunk_rows

        start, end = chunk_rows(self.chunks, self.plan.frames_per_chunk)
        return end - start

    def append(self, name: str, segments: list[dict], per_row: list[tuple]) -> None:
        """Add one chunk's actions: its display ``name``, ``segments`` and per-row
        ``(keyboard tuple, mouse tuple | None)`` (:func:`parse_chunk_actions`'s result)."""
        import torch

        plan = self.plan
        have = plan.keyboard.shape[0]
        self._rows(have + len(per_row))
        if per_row and self._keyboard.shape[1]:
            self._keyboard[have:have + len(per_row)] = torch.tensor([k for k, _ in per_row], dtype=torch.float32)
        if self._mouse is not None:
            self._mouse[have:have + len(per_row)] = torch.tensor([m for _, m in per_row], dtype=torch.float32)
        plan.num_chunks += 1
        plan.chunk_actions.append(name)
        if plan.prompts is not None:
            plan.prompts.append(segments[0]["prompt"])
        self.segments.append(segments)

    def append_saved(self, segments: list[dict], name: str) -> None:
        """Add a chunk from its saved ``segments`` (a session state's or a parent's), re-parsed.

        Raises:
            TrajectoryError: segments that do not parse (a damaged state).
        """
        from ..trajectory import parse_trajectory

        traj = parse_trajectory(json.dumps({"mode": self.mode, "segments": segments}), source="session state")
        if self.mode == "text":  # one chunk of one prompt (its rows: 9 for chunk 0, 12 after)
            self.append(name, [{"prompt": traj.segments[0].prompt, "chunks": 1}], [((), None)] * self.rows_next())
            return
        self.append(name, segments, [(s.keyboard, s.mouse) for s in traj.segments for _ in range(s.num_frames)])

    def drop_last(self) -> None:
        """Undo :meth:`append` (a chunk that failed is not part of the session)."""
        from ..trajectory.actions import frames_for_chunks

        plan = self.plan
        plan.num_chunks -= 1
        self._rows(frames_for_chunks(plan.num_chunks, plan.frames_per_chunk) if plan.num_chunks else 0)
        plan.chunk_actions.pop()
        if plan.prompts:
            plan.prompts.pop()
        self.segments.pop()

    def taken(self) -> list:
        """Every chunk's actions as ``Session.step`` takes them (action words, or a list of one entry
        per pixel frame), so replaying them gives the same rows."""
        out = []
        for segs in self.segments:
            if "prompt" in segs[0]:  # a text session: the chunk's prompt
                out.append(segs[0]["prompt"])
                continue
            if len(segs) == 1 and "action" in segs[0]:
                out.append(segs[0]["action"])
                continue
            rows = []
            for seg in segs:
                body = seg["action"] if "action" in seg else {k: v for k, v in seg.items() if k != "frames"}
                rows += [body] * seg["frames"]
            out.append(rows)
        return out


def merge_segments(chunks: list[list[dict]]) -> list[dict]:
    """Trajectory segments of every chunk so far, neighbours with the same action merged."""
    out: list[dict] = []
    for segs in chunks:
        for seg in segs:
            length = "chunks" if "chunks" in seg else "frames"  # prompt segments count chunks
            body = {k: v for k, v in seg.items() if k != length}
            if out and {k: v for k, v in out[-1].items() if k != length} == body:
                out[-1][length] += seg[length]
            else:
                out.append(dict(seg))
    return out


def trajectory_text(mode: str, seed: int, segments: list[list[dict]], replay: str) -> str:
    """A trajectory YAML of the chunks' ``segments`` (:func:`merge_segments`), with ``mode``,
    ``seed`` and the ``replay`` command line in its header comment."""
    import yaml

    head = f"# Recorded by a worldtrace session: {len(segments)} chunks.\n# Replay: {replay}\nmode: {mode}\nseed: {seed}\n"
    if not segments:
        return head + "segments: []\n"
    return head + yaml.safe_dump({"segments": merge_segments(segments)}, sort_keys=False, default_flow_style=None)


def replay_command(cfg, trajectory: str, preset_ref: str | None = None) -> str:
    """The ``worldtrace generate`` command that replays a session of ``cfg`` (a RunConfig) from
    ``trajectory``: its preset (``preset_ref``: the preset file the session was opened with, else the
    built-in preset's name), writer and every memory setting that differs from the writer spec's
    defaults, its checkpoint, image or world seed."""
    from ..config import memory_config

    m, preset = cfg.memory, cfg.preset
    words = ["worldtrace generate", trajectory, "--preset", preset_ref or preset.name, "--cache", m.cache]
    if cfg.checkpoint is not None:
        words += ["--checkpoint", str(cfg.checkpoint)]
    if cfg.random_weights:
        words += ["--random-weights", "--weights-seed", str(cfg.weights_seed)]
    if cfg.image is not None:
        words += ["--image", str(cfg.image)]
    elif preset.has_world:
        words += ["--world-seed", str(cfg.world_seed)]
    if cfg.prompt_switch != "recache":  # a text session's switches replay as they ran
        words += ["--prompt-switch", cfg.prompt_switch]
    if cfg.backend != "native":  # the DiT's implementation the session ran on
        words += ["--backend", cfg.backend]
    if cfg.prompt is not None:  # the run's prompt (LingBot-World)
        words += ["--prompt", cfg.prompt]
    if cfg.prefix is not None:  # the real clip the session continued
        words += ["--prefix", str(cfg.prefix)] + ([] if cfg.prefix_chunks is None else
                                                  ["--prefix-chunks", str(cfg.prefix_chunks)])
    given, default = m.to_dict(), memory_config(m.cache, preset=preset).to_dict()
    for name, value in given.items():
        if name != "cache" and value != default.get(name):
            words += [f"--{name.replace('_', '-')}", str(value)]
    import shlex

    return " ".join(words[:1] + [shlex.quote(w) for w in words[1:]])


__all__ = ["ActionLog", "merge_segments", "parse_chunk_actions", "replay_command", "trajectory_text"]
