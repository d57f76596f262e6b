"""Run outputs: streaming MP4 (incl. killed writers), JSONL records, atomic JSON, run folder."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from worldtrace_cli.errors import OutputError
from worldtrace_cli.outputs import (
    JsonlWriter,
    VideoStreamWriter,
    probe_video,
    read_jsonl,
    read_video_frames,
    to_jsonable,
    write_json_atomic,
)

REPO = Path(__file__).resolve().parents[1]
H, W = 96, 176
CHUNK_FRAMES = (9, 12, 12)  # pixel frames decoded from MG2 chunks 0, 1, 2


def gradient(first: int, count: int, height: int = H, width: int = W) -> np.ndarray:
    """uint8 [count, height, width, 3]: a horizontal gradient sliding 4 levels per frame."""
    x = np.arange(width)[None, :] * 200 // max(width - 1, 1)
    y = np.arange(height)[:, None] * 200 // max(height - 1, 1)
    t = np.arange(first, first + count)[:, None, None]
    out = np.empty((count, height, width, 3), np.uint8)
    out[..., 0] = (x + 4 * t) % 200 + 20  # stays inside [20, 220): no wrap at 255
    out[..., 1] = np.broadcast_to(y + 20, (count, height, width))
    out[..., 2] = 128
    return out


def three_chunks() -> np.ndarray:
    return gradient(0, sum(CHUNK_FRAMES))


# --------------------------------------------------------------------------- video


def test_video_round_trip(tmp_path):
    frames = three_chunks()
    path = tmp_path / "video.mp4"
    with VideoStreamWriter(path, W, H) as writer:
        start = 0
        for count in CHUNK_FRAMES:
            writer.write(frames[start:start + count])
            start += count
        assert writer.frames_written == 33
    assert probe_video(path) == {"frames": 33, "fps": 25.0, "width": W, "height": H}
    decoded = read_video_frames(path)
    assert decoded.shape == frames.shape and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(np.int16) - frames).mean() < 3


def test_video_accepts_torch_pads_odd_sizes_and_closes_twice(tmp_path):
    path = tmp_path / "odd.mp4"
    # Flat frames: at 33x17, chroma subsampling blurs any gradient more than the check allows.
    frames = np.repeat(np.arange(40, 220, 20, dtype=np.uint8), 17 * 33 * 3).reshape(9, 17, 33, 3)
    writer = VideoStreamWriter(path, 33, 17, fps=12.5)
    writer.write(torch.from_numpy(frames))
    writer.write(np.zeros((0, 17, 33, 3), np.uint8))  # nothing to add
    writer.close()
    writer.close()
    assert (writer.encoded_width, writer.encoded_height) == (34, 18)
    assert probe_video(path) == {"frames": 9, "fps": 12.5, "width": 34, "height": 18}
    decoded = read_video_frames(path)
    # The padding repeats the last row/column; the original area is kept.
    assert np.abs(decoded[:, :17, :33].astype(np.int16) - frames).mean() < 3


def test_video_rejects_wrong_frames_and_writes_after_close(tmp_path):
    with VideoStreamWriter(tmp_path / "v.mp4", W, H) as writer:
        with pytest.raises(ValueError, match="uint8"):
            writer.write(np.zeros((2, H, W, 3), np.float32))
        with pytest.raises(ValueError):
            writer.write(np.zeros((2, W, H, 3), np.uint8))
        with pytest.raises(ValueError):
            writer.write(np.zeros((H, W, 3), np.uint8))
        writer.write(gradient(0, 2))
    with pytest.raises(ValueError, match="closed"):
        writer.write(gradient(0, 1))


def test_video_errors_are_output_errors(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    with pytest.raises(OutputError, match=str(regular)):
        VideoStreamWriter(regular / "video.mp4", W, H)
    with pytest.raises(OutputError, match="no such file"):
        probe_video(tmp_path / "missing.mp4")
    with pytest.raises(OutputError, match="cannot read video"):
        read_video_frames(regular)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_video_disk_full_is_an_output_error():
    with pytest.raises(OutputError, match="/dev/full"):
        with VideoStreamWriter("/dev/full", W, H) as writer:
            for _ in range(20):
                writer.write(gradient(0, 12))


# --------------------------------------------------------------------------- killed writers

_KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from worldtrace_cli.errors import OutputError
    from worldtrace_cli.outputs import JsonlWriter, VideoStreamWriter, read_video_frames
    video, records, kill_ffmpeg = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    writer = VideoStreamWriter(video, {W}, {H})
    jsonl = JsonlWriter(records)
    for chunk, count in enumerate({CHUNK_FRAMES}):
        writer.write(np.full((count, {H}, {W}, 3), 40 + 50 * chunk, np.uint8))
        jsonl.write({{"chunk": chunk, "frames": count}})
    print(writer.ffmpeg_pid, flush=True)
    if kill_ffmpeg:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until ffmpeg has written its first fragment
            try:
                if len(read_video_frames(video)) >= {FIRST}:
                    break
            except OutputError:  # nothing decodable yet
                pass
            time.sleep(0.05)
        os.kill(writer.ffmpeg_pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
""").format(W=W, H=H, CHUNK_FRAMES=CHUNK_FRAMES, FIRST=CHUNK_FRAMES[0])


def _wait_for_exit(pid: int, timeout_seconds: float = 20.0) -> None:
    """Wait for a process that is not our child (the orphaned ffmpeg) to exit."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):  # exited; its new parent has not reaped it yet
            return
        time.sleep(0.02)
    raise AssertionError(f"ffmpeg {pid} still running after {timeout_seconds} s")


def _run_killed_writer(tmp_path: Path, kill_ffmpeg: bool) -> tuple[Path, Path]:
    video, records = tmp_path / "video.mp4", tmp_path / "chunks.jsonl"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                   os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(video), str(records),
                             "1" if kill_ffmpeg else "0"], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == -9, result.stderr
    _wait_for_exit(int(result.stdout.split()[0]))
    return video, records


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="polls /proc for the orphaned ffmpeg")
def test_killed_python_keeps_video_and_records(tmp_path):
    video, records = _run_killed_writer(tmp_path, kill_ffmpeg=False)
    # ffmpeg outlives Python, sees end of input and finishes the file: nothing is lost.
    frames = read_video_frames(video)
    assert frames.shape[0] == 33 and probe_video(video)["frames"] == 33
    assert abs(int(frames[0].mean()) - 40) <= 2 and abs(int(frames[-1].mean()) - 140) <= 2
    assert read_jsonl(records) == [{"chunk": c, "frames": n} for c, n in enumerate(CHUNK_FRAMES)]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="polls /proc for the orphaned ffmpeg")
def test_killed_python_and_ffmpeg_keep_finished_fragments(tmp_path):
    video, records = _run_killed_writer(tmp_path, kill_ffmpeg=True)
    frames = read_video_frames(video)
    assert frames.shape[0] >= CHUNK_FRAMES[0]
    assert abs(int(frames[0].mean()) - 40) <= 2
    assert len(read_jsonl(records)) == 3


# --------------------------------------------------------------------------- JSON


@dataclasses.dataclass(frozen=True)
class _Config:
    budget: int
    path: Path


def test_to_jsonable_converts_numpy_torch_paths_and_non_finite():
    record = {
        "i": np.int64(3), "f": np.float32(0.5), "b": np.bool_(True), "nan": float("nan"),
        "inf": np.float64("inf"), "arr": np.arange(3), "t": torch.tensor([1.5, float("nan")]),
        "scalar": torch.tensor(2), "path": Path("/a/b"), "tuple": (1, (2, 3)),
        "config": _Config(4, Path("x")), 5: "int key",
    }
    assert to_jsonable(record) == {
        "i": 3, "f": 0.5, "b": True, "nan": None, "inf": None, "arr": [0, 1, 2],
        "t": [1.5, None], "scalar": 2, "path": "/a/b", "tuple": [1, [2, 3]],
        "config": {"budget": 4, "path": "x"}, "5": "int key",
    }
    with pytest.raises(TypeError):
        to_jsonable({"x": object()})


def test_jsonl_round_trip_append_and_truncated_tail(tmp_path):
    path = tmp_path / "chunks.jsonl"
    with JsonlWriter(path) as writer:
        writer.write({"chunk": 0, "loss": float("nan")})
        writer.write({"chunk": 1, "slots": [np.int32(4)]})
    assert read_jsonl(path) == [{"chunk": 0, "loss": None}, {"chunk": 1, "slots": [4]}]

    with path.open("a") as f:  # a record cut off by a kill
        f.write('{"chunk": 2, "sl')
    assert read_jsonl(path) == [{"chunk": 0, "loss": None}, {"chunk": 1, "slots": [4]}]

    with JsonlWriter(path, append=True) as writer:  # continues after dropping the partial line
        writer.write({"chunk": 2})
    assert [r["chunk"] for r in read_jsonl(path)] == [0, 1, 2]

    with JsonlWriter(path) as writer:  # append=False starts over
        writer.write({"chunk": 9})
    assert read_jsonl(path) == [{"chunk": 9}]


def test_read_jsonl_rejects_a_bad_middle_line(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(OutputError, match=r"x\.jsonl:2:"):
        read_jsonl(path)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(OutputError, match="object"):
        read_jsonl(path)
    path.write_bytes(b'{"a": 1}\n{"b": "\xc3')  # cut inside a UTF-8 character
    assert read_jsonl(path) == [{"a": 1}]
    with pytest.raises(OutputError, match="missing"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_jsonl_errors_are_output_errors(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    with pytest.raises(OutputError, match=str(regular)):
        JsonlWriter(regular / "chunks.jsonl")
    if Path("/dev/full").exists():  # a full disk: the write itself fails
        writer = JsonlWriter("/dev/full")
        with pytest.raises(OutputError, match="/dev/full"):
            writer.write({"chunk": 0})


def test_write_json_atomic(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"score": np.float32(0.25), "bad": float("nan")})
    assert json.loads(path.read_text()) == {"score": 0.25, "bad": None}
    write_json_atomic(path, {"score": 1}, indent=None)
    assert path.read_text() == '{"score": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temp file left
    regular = tmp_path / "file"
    regular.write_text("x")
    with pytest.raises(OutputError, match=str(regular)):
        write_json_atomic(regular / "summary.json", {})




def test_a_full_disk_leaves_no_zero_byte_or_torn_timeline(tmp_path, monkeypatch):
    """Issue 15: disk full while drawing left a 0-byte cache_timeline.png that looked valid. The PNG
    is written under a temporary name and renamed: a failed write leaves the old file (or none)."""
    import errno

    import matplotlib.figure

    from worldtrace_cli.outputs.timeline import plot_cache_timeline

    from worldtrace_cli.memory.slots import Slot
    from worldtrace_cli.outputs.records import slot_records

    records = [{"chunk": c, "cache": {"writer": "sliding", "positions": "actual", "events": [],
                                      "slots": slot_records([Slot("past", (c,), "recent")], [-1.0], c + 1, [8], [64])}}
               for c in range(3)]
    path = tmp_path / "cache_timeline.png"
    plot_cache_timeline(records, path)
    good = path.read_bytes()
    assert good.startswith(b"\x89PNG")

    def full_disk(self, fname, **kw):
        Path(fname).write_bytes(b"\x89PNG half")  # some bytes reached the disk, then it filled up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full_disk)
    with pytest.raises(OutputError, match="cache_timeline.png: No space left on device"):
        plot_cache_timeline(records, path)
    assert path.read_bytes() == good  # the previous timeline, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache_timeline.png"]  # no temporary left
    path.unlink()
    with pytest.raises(OutputError):
        plot_cache_timeline(records, path)
    assert not any(tmp_path.iterdir())  # never a zero-byte or torn file under the real name


def test_atomic_path_keeps_the_old_file_when_the_writer_fails(tmp_path):
    from worldtrace_cli.outputs import atomic_path

    path = tmp_path / "compare.md"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".md" and tmp != path
            tmp.write_text("half")
            raise RuntimeError("killed midway")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["compare.md"]
    with atomic_path(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["compare.md"]


def test_ffmpeg_messages_are_cut_at_a_word_boundary():
    """Issue 15: ffmpeg's reasons were quoted cut mid-word."""
    from worldtrace_cli.outputs import tail_words

    text = "ffmpeg banner " + "word " * 100 + "Error writing trailer: No space left on device"
    cut = tail_words(text, 60)
    assert len(cut) <= 60 and cut.startswith("... ") and cut.endswith("No space left on device")
    assert all(w in ("...", "word") or w in text.split() for w in cut.split())
    assert tail_words("short  message\n", 60) == "short message"


def test_a_timeline_of_hundreds_of_slots_stays_a_bounded_picture(tmp_path):
    """Issue 15: stopping a long `full` run drew a 98-inch-tall cache_timeline.png (one labelled row
    per slot), which took ~450 MB at the stop. Beyond 32 slots the figure keeps its height."""
    from PIL import Image

    from worldtrace_cli.memory.slots import Slot
    from worldtrace_cli.outputs.records import slot_records
    from worldtrace_cli.outputs.timeline import LABELLED_SLOTS, plot_cache_timeline

    def record(c, n):
        slots = [Slot("past", (f,), "recent") for f in range(n)]
        return {"chunk": c, "cache": {"writer": "full", "positions": "actual", "events": [],
                                      "slots": slot_records(slots, [float(f - n) for f in range(n)], n, [8] * n, [64] * n)}}

    small, big = tmp_path / "small.png", tmp_path / "big.png"
    plot_cache_timeline([record(c, 3 * c) for c in range(1, 11)], small)  # 27 slots: one row each
    plot_cache_timeline([record(c, 3 * c) for c in range(1, 101)], big)   # 297 slots
    h_small, h_big = Image.open(small).size[1], Image.open(big).size[1]
    assert 27 < LABELLED_SLOTS and h_small < h_big <= 100 * (1.2 + 0.35 * LABELLED_SLOTS) + 1
