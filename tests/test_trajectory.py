"""Trajectory format: chunk layout, vocabularies, error messages, shipped examples, fuzzing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worldtrace_cli.errors import InputError, TrajectoryError
from worldtrace_cli.trajectory import (
    MODES,
    chunk_of_row,
    chunk_rows,
    chunks_for_frames,
    frames_for_chunks,
    load_trajectory,
    parse_trajectory,
    plan_actions,
)

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "trajectories").glob("*.yaml"))
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def doc(mode: str, *segments: str) -> str:
    """A trajectory text with one flow-style segment per line (segment i is on line 3 + i)."""
    return f"mode: {mode}\nsegments:\n" + "".join(f"  - {s}\n" for s in segments)


# --------------------------------------------------------------------------- layout


def test_chunk_rows_closed_form():
    assert chunk_rows(0) == (0, 9)
    for c in range(1, 50):
        assert chunk_rows(c) == (12 * c - 3, 12 * c + 9)
    with pytest.raises(ValueError):
        chunk_rows(-1)


@pytest.mark.parametrize("num_chunks", [1, 2, 3, 16, 101])
def test_chunks_partition_rows(num_chunks):
    rows = [r for c in range(num_chunks) for r in range(*chunk_rows(c))]
    assert rows == list(range(frames_for_chunks(num_chunks)))
    assert frames_for_chunks(num_chunks) == 4 * (3 * num_chunks) - 3  # R = 4N - 3, N = 3C
    for c in range(num_chunks):
        start, end = chunk_rows(c)
        assert chunk_of_row(start) == chunk_of_row(end - 1) == c
    assert chunk_of_row(frames_for_chunks(num_chunks)) == num_chunks


@pytest.mark.parametrize("frames, chunks", [(1, 1), (9, 1), (10, 2), (21, 2), (22, 3), (189, 16),
                                            (190, 17)])
def test_chunks_for_frames(frames, chunks):
    assert chunks_for_frames(frames) == chunks
    assert frames_for_chunks(chunks) >= frames > frames_for_chunks(chunks - 1) if chunks > 1 \
        else frames <= 9


# --------------------------------------------------------------------------- shipped examples


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"aba.yaml", "abca.yaml", "pan_360.yaml", "gta_drive_loop.yaml",
            "templerun_run.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses_and_plans(path):
    traj = load_trajectory(path)
    plan = plan_actions(traj)
    spec = MODES[traj.mode]
    assert plan.num_chunks == traj.num_chunks
    assert plan.keyboard.shape == (12 * plan.num_chunks - 3, spec.keyboard_dim)
    assert plan.keyboard.dtype == torch.float32
    assert (plan.mouse is None) == (not spec.mouse)
    assert len(plan.chunk_actions) == plan.num_chunks and all(plan.chunk_actions)
    # an example without an image is a walk in loopworld's procedural world (its view is the image),
    # or prompt segments (text-to-video presets take no image)
    assert (traj.image is not None and traj.image.is_file()) or traj.mode in ("universal", "text"), traj.image
    assert (plan.prompts is not None) == (traj.mode == "text")


def test_aba_is_exactly_a_b_a():
    traj = load_trajectory(REPO / "trajectories" / "aba.yaml")
    assert traj.mode == "universal"
    shape = [(s.label, s.action, s.num_frames) for s in traj.segments]
    assert shape == [("A", "forward", 12 * 8 - 3), ("B", "back", 12 * 8), ("A", "", 0)]
    plan = plan_actions(traj)
    assert plan.num_chunks == 16 and plan.keyboard.shape == (189, 4)
    assert plan.waypoints == [(0, "A"), (8, "B"), (16, "A")]
    assert plan.chunk_actions == ["forward"] * 8 + ["back"] * 8
    assert plan.notes == []
    forward_end = chunk_rows(8)[0]
    assert torch.equal(plan.keyboard[:forward_end], torch.tensor([[1.0, 0, 0, 0]]).expand(93, 4))
    assert torch.equal(plan.keyboard[forward_end:], torch.tensor([[0, 1.0, 0, 0]]).expand(96, 4))
    assert torch.count_nonzero(plan.mouse) == 0


# --------------------------------------------------------------------------- vocabularies


def test_universal_combination_rows():
    traj = parse_trajectory(doc("universal", "{action: forward+camera_l, chunks: 1}",
                                "{action: camera_up+right, frames: 5}"))
    assert traj.segments[0].keyboard == (1.0, 0.0, 0.0, 0.0)
    assert traj.segments[0].mouse == (0.0, -0.1)
    assert traj.segments[1].keyboard == (0.0, 0.0, 0.0, 1.0)
    assert traj.segments[1].mouse == (0.1, 0.0)
    plan = plan_actions(traj)
    assert plan.num_chunks == 2  # 9 + 5 = 14 rows -> 2 chunks (21 rows), tail repeats
    assert torch.allclose(plan.mouse[9:], torch.tensor([0.1, 0.0]).expand(12, 2))
    assert plan.chunk_actions == ["forward+camera_l", "camera_up+right"]


def test_gta_drive_steers_with_yaw():
    traj = parse_trajectory(doc("gta_drive", "{action: forward+left, chunks: 1}",
                                "{action: camera_r, chunks: 1}",
                                "{keys: [w], mouse: [0, 0.1], chunks: 1}"))
    left, cam_r, explicit = traj.segments
    assert left.keyboard == (1.0, 0.0) and left.mouse == (0.0, -0.1)
    assert cam_r.keyboard == (0.0, 0.0) and cam_r.mouse == (0.0, 0.1)
    assert explicit.action == "forward+right"
    assert plan_actions(traj).keyboard.shape == (33, 2)


def test_templerun_is_one_hot_without_mouse():
    traj = parse_trajectory(doc("templerun", "{action: idle, chunks: 1}",
                                "{action: turn_right, frames: 12}", "{keys: [z], frames: 3}"))
    idle, turn, explicit = traj.segments
    assert idle.keyboard == (1.0, 0, 0, 0, 0, 0, 0) and idle.mouse is None
    assert turn.keyboard == (0, 0, 0, 0, 1.0, 0, 0)
    assert explicit.action == "turn_left"
    plan = plan_actions(traj)
    assert plan.mouse is None
    assert torch.equal(plan.keyboard.sum(dim=1), torch.ones(plan.num_frames))


@pytest.mark.parametrize("segment, name", [
    ("{keys: [W, A], chunks: 1}", "forward+left"),
    ("{keys: [], chunks: 1}", "idle"),
    ("{mouse: [0.1, -0.1], chunks: 1}", "camera_up+camera_l"),
    ("{keys: [s], mouse: [0, 0.25], chunks: 1}", "back+mouse[0,0.25]"),
    ("{mouse: [-0.5, 0.1], chunks: 1}", "mouse[-0.5,0.1]"),
])
def test_explicit_segment_display_names(segment, name):
    assert parse_trajectory(doc("universal", segment)).segments[0].action == name


def test_optional_fields_and_image_resolution(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "t.yaml"
    path.write_text("mode: universal\nimage: ../img.png\nseed: 7\n"
                    "segments:\n  - {action: idle, chunks: 1}\n")
    traj = load_trajectory(path)
    assert traj.seed == 7 and traj.source == str(path)
    assert traj.image.resolve() == (tmp_path / "img.png").resolve()
    absolute = parse_trajectory(f"mode: universal\nimage: {tmp_path}/x.png\n"
                                "segments: [{action: idle, chunks: 1}]", base_dir=Path("/else"))
    assert absolute.image == tmp_path / "x.png"
    assert parse_trajectory("mode: universal\nimage: a.png\nsegments: [{action: idle, chunks: 1}]"
                            ).image == Path("a.png")


def test_aliases_are_plain_data():
    traj = parse_trajectory("mode: universal\nsegments:\n  - &fwd {action: forward, chunks: 1}\n"
                            "  - *fwd\n")
    assert [s.num_frames for s in traj.segments] == [9, 12]


# --------------------------------------------------------------------------- planning


def test_plan_extends_by_repeating_last_segment():
    traj = load_trajectory(REPO / "trajectories" / "aba.yaml")
    plan = plan_actions(traj, 20)
    assert plan.keyboard.shape == (12 * 20 - 3, 4)
    assert torch.equal(plan.keyboard[189:], torch.tensor([[0, 1.0, 0, 0]]).expand(48, 4))
    assert plan.waypoints == [(0, "A"), (8, "B"), (16, "A")]
    assert plan.chunk_actions[16:] == ["back"] * 4
    assert plan.notes == ["trajectory covers 16 chunks; 20 requested: its last segment (back) "
                          "repeats for 4 more chunks"]


def test_plan_truncates_and_drops_late_waypoints():
    traj = load_trajectory(REPO / "trajectories" / "aba.yaml")
    plan = plan_actions(traj, 8)
    assert plan.keyboard.shape == (93, 4) and plan.chunk_actions == ["forward"] * 8
    assert plan.waypoints == [(0, "A"), (8, "B")]  # B sits exactly at the end row
    assert any("truncated to 8 chunks" in n for n in plan.notes)
    assert any("dropped: A (chunk 16)" in n for n in plan.notes)
    assert plan_actions(traj, 3).waypoints == [(0, "A")]


def test_plan_segments_in_frames_across_chunk_boundaries():
    traj = parse_trajectory(doc("universal", "{label: A, action: forward, frames: 10}",
                                "{label: B, action: left, frames: 15}", "{label: C}"))
    assert traj.num_frames == 25 and traj.num_chunks == 3
    plan = plan_actions(traj)
    assert plan.chunk_actions == ["forward", "forward>left", "left"]
    assert plan.waypoints == [(0, "A"), (1, "B"), (2, "C")]
    assert plan.keyboard[:10, 0].eq(1).all() and plan.keyboard[10:, 2].eq(1).all()
    assert any("ends at pixel frame 25" in n for n in plan.notes)


def test_chunks_after_unaligned_frames_keep_twelve_rows():
    traj = parse_trajectory(doc("universal", "{action: forward, frames: 5}",
                                "{action: back, chunks: 2}"))
    assert [s.num_frames for s in traj.segments] == [5, 24]


@pytest.mark.parametrize("bad", [0, -3, True, 2.0, "4"])
def test_plan_rejects_bad_chunk_counts(bad):
    traj = parse_trajectory(doc("universal", "{action: forward, chunks: 1}"))
    with pytest.raises(InputError):
        plan_actions(traj, bad)


# --------------------------------------------------------------------------- errors

ERRORS = [
    # (text, line, field, substring of the problem)
    ("", 1, "mode", "empty document"),
    ("- 1\n- 2\n", 1, "document", "expected a mapping"),
    ("segments: []\n", 1, "mode", "required"),
    ("mode: universal\n", 1, "segments", "required"),
    ("mode: flying\nsegments: []\n", 1, "mode", "unknown mode"),
    ("mode: universal\nmode: universal\nsegments: []\n", 2, "mode", "duplicate key"),
    ("mode: universal\nspeed: 2\nsegments: []\n", 2, "document", "unknown key 'speed'"),
    ("mode: universal\nsegments: []\n", 2, "segments", "must not be empty"),
    ("mode: universal\nsegments: {a: 1}\n", 2, "segments", "expected a list"),
    ("mode: universal\nseed: -1\nsegments: [{action: idle, chunks: 1}]\n", 2, "seed", "[0,"),
    ("mode: universal\nseed: yes\nsegments: [{action: idle, chunks: 1}]\n", 2, "seed", "integer"),
    ("mode: universal\nimage: 3\nsegments: [{action: idle, chunks: 1}]\n", 2, "image", "string"),
    ("mode: universal\nsegments:\n  - action: forward\n    chunks: 1\n    chunks: 2\n", 5,
     "segments[0].chunks", "duplicate key (first on line 4)"),
    (doc("universal", "{action: forward+back, chunks: 1}"), 3, "segments[0].action", "contradict"),
    (doc("universal", "{action: left+right, chunks: 1}"), 3, "segments[0].action", "contradict"),
    (doc("universal", "{action: camera_l+camera_r, chunks: 1}"), 3, "segments[0].action",
     "contradict"),
    (doc("universal", "{action: forward+forward, chunks: 1}"), 3, "segments[0].action",
     "repeated"),
    (doc("universal", "{action: idle+forward, chunks: 1}"), 3, "segments[0].action", "idle"),
    (doc("universal", "{action: 'forward+', chunks: 1}"), 3, "segments[0].action", "empty"),
    (doc("universal", "{action: jump, chunks: 1}"), 3, "segments[0].action", "not valid in"),
    (doc("universal", "{action: fly, chunks: 1}"), 3, "segments[0].action", "unknown action"),
    (doc("universal", "{action: 5, chunks: 1}"), 3, "segments[0].action", "string"),
    (doc("gta_drive", "{action: camera_up, chunks: 1}"), 3, "segments[0].action", "not valid"),
    (doc("gta_drive", "{action: left+camera_l, chunks: 1}"), 3, "segments[0].action", "yaw"),
    (doc("gta_drive", "{keys: [A], chunks: 1}"), 3, "segments[0].keys", "unknown key"),
    (doc("gta_drive", "{mouse: [0.1, 0], chunks: 1}"), 3, "segments[0].mouse", "pitch must be 0"),
    (doc("templerun", "{action: jump+slide, chunks: 1}"), 3, "segments[0].action", "one-hot"),
    (doc("templerun", "{keys: [W, S], chunks: 1}"), 3, "segments[0].keys", "one-hot"),
    (doc("templerun", "{keys: [], chunks: 1}"), 3, "segments[0].keys", "one-hot"),
    (doc("templerun", "{keys: [W], mouse: [0, 0], chunks: 1}"), 3, "segments[0].mouse",
     "no mouse"),
    (doc("templerun", "{action: camera_l, chunks: 1}"), 3, "segments[0].action", "not valid"),
    (doc("universal", "{keys: [W, S], chunks: 1}"), 3, "segments[0].keys", "contradict"),
    (doc("universal", "{keys: [W, w], chunks: 1}"), 3, "segments[0].keys", "repeated"),
    (doc("universal", "{keys: W, chunks: 1}"), 3, "segments[0].keys", "expected a list"),
    (doc("universal", "{mouse: [0, 1.5], chunks: 1}"), 3, "segments[0].mouse", "[-1, 1]"),
    (doc("universal", "{mouse: [0, .nan], chunks: 1}"), 3, "segments[0].mouse", "finite"),
    (doc("universal", "{mouse: [0, .inf], chunks: 1}"), 3, "segments[0].mouse", "finite"),
    (doc("universal", "{mouse: [0], chunks: 1}"), 3, "segments[0].mouse", "[pitch, yaw]"),
    (doc("universal", "{mouse: [true, 0], chunks: 1}"), 3, "segments[0].mouse", "number"),
    (doc("universal", "{action: forward, keys: [W], chunks: 1}"), 3, "segments[0].keys",
     "not both"),
    (doc("universal", "{action: forward, chunks: 0}"), 3, "segments[0].chunks", "[1,"),
    (doc("universal", "{action: forward, frames: -2}"), 3, "segments[0].frames", "[1,"),
    (doc("universal", "{action: forward, chunks: true}"), 3, "segments[0].chunks", "integer"),
    (doc("universal", "{action: forward, chunks: 1.5}"), 3, "segments[0].chunks", "integer"),
    (doc("universal", "{action: forward, chunks: 1, frames: 9}"), 3, "segments[0].frames",
     "not both"),
    (doc("universal", "{action: forward}"), 3, "segments[0]", "needs a length"),
    (doc("universal", "{chunks: 2}"), 3, "segments[0]", "needs an action"),
    (doc("universal", "{}"), 3, "segments[0]", "empty segment"),
    (doc("universal", "forward"), 3, "segments[0]", "expected a mapping"),
    (doc("universal", "{action: forward, chunks: 1, speed: 2}"), 3, "segments[0]",
     "unknown key 'speed'"),
    (doc("universal", "{action: forward, chunks: 1, 'a: b': 2}"), 3, "segments[0]",
     "unknown key 'a: b'"),
    (doc("universal", "{label: A}"), 3, "segments", "no segment has a length"),
    (doc("universal", "{label: on, action: forward, chunks: 1}"), 3, "segments[0].label",
     "quote it"),
    (doc("universal", "{label: '', action: forward, chunks: 1}"), 3, "segments[0].label",
     "non-empty"),
    (doc("universal", "{action: forward, chunks: 1}", "{action: back, chunks: 100000}"), 4,
     "segments[1].chunks", "longer than"),
    (doc("universal", "{action: forward, chunks: 1}", "{<<: {chunks: 1}, action: back}"), 4,
     "segments[1]", "merge keys"),
    ("mode: universal\nseed: 2001-13-45\nsegments: []\n", 2, "seed", "invalid value"),
    ("mode: !!bool maybe\n", 1, "mode", "invalid value"),
    ("mode: !!python/object:os.system x\n", 1, "mode", "invalid value"),
    ("mode: universal\nsegments: !!set {a: null}\n", 2, "segments", "expected a list"),
    ("mode: universal\nsegments: [\n", 3, "yaml", ""),
    ("mode: universal\n  bad indent: 1\n", 2, "yaml", ""),
    ("mode: universal\n---\nmode: universal\n", 2, "yaml", "single document"),
    ("mode: universal\nsegments: *nowhere\n", 2, "yaml", "undefined alias"),
    ("mode: universal\nimage: \x07\n", 2, "yaml", "#x0007"),
    ("[" * 5000, 1, "yaml", "nested too deeply"),
]


@pytest.mark.parametrize("text, line, field, problem", ERRORS,
                         ids=[f"{e[2]}-{i}" for i, e in enumerate(ERRORS)])
def test_errors_name_file_line_and_field(text, line, field, problem):
    with pytest.raises(TrajectoryError) as info:
        parse_trajectory(text, source="t.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"t.yaml:{line}: {field}: "), message
    assert problem in message, message


def test_load_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(TrajectoryError, match=re.escape(str(missing))):
        load_trajectory(missing)
    with pytest.raises(TrajectoryError, match=re.escape(str(tmp_path))):
        load_trajectory(tmp_path)  # a folder
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"mode: \xff\xfe\n")
    with pytest.raises(TrajectoryError, match="not UTF-8"):
        load_trajectory(binary)
    bad = tmp_path / "bad.yaml"
    bad.write_text(doc("universal", "{action: fly, chunks: 1}"))
    with pytest.raises(TrajectoryError, match=re.escape(f"{bad}:3: segments[0].action:")):
        load_trajectory(bad)


# --------------------------------------------------------------------------- fuzzing

_ACTIONS = {
    "universal": ["forward", "back", "left", "right", "camera_l", "camera_r", "camera_up",
                  "camera_down", "idle", "forward+camera_l", "back+right+camera_up",
                  "left+camera_down"],
    "gta_drive": ["forward", "back", "left", "right", "camera_l", "idle", "forward+right",
                  "back+camera_l"],
    "templerun": ["idle", "jump", "slide", "turn_left", "turn_right", "left", "right"],
}
_PROMPTS = st.text("abc xyz,.é", min_size=1, max_size=30).filter(str.strip)
_LABELS = st.none() | st.text("ABCXYZ0123_", min_size=1, max_size=4)


@st.composite
def valid_segments(draw, mode):
    spec = MODES[mode]
    seg: dict = {}
    label = draw(_LABELS)
    if label is not None:
        seg["label"] = label
    kind = draw(st.sampled_from(["action", "explicit", "marker"] if label else
                                ["action", "explicit"]))
    if kind == "marker":
        return seg
    if mode == "text":  # prompt segments: a prompt (or the top-level one) and whole chunks
        if draw(st.booleans()):
            seg["prompt"] = draw(_PROMPTS)
        seg["chunks"] = draw(st.integers(1, 6))
        return seg
    if kind == "action":
        seg["action"] = draw(st.sampled_from(_ACTIONS[mode]))
    elif spec.one_hot:
        seg["keys"] = [draw(st.sampled_from(spec.key_letters))]
    else:
        keys = draw(st.lists(st.sampled_from(spec.key_letters), unique=True, max_size=2))
        if not any(set(spec.key_letters[a] + spec.key_letters[b]) <= set(keys)
                   for a, b in spec.exclusive_keys):
            seg["keys"] = keys
        unit = st.floats(-1, 1, allow_nan=False)
        seg["mouse"] = [draw(unit) if spec.pitch else 0.0, draw(unit)]
    if draw(st.booleans()):
        seg["chunks"] = draw(st.integers(1, 6))
    else:
        seg["frames"] = draw(st.integers(1, 80))
    return seg


@st.composite
def valid_documents(draw):
    mode = draw(st.sampled_from(sorted(MODES)))
    segments = draw(st.lists(valid_segments(mode), min_size=1, max_size=8))
    if not any("chunks" in s or "frames" in s for s in segments):
        segments.append({"prompt": "a scene", "chunks": 1} if mode == "text" else
                        {"action": _ACTIONS[mode][0], "frames": draw(st.integers(1, 30))})
    document = {"mode": mode, "segments": segments}
    if mode == "text" and draw(st.booleans()):
        document["prompt"] = draw(_PROMPTS)
    if draw(st.booleans()):
        document["seed"] = draw(st.integers(0, 2**32))
    return document


def _expected_frames(segments) -> list[int]:
    frames, start = [], 0
    for seg in segments:
        if "chunks" in seg:
            n = 12 * seg["chunks"] - (3 if start == 0 else 0)
        else:
            n = seg.get("frames", 0)
        frames.append(n)
        start += n
    return frames


@FUZZ
@given(valid_documents(), st.integers(1, 12))
def test_fuzz_valid_documents_parse_and_plan(document, extra_chunks):
    text = yaml.safe_dump(document, sort_keys=False)
    traj = parse_trajectory(text, source="fuzz.yaml")
    expected = _expected_frames(document["segments"])
    assert [s.num_frames for s in traj.segments] == expected
    assert traj.num_frames == sum(expected)
    assert frames_for_chunks(traj.num_chunks) >= traj.num_frames
    assert traj.num_chunks == 1 or frames_for_chunks(traj.num_chunks - 1) < traj.num_frames

    spec = MODES[traj.mode]
    for num_chunks in (None, extra_chunks):
        plan = plan_actions(traj, num_chunks)
        rows = 12 * plan.num_chunks - 3
        assert plan.keyboard.shape == (rows, spec.keyboard_dim)
        assert plan.mouse is None or plan.mouse.shape == (rows, 2)
        assert len(plan.chunk_actions) == plan.num_chunks
        assert [c for c, _ in plan.waypoints] == sorted(c for c, _ in plan.waypoints)
        assert all(0 <= c <= plan.num_chunks for c, _ in plan.waypoints)
        start = 0
        for seg in traj.segments:  # every row holds its segment's action
            end = min(start + seg.num_frames, rows)
            if start < end:
                assert torch.equal(plan.keyboard[start:end],
                                   torch.tensor(seg.keyboard).expand(end - start, -1))
            start += seg.num_frames
        if spec.one_hot:
            assert torch.equal(plan.keyboard.sum(1), torch.ones(rows))
        if traj.mode == "text":  # each chunk's prompt is its segment's (None: the default), the last repeating
            owned = [s.prompt for s in traj.segments if s.num_frames for _ in range(round((s.num_frames + 3) / 12))]
            want = (owned + [owned[-1]] * plan.num_chunks)[:plan.num_chunks]
            assert plan.prompts == want
        else:
            assert plan.prompts is None


def _parse_or_trajectory_error(text: str) -> None:
    try:
        traj = parse_trajectory(text, source="fuzz.yaml")
    except TrajectoryError as err:
        assert re.match(r"^fuzz\.yaml:\d+: [^:\n]+: [^\n]*$", str(err)), str(err)
        return
    plan_actions(traj, min(traj.num_chunks, 50))


_TOKENS = st.sampled_from([
    "mode", "universal", "gta_drive", "templerun", "segments", "action", "keys", "mouse",
    "chunks", "frames", "label", "seed", "image", "forward", "back+left", "camera_l", "jump",
    ": ", ":", "- ", "-", "\n", "\n  ", "\n    ", " ", "[", "]", "{", "}", ",", "'", '"', "#",
    "&a ", "*a", "!!int ", "!!str ", "!!bool ", "!!binary ", "!!timestamp ", "!!set ",
    "!!python/object:os.system ", "!foo ", "<<", "? ", "|", ">", "%YAML 1.1\n", "---\n", "...\n",
    "0", "1", "12", "-1", "0.1", ".nan", ".inf", "yes", "null", "~", "1e400", "0x1F", "2001-13-45",
    "W", "A", "\t", "\x00", "\ufeff", "é",
])


@FUZZ
@given(st.lists(_TOKENS, max_size=40).map("".join))
def test_fuzz_token_soup_raises_only_trajectory_error(text):
    _parse_or_trajectory_error(text)


@FUZZ
@given(st.text(max_size=200))
def test_fuzz_random_text_raises_only_trajectory_error(text):
    _parse_or_trajectory_error(text)


_SCALARS = (st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats()
            | st.text(max_size=12) | st.sampled_from(["forward", "W", "universal", "A"]))
_KEYS = st.sampled_from(["mode", "segments", "action", "keys", "mouse", "chunks", "frames",
                         "label", "seed", "image", "other"]) | st.text(max_size=6)
_STRUCTURES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(_KEYS, inner, max_size=5), max_leaves=25)


@FUZZ
@given(_STRUCTURES)
def test_fuzz_random_structures_raise_only_trajectory_error(structure):
    _parse_or_trajectory_error(yaml.safe_dump(structure))


@FUZZ
@given(valid_documents(), st.data())
def test_fuzz_mutated_documents_raise_only_trajectory_error(document, data):
    segment = data.draw(st.sampled_from(document["segments"]))
    key = data.draw(_KEYS)
    segment[key] = data.draw(_STRUCTURES)
    _parse_or_trajectory_error(yaml.safe_dump(document, sort_keys=False))
