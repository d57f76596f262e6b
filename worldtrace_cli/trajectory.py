"""Trajectory files: a YAML list of keyboard/mouse actions -> MG2's per-pixel-frame action rows.

A trajectory is data only (``yaml.safe_load`` semantics). It is parsed from the composed YAML node
tree rather than from ``safe_load``'s plain objects so that every error can name its line and so
that duplicate mapping keys (which ``safe_load`` silently collapses) are caught. The format is
documented with examples in ``trajectories/README.md``.

Row layout (MG2 spec §11): a rollout of C chunks has N = 3C latent frames and R = 4N - 3 = 12C - 3
pixel frames, with one action row per pixel frame. Chunk 0 owns rows [0, 9); chunk c >= 1 owns
rows [12c - 3, 12c + 9).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import yaml

from .errors import InputError, TrajectoryError

if TYPE_CHECKING:  # torch is imported lazily so that parsing a file stays light
    import torch

FIRST_CHUNK_FRAMES = 9  # pixel frames decoded from chunk 0 (1 + 4 * 2)
CHUNK_FRAMES = 12  # pixel frames decoded from every later chunk (4 * 3)
CAMERA_STEP = 0.1  # MG2's demo mouse magnitude for the camera_* macros
MAX_CHUNKS = 100_000  # bounds a trajectory's length (and the tensors plan_actions builds)
MAX_LABEL_CHARS = 64
MAX_TRAJECTORY_BYTES = 1 << 20  # 1 MiB: tens of thousands of segments; parsing it takes seconds


# --------------------------------------------------------------------------- chunk layout


def frames_for_chunks(num_chunks: int, frames_per_chunk: int = 3) -> int:
    """Pixel frames (= action rows) of a rollout of ``num_chunks`` chunks: ``12 C - 3`` (MG2); with
    ``frames_per_chunk`` F latent frames per chunk, ``4 F C - 3`` (LingBot, F = 4: ``16 C - 3``)."""
    return 4 * frames_per_chunk * num_chunks - 3


def chunks_for_frames(num_frames: int, frames_per_chunk: int = 3) -> int:
    """Smallest chunk count C >= 1 whose ``4 F C - 3`` pixel frames cover ``num_frames`` rows."""
    return max(1, math.ceil((num_frames + 3) / (4 * frames_per_chunk)))


def chunk_rows(chunk: int, frames_per_chunk: int = 3) -> tuple[int, int]:
    """Pixel-frame rows ``[start, end)`` owned by ``chunk`` (0 -> (0, 9); c -> (12c-3, 12c+9) for MG2;
    with F latent frames per chunk 0 -> (0, 4F-3), c -> (4Fc-3, 4F(c+1)-3)).

    Raises ValueError for a negative chunk index.
    """
    if chunk < 0:
        raise ValueError(f"chunk index must be >= 0, got {chunk}")
    if chunk == 0:
        return 0, frames_for_chunks(1, frames_per_chunk)
    start = frames_for_chunks(chunk, frames_per_chunk)
    return start, start + 4 * frames_per_chunk


def chunk_of_row(row: int, frames_per_chunk: int = 3) -> int:
    """Chunk that owns pixel-frame row ``row`` (>= 0); row ``4 F C - 3`` gives C (the next chunk)."""
    return (row + 3) // (4 * frames_per_chunk)


# --------------------------------------------------------------------------- vocabularies


@dataclass(frozen=True)
class Macro:
    """A named action: keyboard indices pressed and the mouse axes it sets (None = untouched)."""

    keys: tuple[int, ...] = ()
    pitch: float | None = None
    yaw: float | None = None


@dataclass(frozen=True)
class ModeSpec:
    """One MG2 action vocabulary (spec §13).

    ``key_letters[i]`` is the letter of keyboard index i; ``one_hot`` means exactly one index is
    set per row (templerun); ``exclusive_keys`` are index pairs that contradict (W and S);
    ``pitch`` says whether the mouse pitch is used (gta_drive steers with yaw only).
    """

    name: str
    keyboard_dim: int
    mouse: bool
    key_letters: str
    macros: Mapping[str, Macro]
    one_hot: bool = False
    pitch: bool = True
    exclusive_keys: tuple[tuple[int, int], ...] = ()


_S = CAMERA_STEP
MODES: dict[str, ModeSpec] = {
    "universal": ModeSpec(
        name="universal", keyboard_dim=4, mouse=True, key_letters="WSAD",
        exclusive_keys=((0, 1), (2, 3)),
        macros=MappingProxyType({
            "forward": Macro(keys=(0,)), "back": Macro(keys=(1,)),
            "left": Macro(keys=(2,)), "right": Macro(keys=(3,)),
            "camera_l": Macro(yaw=-_S), "camera_r": Macro(yaw=_S),
            "camera_up": Macro(pitch=_S), "camera_down": Macro(pitch=-_S),
            "idle": Macro(),
        }),
    ),
    "gta_drive": ModeSpec(
        # MG2 steers the car with the A/D keys, which it encodes as mouse yaw.
        name="gta_drive", keyboard_dim=2, mouse=True, key_letters="WS", pitch=False,
        exclusive_keys=((0, 1),),
        macros=MappingProxyType({
            "forward": Macro(keys=(0,)), "back": Macro(keys=(1,)),
            "left": Macro(yaw=-_S), "right": Macro(yaw=_S),
            "camera_l": Macro(yaw=-_S), "camera_r": Macro(yaw=_S),
            "idle": Macro(),
        }),
    ),
    "templerun": ModeSpec(
        name="templerun", keyboard_dim=7, mouse=False, key_letters="QWSZCAD", one_hot=True,
        macros=MappingProxyType({
            "idle": Macro(keys=(0,)), "jump": Macro(keys=(1,)), "slide": Macro(keys=(2,)),
            "turn_left": Macro(keys=(3,)), "turn_right": Macro(keys=(4,)),
            "left": Macro(keys=(5,)), "right": Macro(keys=(6,)),
        }),
    ),
}


# --------------------------------------------------------------------------- parsed records


@dataclass(frozen=True)
class Segment:
    """One trajectory segment.

    action: display name, e.g. ``"forward+camera_l"`` (``""`` for a label-only marker).
    keyboard: ``keyboard_dim`` floats in {0, 1}; mouse: ``(pitch, yaw)``, None in templerun.
    num_frames: length in pixel frames (action rows); 0 for a label-only waypoint marker.
    label: waypoint label at the segment's first row, or None; line: 1-based line in the file.
    """

    action: str
    keyboard: tuple[float, ...]
    mouse: tuple[float, float] | None
    num_frames: int
    label: str | None
    line: int


@dataclass(frozen=True)
class Trajectory:
    """A parsed trajectory: ``source`` names the file (for messages), ``image`` is resolved
    against the file's folder, ``segments`` are in order (markers included). LingBot presets also
    read ``prompt`` (text) and ``poses`` / ``intrinsics`` (LingBot's own ``poses.npy`` /
    ``intrinsics.npy``, resolved against the file's folder like ``image``)."""

    source: str
    mode: str
    image: Path | None
    seed: int | None
    segments: tuple[Segment, ...]
    prompt: str | None = None
    poses: Path | None = None
    intrinsics: Path | None = None

    @property
    def num_frames(self) -> int:
        """Total length in pixel frames (action rows)."""
        return sum(s.num_frames for s in self.segments)

    @property
    def num_chunks(self) -> int:
        """Chunks needed to cover the rows: smallest C with ``12 C - 3 >= num_frames``."""
        return chunks_for_frames(self.num_frames)


# --------------------------------------------------------------------------- YAML node access


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
        raise TrajectoryError(f"{path}: cannot read trajectory file: "
                              f"{err.strerror or err}") from None
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


# --------------------------------------------------------------------------- action plan


@dataclass
class ActionPlan:
    """Per-pixel-frame action rows for a rollout of ``num_chunks`` chunks.

    keyboard: float32 [R, keyboard_dim], R = 12 * num_chunks - 3 (one row per pixel frame).
    mouse: float32 [R, 2] as (pitch, yaw), or None for templerun.
    chunk_actions: per chunk, the display names of the segments covering its rows, joined
    with '>' (e.g. ``"forward>camera_l"``).
    waypoints: (chunk index, label); a label at row r belongs to the chunk owning row r, and a
    label at r == R (the end) to chunk ``num_chunks``.
    notes: human-readable remarks (repetition past the trajectory's end, truncation).
    frames_per_chunk: latent frames per chunk of the layout (3 MG2, 4 LingBot: 16 C - 3 rows).
    """

    mode: str
    num_chunks: int
    keyboard: torch.Tensor
    mouse: torch.Tensor | None
    chunk_actions: list[str]
    waypoints: list[tuple[int, str]]
    notes: list[str]
    frames_per_chunk: int = 3

    @property
    def num_frames(self) -> int:
        """R, the number of pixel frames (action rows)."""
        return frames_for_chunks(self.num_chunks, self.frames_per_chunk)


def plan_actions(traj: Trajectory, num_chunks: int | None = None, frames_per_chunk: int = 3) -> ActionPlan:
    """Lay a trajectory out as MG2 action rows for ``num_chunks`` chunks (default: its own).
    ``frames_per_chunk`` latent frames per chunk sets the chunk layout (4 for LingBot: chunk c owns
    16 rows, chunk 0 13; the trajectory's rows and their actions are the same either way).

    Rows past the trajectory's end (a longer run, or the tail of its last chunk) repeat its last
    segment that has a length; a shorter run truncates it and drops waypoints past the end.
    Raises InputError when num_chunks is not an integer >= 1.
    """
    import torch

    fpc = frames_per_chunk
    traj_chunks = chunks_for_frames(traj.num_frames, fpc)
    if num_chunks is None:
        num_chunks = traj_chunks
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise InputError(f"number of chunks must be an integer >= 1, got {num_chunks!r}")
    spec = MODES[traj.mode]
    total = frames_for_chunks(num_chunks, fpc)
    keyboard = torch.zeros(total, spec.keyboard_dim, dtype=torch.float32)
    mouse = torch.zeros(total, 2, dtype=torch.float32) if spec.mouse else None

    spans: list[tuple[int, int, Segment]] = []  # [start, end) rows, clipped to the rollout
    waypoints: list[tuple[int, str]] = []
    dropped: list[str] = []
    row = 0
    for seg in traj.segments:
        if seg.label is not None:
            if row <= total:
                waypoints.append((chunk_of_row(row, fpc), seg.label))
            else:
                dropped.append(f"{seg.label} (chunk {chunk_of_row(row, fpc)})")
        if seg.num_frames and row < total:
            spans.append((row, min(row + seg.num_frames, total), seg))
        row += seg.num_frames
    last = next(s for s in reversed(traj.segments) if s.num_frames)
    if row < total:
        spans.append((row, total, last))

    chunk_names: list[list[str]] = [[] for _ in range(num_chunks)]
    for start, end, seg in spans:
        keyboard[start:end] = torch.tensor(seg.keyboard, dtype=torch.float32)
        if mouse is not None:
            mouse[start:end] = torch.tensor(seg.mouse, dtype=torch.float32)
        for c in range(chunk_of_row(start, fpc), chunk_of_row(end - 1, fpc) + 1):
            if not chunk_names[c] or chunk_names[c][-1] != seg.action:
                chunk_names[c].append(seg.action)

    notes: list[str] = []
    if num_chunks > traj_chunks:
        notes.append(f"trajectory covers {traj_chunks} chunks; {num_chunks} requested: its last "
                     f"segment ({last.action}) repeats for {num_chunks - traj_chunks} more chunks")
    if num_chunks >= traj_chunks and row < frames_for_chunks(traj_chunks, fpc):
        notes.append(f"trajectory ends at pixel frame {row}, inside chunk {traj_chunks - 1}: its "
                     f"last segment ({last.action}) fills the remaining "
                     f"{frames_for_chunks(traj_chunks, fpc) - row} rows")
    if num_chunks < traj_chunks:
        notes.append(f"trajectory covers {traj_chunks} chunks; truncated to {num_chunks} chunks")
    if dropped:
        notes.append(f"waypoints past chunk {num_chunks} dropped: {', '.join(dropped)}")
    return ActionPlan(mode=traj.mode, num_chunks=num_chunks, keyboard=keyboard, mouse=mouse,
                      chunk_actions=[">".join(n) for n in chunk_names], waypoints=waypoints,
                      notes=notes, frames_per_chunk=fpc)
