"""The run folder (worldtrace_cli.runs.RunFolder): prepare, status, the exclusive lock between real
processes, and the consistency check that `worldtrace metrics` runs before trusting a folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from worldtrace_cli.errors import FolderBusy, FolderInconsistent, OutputError
from worldtrace_cli.outputs import VideoStreamWriter, write_json_atomic
from worldtrace_cli.runs import RunFolder
from worldtrace_cli.trajectory import frames_for_chunks

ROOT = Path(__file__).resolve().parents[1]


def test_prepare_refuses_runs_and_overwrite_clears_them(tmp_path):
    folder = RunFolder(tmp_path / "a" / "b").prepare(overwrite=False)
    assert folder.path.is_dir() and folder.status() == "empty"
    folder.chunks.write_text('{"chunk": 0}\n')  # an interrupted run: never deleted silently
    (folder.path / "notes.txt").write_text("mine")
    assert folder.status() == "partial"
    with pytest.raises(OutputError, match="holds an unfinished run .use --overwrite"):
        folder.prepare(overwrite=False)
    assert folder.chunks.exists()
    folder.prepare(overwrite=True)
    assert not folder.chunks.exists() and (folder.path / "notes.txt").exists()

    write_json_atomic(folder.summary_path, {"status": "complete"})  # a finished run: refused
    assert folder.status() == "complete"
    with pytest.raises(OutputError, match="already holds a finished run .use --overwrite."):
        folder.prepare(overwrite=False)
    (folder.state).mkdir()
    (folder.state / "state.json").write_text("{}")
    (folder.state / ".worldtrace-state").write_bytes(b"")  # the mark every saved state carries
    folder.summary_path.unlink()
    assert folder.status() == "resumable"
    with pytest.raises(OutputError, match="generate --resume"):
        folder.prepare(overwrite=False)
    folder.prepare(overwrite=True)
    assert folder.status() == "empty" and not folder.state.exists()


def test_a_run_that_ended_before_its_first_chunk_does_not_block_a_rerun(tmp_path):
    """Issue 15: a cap reached at once left a 0-frame video that made the rerun ask for --overwrite."""
    folder = RunFolder(tmp_path / "run").prepare(overwrite=False)
    VideoStreamWriter(folder.video, 32, 16).close()  # ffmpeg's header, no frame
    folder.chunks.write_text("")
    write_json_atomic(folder.summary_path, {"status": "failed", "totals": {"chunks": 0}})
    assert folder.status() == "empty"
    folder.prepare(overwrite=False)  # nothing generated to lose: replaced
    assert not folder.video.exists() and not folder.summary_path.exists()
    write_json_atomic(folder.summary_path, {"status": "failed", "totals": {"chunks": 1}})
    folder.chunks.write_text('{"chunk": 0}\n')
    with pytest.raises(OutputError, match="unfinished run"):  # a chunk was made: kept
        folder.prepare(overwrite=False)


def test_prepare_errors_name_the_path(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    with pytest.raises(OutputError, match=str(regular)):
        RunFolder(regular).prepare(overwrite=False)
    with pytest.raises(OutputError, match=str(regular)):
        RunFolder(regular / "run").prepare(overwrite=True)


_HOLDER = """
import sys, time
from worldtrace_cli.runs import RunFolder
with RunFolder(sys.argv[1]).lock("holder-test"):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_lock_excludes_a_second_process_and_is_freed_when_its_holder_is_killed(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(FolderBusy, match=rf"pid {proc.pid}, holder-test") as err:
            with RunFolder(tmp_path / "run").lock():
                pass
        assert err.value.exit_code == 6
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with RunFolder(tmp_path / "run").lock():  # the kernel released the killed holder's lock
        pass


_ENCODING_HOLDER = """
import sys, time
import numpy as np
from worldtrace_cli.outputs import VideoStreamWriter
from worldtrace_cli.runs import RunFolder
folder = RunFolder(sys.argv[1])
with folder.lock("encoder-test"):
    video = VideoStreamWriter(folder.video, 32, 16, pass_fds=(folder.lock_fd,))
    video.write(np.zeros((12, 16, 32, 3), np.uint8))
    print(video.ffmpeg_pid, flush=True)
    time.sleep(60)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="waits for the orphaned ffmpeg through /proc")
def test_the_folder_stays_locked_until_a_killed_runs_ffmpeg_finished_the_video(tmp_path):
    """After a SIGKILL the orphaned ffmpeg still finishes video.mp4; a resume or metrics taking the
    folder at that moment would cut or join a file still being written. ffmpeg inherits the lock."""
    folder = RunFolder(tmp_path / "run")
    proc = subprocess.Popen([sys.executable, "-c", _ENCODING_HOLDER, str(folder.path)], stdout=subprocess.PIPE,
                            text=True)
    ffmpeg = int(proc.stdout.readline())
    os.kill(ffmpeg, signal.SIGSTOP)  # hold the orphan mid-write
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with pytest.raises(FolderBusy):
            with folder.lock():
                pass
    finally:
        os.kill(ffmpeg, signal.SIGCONT)
    for _ in range(400):  # it sees the end of its input and finishes the file
        if not Path(f"/proc/{ffmpeg}").exists() or Path(f"/proc/{ffmpeg}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    with folder.lock():
        pass
    from worldtrace_cli.outputs import probe_video

    assert probe_video(folder.video)["frames"] == 12


def _write_run(folder: RunFolder, chunks: int, records: list[int] | None = None, video_chunks: int | None = None):
    folder.make()
    video = VideoStreamWriter(folder.video, 32, 16, 25.0)
    video.write(np.zeros((frames_for_chunks(chunks if video_chunks is None else video_chunks), 16, 32, 3), np.uint8))
    video.close()
    ids = list(range(chunks)) if records is None else records
    folder.chunks.write_text("".join(json.dumps({"chunk": c}) + "\n" for c in ids))


def test_check_accepts_a_run_and_reports_a_torn_tail(tmp_path):
    folder = RunFolder(tmp_path / "run")
    _write_run(folder, 2)
    info = folder.check(frames_for_chunks)
    assert info == {"status": "partial", "chunks": 2, "video_frames": 21, "torn_tail": False, "notes": []}
    with folder.chunks.open("a") as fh:
        fh.write('{"chunk": 2, "cut')  # a writer killed mid-record
    info = folder.check(frames_for_chunks)
    assert info["chunks"] == 2 and info["torn_tail"] and "torn" in info["notes"][0]


@pytest.mark.parametrize("records, video_chunks, message", [
    ([0, 1, 0, 1], 2, "record 3 is chunk 0 .repeated."),      # two runs appended to one folder
    ([0, 2], 3, "record 2 is chunk 2 .out of order."),
    ([0, 1, 2], 2, "the video has 21 pixel frames but 3 chunk records cover 33"),
])
def test_check_refuses_contradictions(tmp_path, records, video_chunks, message):
    folder = RunFolder(tmp_path / "run")
    _write_run(folder, len(records), records, video_chunks)
    with pytest.raises(FolderInconsistent, match=message) as err:
        folder.check(frames_for_chunks)
    assert err.value.exit_code == 7


def test_check_joins_the_video_part_a_killed_resume_left(tmp_path):
    """Issue 15: after a kill during a resumed run, video.mp4 lagged the records (the new chunks sat
    in video.part.mp4 until the next resume). Whoever reads or takes the folder joins them first;
    while a run holds the folder the part is left alone and counted."""
    folder = RunFolder(tmp_path / "run")
    _write_run(folder, 3, video_chunks=2)  # video.mp4: chunks 0-1 (21 frames); records 0-2
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder.path)], stdout=subprocess.PIPE, text=True)
    try:  # a running resume: nothing is touched, both files count
        assert proc.stdout.readline().strip() == "locked"
        part = VideoStreamWriter(folder.video_part, 32, 16, 25.0)  # the resumed run's chunk 2
        part.write(np.full((12, 16, 32, 3), 200, np.uint8))
        part.close()
        assert folder.check(frames_for_chunks)["video_frames"] == 33 and folder.video_part.is_file()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    info = folder.check(frames_for_chunks)  # the holder was killed: the part joins video.mp4
    assert info["video_frames"] == 33 and not folder.video_part.exists()
    from worldtrace_cli.outputs import probe_video, read_video_frames

    assert probe_video(folder.video)["frames"] == 33
    assert read_video_frames(folder.video, indices=[32])[0].mean() > 150  # the part's frames are at the end
    folder.video_part.write_bytes(b"")  # a resume killed before its first frame: an empty part goes
    with folder.lock():
        assert not folder.video_part.exists()


def test_check_refuses_a_complete_summary_that_disagrees_with_the_records(tmp_path):
    folder = RunFolder(tmp_path / "run")
    _write_run(folder, 2)
    write_json_atomic(folder.summary_path, {"status": "complete", "totals": {"chunks": 3}})
    with pytest.raises(FolderInconsistent, match="a complete run of 3 chunks"):
        folder.check(frames_for_chunks)


def test_metrics_command_exits_7_on_a_doubled_chunks_file(tmp_path):
    from worldtrace_cli.cli import main

    folder = RunFolder(tmp_path / "run")
    _write_run(folder, 4, [0, 1, 0, 1], 2)
    result = CliRunner().invoke(main, ["metrics", str(folder.path), "--level", "fast"])
    assert result.exit_code == 7 and "repeated" in result.output


@pytest.mark.slow
def test_two_generate_processes_on_one_folder_one_is_refused(tmp_path):
    """Started together, both pass their argument checks; the folder lock lets exactly one write."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "worldtrace_cli", "generate", str(ROOT / "trajectories" / "aba.yaml"), "--preset",
           "tiny", "--image", str(ROOT / "assets" / "images" / "mg2_universal_0000.png"), "--chunks", "2",
           "--metrics", "none", "--no-progress", "-o", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    # the loser either found the lock held (6) or, arriving after the winner finished, a finished run (4)
    assert codes[0] == 0 and codes[1] in (4, 6), results
    loser = [err for code, _, err in results if code != 0][0]
    # the holder is named when its note was readable (written just after the lock is taken, so a loser
    # arriving in between reads none and says "another worldtrace process")
    assert ("is in use by another worldtrace process" in loser) or ("already holds a finished run" in loser)
    winner_out = [out_ for code, out_, _ in results if code == 0][0]
    assert winner_out.strip() == str(out.resolve())  # stdout: the run folder
    ids = [json.loads(line)["chunk"] for line in (out / "chunks.jsonl").read_text().splitlines()]
    assert ids == [0, 1]


def test_cli_position_choices_are_the_registered_schemes():
    from worldtrace_cli.memory import SCHEMES
    from worldtrace_cli.writer_options import POSITION_SCHEMES

    assert sorted(POSITION_SCHEMES) == sorted(SCHEMES)


@pytest.mark.parametrize("command", ["generate", "compare"])
def test_chunks_out_of_range_is_a_usage_error_before_anything_loads(tmp_path, command):
    from worldtrace_cli.cli import main
    from worldtrace_cli.trajectory import MAX_CHUNKS

    for value in ("99999999999999", str(MAX_CHUNKS + 1), "0"):
        result = CliRunner().invoke(main, [command, str(ROOT / "trajectories" / "aba.yaml"), "--chunks", value,
                                           "-o", str(tmp_path / "o")])
        assert result.exit_code == 2 and "--chunks" in result.output and not (tmp_path / "o").exists()


_NO_TORCH = """
import sys
from worldtrace_cli.cli import main
try:
    main(sys.argv[1:], prog_name="worldtrace")
except SystemExit as exc:
    print("exit", exc.code, "torch" in sys.modules, file=sys.stderr)
"""


def _command(command: str, traj: Path, image: Path, out: Path) -> list[str]:
    if command == "loopbench":
        return ["loopbench", "run", "--preset", "tiny", "--configs", str(traj), "--caches", "sliding", "--images",
                str(image), "--seeds", "0", "-o", str(out)]
    return [command, str(traj), "--preset", "tiny", "--image", str(image), "-o", str(out)]


@pytest.mark.parametrize("command", ["generate", "compare", "loopbench"])
@pytest.mark.parametrize("case", ["typo", "tiny_image", "huge_trajectory"])
def test_bad_inputs_are_reported_before_torch_loads(tmp_path, case, command):
    """Validate first, load later: a YAML typo, a 1x1 image or an oversized trajectory is a one-line
    error (exit 2) from a process that never imported torch, and no run folder is made; for
    generate, compare and loopbench run alike (issue 15: compare and loopbench loaded torch first)."""
    from PIL import Image

    traj, image = ROOT / "trajectories" / "aba.yaml", ROOT / "assets" / "images" / "mg2_universal_0000.png"
    if case == "typo":
        traj = tmp_path / "t.yaml"
        traj.write_text("mode: universal\nsegments:\n  - action: forwardd\n    chunks: 2\n")
    elif case == "tiny_image":
        image = tmp_path / "one.png"
        Image.new("RGB", (1, 1)).save(image)
    else:
        traj = tmp_path / "big.yaml"
        traj.write_text("mode: universal\nsegments:\n" + "  - action: forward\n    chunks: 1\n" * 40_000)
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, *_command(command, traj, image, tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert lines[-1] == "exit 2 False", proc.stderr
    assert lines[-2].startswith("worldtrace: error: ") and "Traceback" not in proc.stderr
    assert len(lines) == (3 if command == "loopbench" else 2)  # loopbench logs its job count first
    assert {"typo": "forwardd", "tiny_image": "too small", "huge_trajectory": "MiB limit"}[case] in lines[-2]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["generate", "compare"])
def test_no_conditioning_image_is_reported_before_torch_loads(tmp_path, command):
    """compare loaded the model first and only then found that no image was given."""
    traj = tmp_path / "t.yaml"
    traj.write_text("mode: universal\nsegments:\n  - action: forward\n    chunks: 1\n")
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, command, str(traj), "--preset", "tiny", "-o",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert proc.stderr.strip().splitlines()[-2:] == [
        f"worldtrace: error: {traj.resolve() if command == 'generate' else traj}: no conditioning image: pass "
        f"--image or set `image:` in the trajectory", "exit 2 False"], proc.stderr


@pytest.mark.parametrize("command", ["generate", "compare", "loopbench"])
def test_a_flag_the_writer_ignores_is_refused_before_torch_loads(tmp_path, command):
    """Issue 15: writer flags were refused by the writers' constructors, after torch (3-9 s); the
    torch-free table (writer_options) refuses them first, in every command that runs the model."""
    args = _command(command, ROOT / "trajectories" / "aba.yaml", ROOT / "assets" / "images" / "mg2_universal_0000.png",
                    tmp_path / "run")
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, *args, "--summary-slots", "2"],
                          capture_output=True, text=True, timeout=120)
    flag = "--caches" if command == "loopbench" else "--cache"
    lines = proc.stderr.strip().splitlines()
    assert lines[-2:] == [f"worldtrace: error: --summary-slots: {flag} sliding does not use it (it keeps the newest "
                          f"--budget frames verbatim)", "exit 2 False"], proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("spec, options, message", [
    ("field", {"budget": 0}, "--budget 0: too small for 0 summary + 1 recent slots (at least 1 recent slot)"),
    ("landmark", {"budget": 1, "recent_slots": 2}, "--budget 1: too small for 0 summary + 2 recent slots"),
    ("sink", {"budget": 1, "sink_frames": 2}, "--sink-frames 2 and --budget 1: --cache sink needs the budget to hold "
                                              "the sink frames and at least 1 recent slot (3; --budget 2 keeps"),
])
def test_writer_size_messages_say_what_is_wrong(spec, options, message):
    """Issue 15: "too small for -1 summary slots"; sink blamed --sink-frames ("must be >= 1 and <
    the budget (1), got 1") when the budget was the problem."""
    from worldtrace_cli.config import memory_config
    from worldtrace_cli.errors import InputError
    from worldtrace_cli.memory import CacheGeometry, build_writer

    with pytest.raises(InputError) as err:
        build_writer(memory_config(spec, **options), 3).reset(CacheGeometry(2, 2, 8, 4))
    assert message in str(err.value) and "-1" not in str(err.value)


def test_the_cache_cap_message_never_says_zero_gb():
    """Issue 15: a cap below 5 MB was reported as "would reach 0.00 GB"."""
    from worldtrace_cli.config import memory_config
    from worldtrace_cli.errors import RunError
    from worldtrace_cli.memory import CacheGeometry, build_writer

    writer = build_writer(memory_config("full", max_cache_gb=1e-7), 3)
    writer.reset(CacheGeometry(2, 2, 8, 4))
    with pytest.raises(RunError, match=r"would reach 6.14 kB at latent frame 2, over --max-cache-gb 1e-07"):
        writer.commit([], [0, 1, 2])


def test_ctrl_c_before_the_run_starts_claims_no_chunks(tmp_path, monkeypatch):
    """Issue 15: a Ctrl-C while the model loaded printed that the run folder held every finished
    chunk, before any chunk (or folder) existed."""
    from worldtrace_cli.cli import main
    from worldtrace_cli.engine.pipeline import Pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Pipeline, "from_config", interrupted)
    result = CliRunner().invoke(main, ["generate", str(ROOT / "trajectories" / "aba.yaml"), "--preset", "tiny",
                                       "--image", str(ROOT / "assets" / "images" / "mg2_universal_0000.png"),
                                       "--chunks", "2", "-o", str(tmp_path / "run")])
    # issue 37: one Ctrl-C is a stop (130); 131 is a second Ctrl-C aborting a run
    assert result.exit_code == 130 and result.output.strip().splitlines()[-1] == (
        "worldtrace: stopped: interrupted while starting, before any chunk was generated")
    assert "finished chunk" not in result.output and "resume" not in result.output
    assert not (tmp_path / "run" / "chunks.jsonl").exists()
