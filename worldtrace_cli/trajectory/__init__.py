"""Trajectory files: a YAML list of keyboard/mouse actions -> MG2's per-pixel-frame action rows.

A trajectory is data only (``yaml.safe_load`` semantics). It is parsed from the composed YAML node
tree rather than from ``safe_load``'s plain objects so that every error can name its line and so
that duplicate mapping keys (which ``safe_load`` silently collapses) are caught. The format is
documented with examples in ``trajectories/README.md``.

The action layout and :func:`plan_actions` live in :mod:`worldtrace_cli.trajectory.actions` (re-exported here).
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from .actions import (CAMERA_STEP, CHUNK_FRAMES, FIRST_CHUNK_FRAMES, MAX_CHUNKS, MAX_LABEL_CHARS,
                      MAX_TRAJECTORY_BYTES, MODES, ActionPlan, Macro, ModeSpec, Segment, Trajectory, chunk_of_row,
                      chunk_rows, chunks_for_frames, frames_for_chunks, plan_actions)
from ..errors import TrajectoryError
from .prompts import parse_prompt_segment


class _Parser:
    """Walks a composed YAML node tree; every error is ``file:line: field: problem``."""

    def __init__(self, source: str):
        self.source = source
        self.loader = yaml.SafeLoader("")  # replaced by compose(); constructs scalars

    def compose(self, text: str) -> yaml.Node | None:
        """The document's root node (None for an empty document); YAML errors -> line 1+."""
        try:
            # The reader checks characters in its constructor, so that belongs inside the try.
            self.loader = yaml.SafeLoader(text)
            return self.loader.get_single_node()
        except yaml.MarkedYAMLError as err:
            mark = err.problem_mark or err.context_mark
            problem = " ".join(filter(None, [err.context, err.problem]))
            raise self.error(mark.line + 1 if mark else 1, "yaml", problem) from None
        except yaml.reader.ReaderError as err:  # a character YAML does not allow
            char = err.character
            char = f"#x{char:04x}" if isinstance(char, int) else repr(char)
            raise self.error(text.count("\n", 0, err.position) + 1, "yaml",
                             f"character {char} is not allowed ({err.reason})") from None
        except RecursionError:  # PyYAML composes nested collections recursively
            raise self.error(1, "yaml", "document nested too deeply") from None

    def error(self, node: yaml.Node | int, field: str, problem: str) -> TrajectoryError:
        line = node if isinstance(node, int) else node.start_mark.line + 1
        return TrajectoryError(f"{self.source}:{line}: {field}: {_one_line(problem)}")

    def mapping(self, node: yaml.Node, field: str,
                allowed: tuple[str, ...]) -> dict[str, yaml.Node]:
        """Key -> value node of a plain mapping; rejects duplicates, merges and unknown keys."""
        if not isinstance(node, yaml.MappingNode) or node.tag != "tag:yaml.org,2002:map":
            raise self.error(node, field, f"expected a mapping, got {_kind(node)}")
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise self.error(key_node, field, "merge keys (<<) are not supported")
            key = self.scalar(key_node, field)
            if not isinstance(key, str):
                raise self.error(key_node, field, f"keys must be strings, got {key!r}")
            if key not in allowed:
                # The key is user text: keep it out of the field name (it may hold ': ').
                raise self.error(key_node, field, f"unknown key {key!r}; allowed: "
                                 f"{', '.join(allowed)}")
            if key in out:
                raise self.error(key_node, key if field == "document" else f"{field}.{key}",
                                 f"duplicate key (first on line {out[key].start_mark.line + 1})")
            out[key] = value_node
        return out

    def sequence(self, node: yaml.Node, field: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode) or node.tag != "tag:yaml.org,2002:seq":
            raise self.error(node, field, f"expected a list, got {_kind(node)}")
        return list(node.value)

    def scalar(self, node: yaml.Node, field: str) -> object:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, field, f"expected a single value, got {_kind(node)}")
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as err:  # e.g. an unknown or unsafe tag
            raise self.error(node, field, f"invalid value: {err.problem}") from None
        # PyYAML's safe scalar constructors fail with assorted built-in errors on malformed
        # scalars: 2001-13-45 -> ValueError, `!!bool maybe` -> KeyError, `!!int ''` ->
        # IndexError, `!!timestamp x` -> AttributeError. All of them are bad input here.
        except Exception as err:
            raise self.error(node, field, f"invalid value {node.value!r}: {err}") from None

    def string(self, node: yaml.Node, field: str) -> str:
        value = self.scalar(node, field)
        if not isinstance(value, str):
            raise self.error(node, field, f"expected a string, got {value!r} (quote it?)")
        return value

    def integer(self, node: yaml.Node, field: str, minimum: int, maximum: int) -> int:
        value = self.scalar(node, field)
        # bool is an int subclass: `chunks: yes` must not mean 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(node, field, f"expected an integer, got {value!r}")
        if not minimum <= value <= maximum:
            raise self.error(node, field, f"must be in [{minimum}, {maximum}], got {value}")
        return value

    def number(self, node: yaml.Node, field: str) -> float:
        value = self.scalar(node, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(node, field, f"expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise self.error(node, field, f"must be finite, got {value}")
        return value


def _kind(node: yaml.Node) -> str:
    standard = node.tag.startswith("tag:yaml.org,2002:") and node.tag[18:] in ("map", "seq")
    tag = "" if standard else f" tagged {node.tag}"
    if isinstance(node, yaml.MappingNode):
        return "a mapping" + tag
    if isinstance(node, yaml.SequenceNode):
        return "a list" + tag
    return f"{node.value!r}"[:60]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# --------------------------------------------------------------------------- parsing

_TOP_KEYS = ("mode", "image", "seed", "segments", "prompt", "poses", "intrinsics")
_SEGMENT_KEYS = ("label", "action", "keys", "mouse", "chunks", "frames")


def load_trajectory(path: str | Path) -> Trajectory:
    """Read and parse a trajectory YAML file; a relative ``image`` resolves against its folder.

    Raises TrajectoryError naming the file when it is missing, unreadable, larger than
    :data:`MAX_TRAJECTORY_BYTES` or not UTF-8, and ``file:line: field: problem`` for any content error.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_TRAJECTORY_BYTES:
            raise TrajectoryError(f"{path}: trajectory file of {size / 2**20:.1f} MiB exceeds the "
                                  f"{MAX_TRAJECTORY_BYTES // 2**20} MiB limit (repeat a segment with `chunks:` instead)")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TrajectoryError(f"{path}: not UTF-8 text ({err.reason} at byte "
                              f"{err.start})") from None
    except OSError as err:
        shipped = Path(__file__).resolve().parents[2] / "trajectories"  # a source checkout's examples
        hint = "" if not isinstance(err, FileNotFoundError) or not shipped.is_dir() else (
            f" (did you mean {shipped / path.name}?)" if (shipped / path.name).is_file() else
            f" (the example trajectories are in {shipped}/, e.g. {shipped / 'look_around.yaml'})")
        raise TrajectoryError(f"{path}: cannot read trajectory file: "
                              f"{err.strerror or err}{hint}") from None
    return parse_trajectory(text, source=str(path), base_dir=path.parent)


def parse_trajectory(text: str, source: str = "<string>",
                     base_dir: Path | None = None) -> Trajectory:
    """Parse trajectory YAML ``text``; ``source`` names it in errors.

    A relative ``image`` is joined to ``base_dir`` (kept as written when base_dir is None); its
    existence is not checked here (the image loader reports it, and the CLI may override it).
    Raises TrajectoryError (``source:line: field: problem``) for malformed YAML or content.
    """
    p = _Parser(source)
    root = p.compose(text)
    try:
        if root is None:
            raise p.error(1, "mode", "empty document; a trajectory needs mode and segments")
        return _parse_document(p, root, base_dir)
    finally:
        p.loader.dispose()


def _parse_document(p: _Parser, root: yaml.Node, base_dir: Path | None) -> Trajectory:
    top = p.mapping(root, "document", _TOP_KEYS)
    if "mode" not in top:
        raise p.error(root, "mode", f"required ({', '.join(MODES)})")
    mode = p.string(top["mode"], "mode")
    if mode not in MODES:
        raise p.error(top["mode"], "mode", f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    spec = MODES[mode]

    paths: dict[str, Path | None] = {}
    for key in ("image", "poses", "intrinsics"):
        paths[key] = None
        if key in top:
            text = p.string(top[key], key)
            if not text.strip():
                raise p.error(top[key], key, "empty path")
            paths[key] = Path(text).expanduser()
            if base_dir is not None and not paths[key].is_absolute():
                paths[key] = Path(base_dir) / paths[key]
    image = paths["image"]
    prompt = p.string(top["prompt"], "prompt") if "prompt" in top else None
    if prompt is not None and mode == "text":
        from .prompts import check_prompt

        try:
            prompt = check_prompt(prompt, "prompt")
        except ValueError as exc:
            raise p.error(top["prompt"], "prompt", str(exc).split(": ", 1)[1]) from None

    seed = p.integer(top["seed"], "seed", 0, 2**63 - 1) if "seed" in top else None

    if "segments" not in top:
        raise p.error(root, "segments", "required (a non-empty list)")
    items = p.sequence(top["segments"], "segments")
    if not items:
        raise p.error(top["segments"], "segments", "must not be empty")
    segments: list[Segment] = []
    start_row = 0
    for i, item in enumerate(items):
        seg = _parse_segment(p, spec, item, f"segments[{i}]", start_row)
        start_row += seg.num_frames
        segments.append(seg)
    if start_row == 0:
        raise p.error(top["segments"], "segments", "no segment has a length (only labels)")
    return Trajectory(source=p.source, mode=mode, image=image, seed=seed,
                      segments=tuple(segments), prompt=prompt, poses=paths["poses"],
                      intrinsics=paths["intrinsics"])


def _parse_segment(p: _Parser, spec: ModeSpec, node: yaml.Node, field: str,
                   start_row: int) -> Segment:
    if spec.name == "text":  # prompt segments (Self-Forcing / LongLive presets)
        return parse_prompt_segment(p, node, field, start_row, _parse_label)
    f = p.mapping(node, field, _SEGMENT_KEYS)
    line = node.start_mark.line + 1
    label = _parse_label(p, f["label"], f"{field}.label") if "label" in f else None
    explicit = "keys" in f or "mouse" in f
    has_length = "chunks" in f or "frames" in f

    if "action" in f and explicit:
        other = "keys" if "keys" in f else "mouse"
        raise p.error(f[other], f"{field}.{other}", "use either action or keys/mouse, not both")
    if "action" not in f and not explicit:
        if has_length:
            raise p.error(node, field, "a segment with a length needs an action (or keys/mouse)")
        if label is None:
            raise p.error(node, field, "empty segment: give an action and a length, or a label")
        # A marker covers no rows; zeros keep "mouse is None iff the mode has no mouse" true.
        return Segment("", (0.0,) * spec.keyboard_dim, (0.0, 0.0) if spec.mouse else None, 0,
                       label, line)

    if "chunks" in f and "frames" in f:
        raise p.error(f["frames"], f"{field}.frames", "give either chunks or frames, not both")
    if not has_length:
        raise p.error(node, field, "needs a length: chunks or frames")
    length_key = "chunks" if "chunks" in f else "frames"
    if length_key == "chunks":
        chunks = p.integer(f["chunks"], f"{field}.chunks", 1, MAX_CHUNKS)
        # The first chunk of a rollout is 3 rows short (9 pixel frames instead of 12).
        num_frames = CHUNK_FRAMES * chunks - (3 if start_row == 0 else 0)
    else:
        num_frames = p.integer(f["frames"], f"{field}.frames", 1, frames_for_chunks(MAX_CHUNKS))
    if start_row + num_frames > frames_for_chunks(MAX_CHUNKS):
        raise p.error(f[length_key], f"{field}.{length_key}",
                      f"trajectory longer than {MAX_CHUNKS} chunks")

    if "action" in f:
        name, keyboard, mouse = _parse_action(p, spec, f["action"], f"{field}.action")
    else:
        keyboard, mouse = _parse_explicit(p, spec, f, node, field)
        name = _describe(spec, keyboard, mouse)
    return Segment(name, keyboard, mouse, num_frames, label, line)


def _parse_label(p: _Parser, node: yaml.Node, field: str) -> str:
    label = p.string(node, field).strip()
    if not label or len(label) > MAX_LABEL_CHARS or "\n" in label:
        raise p.error(node, field, f"must be a non-empty single line of at most "
                      f"{MAX_LABEL_CHARS} characters")
    return label


def _parse_action(p: _Parser, spec: ModeSpec, node: yaml.Node,
                  field: str) -> tuple[str, tuple[float, ...], tuple[float, float] | None]:
    text = p.string(node, field)
    parts = [part.strip().lower() for part in text.split("+")]
    if any(not part for part in parts):
        raise p.error(node, field, f"empty action name in {text!r}")
    for part in parts:
        if part not in spec.macros:
            known = any(part in m.macros for m in MODES.values())
            problem = f"{part!r} is not valid in {spec.name} mode" if known else \
                f"unknown action {part!r}"
            raise p.error(node, field, f"{problem}; valid: {', '.join(spec.macros)} "
                          "(combine with '+')")
    repeated = sorted({part for part in parts if parts.count(part) > 1})
    if repeated:
        raise p.error(node, field, f"{repeated[0]!r} repeated")
    if spec.one_hot and len(parts) > 1:
        raise p.error(node, field, f"{spec.name} actions are one-hot; '+' combinations "
                      "are not allowed")
    if len(parts) > 1 and "idle" in parts:
        raise p.error(node, field, "'idle' cannot be combined with other actions")
    key_owner: dict[int, str] = {}
    axis_owner: dict[str, str] = {}
    axes = {"pitch": 0.0, "yaw": 0.0}
    for part in parts:
        macro = spec.macros[part]
        for axis, value in (("pitch", macro.pitch), ("yaw", macro.yaw)):
            if value is None:
                continue
            if axis in axis_owner:
                raise p.error(node, field, f"{axis_owner[axis]!r} and {part!r} contradict "
                              f"(both set the mouse {axis})")
            axis_owner[axis] = part
            axes[axis] = value
        for k in macro.keys:
            key_owner[k] = part
    for a, b in spec.exclusive_keys:
        if a in key_owner and b in key_owner:
            raise p.error(node, field, f"{key_owner[a]!r} and {key_owner[b]!r} contradict")
    keyboard = tuple(1.0 if i in key_owner else 0.0 for i in range(spec.keyboard_dim))
    mouse = (axes["pitch"], axes["yaw"]) if spec.mouse else None
    return "+".join(parts), keyboard, mouse


def _parse_explicit(p: _Parser, spec: ModeSpec, f: dict[str, yaml.Node], node: yaml.Node,
                    field: str) -> tuple[tuple[float, ...], tuple[float, float] | None]:
    pressed: list[int] = []
    if "keys" in f:
        kfield = f"{field}.keys"
        for item in p.sequence(f["keys"], kfield):
            letter = p.string(item, kfield).strip().upper()
            if len(letter) != 1 or letter not in spec.key_letters:
                hint = ""
                if spec.name == "gta_drive" and letter in ("A", "D"):
                    hint = " (gta_drive steers with mouse yaw: use action left/right)"
                raise p.error(item, kfield, f"unknown key {letter!r} for {spec.name}; valid: "
                              f"{' '.join(spec.key_letters)}{hint}")
            index = spec.key_letters.index(letter)
            if index in pressed:
                raise p.error(item, kfield, f"key {letter!r} repeated")
            pressed.append(index)
        for a, b in spec.exclusive_keys:
            if a in pressed and b in pressed:
                raise p.error(f["keys"], kfield, f"keys {spec.key_letters[a]!r} and "
                              f"{spec.key_letters[b]!r} contradict")
    if spec.one_hot and len(pressed) != 1:
        where = f["keys"] if "keys" in f else node
        raise p.error(where, f"{field}.keys", f"{spec.name} keys are one-hot: give exactly one "
                      f"of {' '.join(spec.key_letters)}")
    keyboard = tuple(1.0 if i in pressed else 0.0 for i in range(spec.keyboard_dim))

    if not spec.mouse:
        if "mouse" in f:
            raise p.error(f["mouse"], f"{field}.mouse", f"{spec.name} has no mouse input")
        return keyboard, None
    mouse = (0.0, 0.0)
    if "mouse" in f:
        mfield = f"{field}.mouse"
        values = p.sequence(f["mouse"], mfield)
        if len(values) != 2:
            raise p.error(f["mouse"], mfield, f"expected [pitch, yaw], got {len(values)} values")
        pitch, yaw = (p.number(v, mfield) for v in values)
        for v, value in zip(values, (pitch, yaw)):
            if not -1.0 <= value <= 1.0:
                raise p.error(v, mfield, f"must be in [-1, 1], got {value}")
        if not spec.pitch and pitch != 0.0:
            raise p.error(values[0], mfield, f"{spec.name} uses only yaw; pitch must be 0")
        mouse = (pitch + 0.0, yaw + 0.0)  # + 0.0 turns -0.0 into 0.0 for display
    return keyboard, mouse


def _describe(spec: ModeSpec, keyboard: tuple[float, ...],
              mouse: tuple[float, float] | None) -> str:
    """Display name of an explicit keys/mouse segment, in macro names where they fit."""
    by_key = {m.keys: n for n, m in spec.macros.items() if len(m.keys) == 1}
    names = [by_key[(i,)] for i, v in enumerate(keyboard) if v]
    if mouse is not None and mouse != (0.0, 0.0):
        # First name wins, so gta_drive says "left" rather than its alias "camera_l".
        by_axis: dict[tuple[str, float], str] = {}
        for n, m in spec.macros.items():
            for axis, value in (("pitch", m.pitch), ("yaw", m.yaw)):
                if value is not None:
                    by_axis.setdefault((axis, value), n)
        wanted = [(axis, v) for axis, v in zip(("pitch", "yaw"), mouse) if v]
        if all(w in by_axis for w in wanted):
            names += [by_axis[w] for w in wanted]
        else:
            names.append(f"mouse[{mouse[0]:g},{mouse[1]:g}]")
    return "+".join(names) or "idle"


__all__ = ["CAMERA_STEP", "CHUNK_FRAMES", "FIRST_CHUNK_FRAMES", "MAX_CHUNKS", "MAX_LABEL_CHARS", "MAX_TRAJECTORY_BYTES",
           "MODES", "ActionPlan", "Macro", "ModeSpec", "Segment", "Trajectory", "chunk_of_row", "chunk_rows",
           "chunks_for_frames", "frames_for_chunks", "load_trajectory", "parse_trajectory", "plan_actions"]
