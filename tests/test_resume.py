"""Nothing generated is lost: real runs killed with SIGKILL / SIGINT / SIGTERM keep every finished
chunk, and --resume continues them to exactly the video an uninterrupted run makes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worldtrace_cli.config import RunConfig, load_preset
from worldtrace_cli.errors import RunError
from worldtrace_cli.memory import MemoryConfig
from worldtrace_cli.outputs import probe_video, read_jsonl
from worldtrace_cli.jobs.generate import run_generation

ROOT = Path(__file__).parent.parent
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0004.png"
ABA = ROOT / "trajectories" / "aba.yaml"
CHUNKS = 7


def config(out, cache="field", **kw):
    return RunConfig(preset=load_preset("tiny"), trajectory=ABA, output=out, image=IMAGE, chunks=CHUNKS,
                     progress=False, memory=MemoryConfig.of(cache=cache), **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Frame hashes of uninterrupted runs, per writer."""
    refs = {}
    for cache in ("field", "landmark"):
        out = tmp_path_factory.mktemp(f"ref-{cache}")
        run_generation(config(out, cache))
        refs[cache] = [r["frames_sha256"] for r in read_jsonl(out / "chunks.jsonl")]
    return refs


def start_run(out, cache, save_every, *extra):
    cmd = [sys.executable, "-m", "worldtrace_cli", "generate", str(ABA), "--preset", "tiny", "--image", str(IMAGE), "--chunks",
           str(CHUNKS), "--cache", cache, "--save-every", str(save_every), "-o", str(out), "--no-progress", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_chunks(out, n, proc, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = out / "chunks.jsonl"
        if path.exists() and len(read_jsonl(path)) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("run did not progress")


def resume(out, *extra):
    return subprocess.run([sys.executable, "-m", "worldtrace_cli", "generate", "--resume", str(out), "--no-progress",
                           *extra], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("sig,cache,extra", [(signal.SIGKILL, "field", ()), (signal.SIGINT, "landmark", ()),
                                             (signal.SIGTERM, "field", ("--overlap-decode",))])
def test_killed_run_keeps_chunks_and_resumes_exactly(tmp_path, reference, sig, cache, extra, valid):
    """With --overlap-decode the chunk being decoded when the signal arrives is still written."""
    out = tmp_path / "run"
    proc = start_run(out, cache, 2, *extra)
    wait_for_chunks(out, 3, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    records = read_jsonl(out / "chunks.jsonl")
    done = len(records)
    assert [r["chunk"] for r in records] == list(range(done))
    assert [r["frames_sha256"] for r in records] == reference[cache][:done]
    time.sleep(0.5)  # ffmpeg outlives a SIGKILLed python long enough to finish the file
    frames = probe_video(out / "video.mp4")["frames"]
    if sig == signal.SIGKILL:
        assert frames >= 9  # playable; at most the fragment in flight is lost
    else:
        assert proc.returncode == 130
        assert "--resume" in err and "error" not in err.lower()
        assert f"interrupted after chunk {done - 1} " in err  # every generated chunk was written
        assert frames == 9 + 12 * (done - 1)  # every finished chunk, exactly
    if sig == signal.SIGKILL:
        assert not (out / "summary.json").exists()
    else:  # a stopped run leaves a partial summary, never one that looks complete
        partial = json.loads((out / "summary.json").read_text())
        assert partial["status"] == "stopped" and partial["totals"]["chunks"] == done
        valid(partial, "summary")
    # --overlap-decode does not change the video, so a resume may switch it on
    switch = ("--overlap-decode",) if sig == signal.SIGINT else ()
    result = resume(out, *switch)
    assert result.returncode == 0, result.stderr
    assert "ignored" not in result.stderr
    records = read_jsonl(out / "chunks.jsonl")
    assert [r["frames_sha256"] for r in records] == reference[cache]
    assert probe_video(out / "video.mp4")["frames"] == 9 + 12 * (CHUNKS - 1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["resolved"]["resumed_at_chunk"] >= 2
    assert summary["config"]["overlap_decode"] == bool(switch or extra)
    assert not (out / "resume").exists()


@pytest.mark.slow
def test_a_run_killed_before_its_first_save_resumes_from_chunk_0(tmp_path, reference):
    """The state saved before the first chunk: a run SIGKILLed with chunks written but before its
    first ``--save-every`` save (here never: 100 > 7 chunks) resumes to the uninterrupted frames."""
    out = tmp_path / "run"
    proc = start_run(out, "field", 100)
    wait_for_chunks(out, 2, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    _wait_for_orphaned_ffmpeg(out)
    assert len(read_jsonl(out / "chunks.jsonl")) >= 2
    result = resume(out)
    assert result.returncode == 0, result.stderr
    assert [r["frames_sha256"] for r in read_jsonl(out / "chunks.jsonl")] == reference["field"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["resolved"]["resumed_at_chunk"] == 0


def test_resume_without_state_is_a_clear_error(tmp_path):
    result = resume(tmp_path)
    assert result.returncode == 2 and "nothing to resume" in result.stderr and "--overwrite" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_runs_recorded_before_a_preset_key_existed_are_the_same_run(tmp_path):
    """A run folder written before a preset key was added (``architecture``, ``sampler``,
    ``context_noise``) is the same run as one made with the value it was made with, and another value
    of such a key is named as a difference (resume, compare and loopbench refuse to mix them)."""
    from dataclasses import replace

    from worldtrace_cli.config import PRESET_ADDED
    from worldtrace_cli.runs.resume import differences

    cfg = RunConfig(preset=load_preset("tiny"), trajectory=ABA, output=tmp_path / "o", image=IMAGE, chunks=3,
                    progress=False)
    saved = cfg.to_dict()
    assert set(PRESET_ADDED) >= {"architecture", "sampler", "context_noise"} and set(PRESET_ADDED) <= set(saved["preset"])
    old = {**saved, "preset": {k: v for k, v in saved["preset"].items() if k not in PRESET_ADDED}}
    assert differences(old, cfg) == []
    noisy = replace(cfg, preset=replace(cfg.preset, context_noise=100))
    assert differences(old, noisy) == ["preset.context_noise 0 (now 100)"]
    # settings added to the run since (RUN_ADDED): attention stats change the records, not the video
    from worldtrace_cli.config import RUN_ADDED

    before = {k: v for k, v in old.items() if k not in RUN_ADDED}
    assert set(RUN_ADDED) <= set(saved) and differences(before, cfg) == []
    assert differences(before, replace(cfg, attention_stats=True)) == ["attention_stats False (now True)"]


def test_overlapped_decode_makes_the_same_video(tmp_path, reference):
    summary = run_generation(config(tmp_path / "o", "field", overlap_decode=True))
    assert [r["frames_sha256"] for r in read_jsonl(tmp_path / "o" / "chunks.jsonl")] == reference["field"]
    assert summary["config"]["overlap_decode"] is True and summary["totals"]["seconds"]["decode_wait"] >= 0


@pytest.mark.parametrize("overlap", [False, True])
def test_non_finite_latents_stop_the_run_naming_the_chunk(tmp_path, monkeypatch, overlap):
    from worldtrace_cli.model import dit

    original = dit.CausalWanDiT.forward

    def poisoned(self, x, t, cond, chunk, commit=False):
        out = original(self, x, t, cond, chunk, commit)
        if chunk.frame_start == 6:
            out = out * float("nan")
        return out

    monkeypatch.setattr(dit.CausalWanDiT, "forward", poisoned)
    with pytest.raises(RunError, match="chunk 2: .*NaN"):
        run_generation(config(tmp_path / "o", "sliding", overlap_decode=overlap))
    # with overlap chunk 1 was still being decoded when chunk 2 failed: it is written all the same
    assert [r["chunk"] for r in read_jsonl(tmp_path / "o" / "chunks.jsonl")] == [0, 1]
    assert probe_video(tmp_path / "o" / "video.mp4")["frames"] == 21


def test_a_failure_while_writing_the_last_chunks_does_not_hide_the_real_error(tmp_path, monkeypatch):
    from worldtrace_cli.engine import decode
    from worldtrace_cli.model import dit

    original = dit.CausalWanDiT.forward

    def poisoned(self, x, t, cond, chunk, commit=False):
        out = original(self, x, t, cond, chunk, commit)
        return out * float("nan") if chunk.frame_start == 6 else out

    def broken_flush(self):
        raise OSError("No space left on device")

    monkeypatch.setattr(dit.CausalWanDiT, "forward", poisoned)
    monkeypatch.setattr(decode.DecodePipeline, "flush", broken_flush)
    with pytest.raises(RunError, match="chunk 2: .*NaN"):
        run_generation(config(tmp_path / "o", "sliding", overlap_decode=True))
    assert [r["chunk"] for r in read_jsonl(tmp_path / "o" / "chunks.jsonl")] == [0]


def test_resume_refuses_changed_inputs_and_lost_chunks(tmp_path):
    """A resume must continue the same video: a changed trajectory, or a video that lost chunks
    before the saved one, is refused with a one-line error instead of splicing two runs."""
    import shutil

    traj = tmp_path / "aba.yaml"
    shutil.copy(ABA, traj)
    out = tmp_path / "run"
    cfg = RunConfig(preset=load_preset("tiny"), trajectory=traj, output=out, image=IMAGE, chunks=CHUNKS,
                    progress=False, save_every=2)
    real_step = __import__("worldtrace_cli.engine.rollout", fromlist=["Rollout"]).Rollout.step
    calls = {"n": 0}

    def dying_step(self, request=None):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RunError("simulated crash")
        return real_step(self, request)

    import worldtrace_cli.engine.rollout as rollout_mod
    rollout_mod.Rollout.step = dying_step
    try:
        with pytest.raises(RunError, match="simulated"):
            run_generation(cfg)
    finally:
        rollout_mod.Rollout.step = real_step
    assert (out / "resume" / "state.json").is_file()  # saved after chunk 1
    traj.write_text(traj.read_text().replace("chunks: 8", "chunks: 7", 1))
    result = resume(out)
    assert result.returncode == 2 and "changed since the run started" in result.stderr
    shutil.copy(ABA, traj)
    (out / "video.mp4").unlink()
    result = resume(out)
    assert result.returncode == 7 and "cannot resume exactly" in result.stderr  # FolderInconsistent
    assert len([ln for ln in result.stderr.splitlines() if "error:" in ln]) == 1


def test_overwrite_removes_an_old_resume_state(tmp_path):
    out = tmp_path / "run"
    (out / "resume").mkdir(parents=True)
    (out / "resume" / "state.json").write_text("{}")
    (out / "resume" / ".worldtrace-state").write_bytes(b"")  # a state worldtrace saved (its mark)
    (out / "chunks.jsonl").write_text("")
    run_generation(config(out, "sliding", overwrite=True, save_every=0))
    assert not (out / "resume").exists()
    assert resume(out).returncode == 2  # completed: nothing to resume


@pytest.mark.parametrize("umask", [0o002, 0o022, 0o077])
def test_resume_state_files_follow_the_umask(tmp_path, umask):
    """Issue 15: the state's tensors were written 0600 whatever the umask (safetensors' own mode),
    so a group sharing a run folder could not resume it."""
    import os

    import torch

    from worldtrace_cli.runs.state import save_state

    old = os.umask(umask)
    try:
        save_state(tmp_path / "resume", {"next_chunk": 1}, {"writer": {"k": torch.zeros(2)}})
    finally:
        os.umask(old)
    for name in ("state.json", "state.safetensors"):
        assert (tmp_path / "resume" / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


def test_a_save_killed_anywhere_in_its_removals_leaves_state_folders_the_next_save_takes(tmp_path, monkeypatch):
    """A kill while a state folder is removed (the stale ``.old`` of a save, its ``.tmp``) used to leave
    tensors without the folder's mark, which the next save refused as a user's folder (exit 4: CI's
    random-kill test). The mark goes last: a removal stopped after any file leaves a marked folder, and
    a save killed between its two renames keeps the previous state until the new one is in place."""
    import torch

    from worldtrace_cli.runs.folder import remove_state_folder
    from worldtrace_cli.runs.state import check_state_target, is_state_folder, load_meta, save_state

    state = tmp_path / "resume"
    save_state(state, {"next_chunk": 1}, {"writer": {"k": torch.zeros(2)}})
    files = sorted(p.name for p in state.iterdir())
    for stop_after in range(1, len(files) + 1):  # a kill after each file the removal takes
        copy = tmp_path / f"resume.old-{stop_after}"
        shutil.copytree(state, copy)
        removed, unlink = [], Path.unlink

        def killed(self, *args, **kwargs):
            if len(removed) == stop_after:
                raise SystemExit(137)
            removed.append(self.name)
            return unlink(self, *args, **kwargs)

        monkeypatch.setattr(Path, "unlink", killed)
        try:
            remove_state_folder(copy)
        except SystemExit:
            pass
        monkeypatch.setattr(Path, "unlink", unlink)
        assert not copy.exists() or is_state_folder(copy), (stop_after, removed, sorted(os.listdir(copy)))
        assert ".worldtrace-state" not in removed[:-1]  # the mark only ever last
    shutil.copytree(state, tmp_path / "resume.old", dirs_exist_ok=True)  # a partial .old beside the state
    check_state_target(state)
    # killed between the two renames: only .old holds the state; the next save keeps it until its own lands
    shutil.rmtree(tmp_path / "resume.old")
    state.rename(tmp_path / "resume.old")
    assert load_meta(state)["next_chunk"] == 1  # read from .old
    save_state(state, {"next_chunk": 2}, {"writer": {"k": torch.ones(2)}})
    assert load_meta(state)["next_chunk"] == 2 and not (tmp_path / "resume.old").exists()


def _wait_for_orphaned_ffmpeg(out: Path, timeout: float = 30.0) -> None:
    """A SIGKILLed run's ffmpeg outlives it to finish the video (holding the folder's lock): wait until
    no process writes into ``out`` and the lock is free. Both are needed: an exiting process's
    cmdline reads empty (its memory is released) a moment before its files, and so its lock, are
    closed, and a checker that finds the lock held leaves the part alone (the folder is busy)."""
    from filelock import FileLock, Timeout

    from worldtrace_cli.runs.folder import LOCK

    deadline = time.time() + timeout
    while time.time() < deadline:
        writers = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and str(out) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    writers.append(proc)
            except OSError:
                continue
        if not writers:
            try:
                with FileLock(str(out / LOCK), timeout=0):
                    return
            except Timeout:
                pass
        time.sleep(0.05)
    raise AssertionError(f"ffmpeg still writing into {out}")


KILL_CHUNKS = 6


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="waits for the orphaned ffmpeg through /proc")
def test_kills_at_random_chunks_each_resumed_to_the_same_frames(tmp_path):
    """Issue 15: SIGKILL at a random chunk (and a random moment inside it), then SIGKILL of the resumed
    run at a later random chunk, then --resume: each stage leaves a consistent folder whose video.mp4
    covers every record (a killed resume's video.part.mp4 is joined when the folder is next read),
    and the finished run has exactly the frames_sha256 of an uninterrupted one. Sized for CI: 6
    chunks, no metrics, three processes."""
    import random

    from worldtrace_cli.runs import RunFolder
    from worldtrace_cli.trajectory import frames_for_chunks

    base = RunConfig(preset=load_preset("tiny"), trajectory=ABA, output=tmp_path / "ref", image=IMAGE,
                     chunks=KILL_CHUNKS, progress=False, metrics="none", memory=MemoryConfig.of(cache="field"))
    run_generation(base)
    want = [r["frames_sha256"] for r in read_jsonl(tmp_path / "ref" / "chunks.jsonl")]
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    out, done, kills = tmp_path / "run", 0, []
    proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "generate", str(ABA), "--preset", "tiny", "--image",
                             str(IMAGE), "--chunks", str(KILL_CHUNKS), "--cache", "field", "--metrics", "none",
                             "--save-every", "1", "-o", str(out), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for last in (2, KILL_CHUNKS - 2):  # kill points: chunk 1-2, then a later one up to 4 (never the end)
        wait_for_chunks(out, rng.randint(done + 1, last), proc)
        time.sleep(rng.uniform(0, 0.3))  # somewhere inside the next chunk
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        _wait_for_orphaned_ffmpeg(out)
        info = RunFolder(out).check(frames_for_chunks)  # consistent; joins a killed resume's part
        records = read_jsonl(out / "chunks.jsonl")
        done = len(records)
        kills.append(done)
        where = f"seed {seed}, killed after chunks {kills}"
        assert [r["frames_sha256"] for r in records] == want[:done], where
        assert not (out / "video.part.mp4").exists() and info["chunks"] == done, where
        assert probe_video(out / "video.mp4")["frames"] == info["video_frames"] >= frames_for_chunks(done), where
        proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "generate", "--resume", str(out),
                                 "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (where, err)
    assert [r["frames_sha256"] for r in read_jsonl(out / "chunks.jsonl")] == want, where
    assert probe_video(out / "video.mp4")["frames"] == frames_for_chunks(KILL_CHUNKS), where
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"
