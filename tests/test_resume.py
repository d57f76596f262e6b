"""Nothing generated is lost: real runs killed with SIGKILL / SIGINT / SIGTERM keep every finished
chunk, and --resume continues them to exactly the video an uninterrupted run makes."""

import json
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
from worldtrace_cli.run import run_generation

ROOT = Path(__file__).parent.parent
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0004.png"
ABA = ROOT / "trajectories" / "aba.yaml"
CHUNKS = 7


def config(out, cache="field", **kw):
    return RunConfig(preset=load_preset("tiny"), trajectory=ABA, output=out, image=IMAGE, chunks=CHUNKS,
                     progress=False, memory=MemoryConfig(cache=cache), **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Frame hashes of uninterrupted runs, per writer."""
    refs = {}
    for cache in ("field", "landmark"):
        out = tmp_path_factory.mktemp(f"ref-{cache}")
        run_generation(config(out, cache))
        refs[cache] = [r["frames_sha256"] for r in read_jsonl(out / "chunks.jsonl")]
    return refs


def start_run(out, cache, save_every):
    cmd = [sys.executable, "-m", "worldtrace_cli", "generate", str(ABA), "--image", str(IMAGE), "--chunks",
           str(CHUNKS), "--cache", cache, "--save-every", str(save_every), "-o", str(out), "--no-progress"]
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


def resume(out):
    return subprocess.run([sys.executable, "-m", "worldtrace_cli", "generate", "--resume", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("sig,cache", [(signal.SIGKILL, "field"), (signal.SIGINT, "landmark"),
                                       (signal.SIGTERM, "field")])
def test_killed_run_keeps_chunks_and_resumes_exactly(tmp_path, reference, sig, cache):
    out = tmp_path / "run"
    proc = start_run(out, cache, save_every=2)
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
        assert frames == 9 + 12 * (done - 1)  # every finished chunk, exactly
    assert not (out / "summary.json").exists()
    result = resume(out)
    assert result.returncode == 0, result.stderr
    records = read_jsonl(out / "chunks.jsonl")
    assert [r["frames_sha256"] for r in records] == reference[cache]
    assert probe_video(out / "video.mp4")["frames"] == 9 + 12 * (CHUNKS - 1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["resolved"]["resumed_at_chunk"] >= 2
    assert not (out / "resume").exists()


def test_resume_without_state_is_a_clear_error(tmp_path):
    result = resume(tmp_path)
    assert result.returncode == 2 and "no saved state" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_non_finite_latents_stop_the_run_naming_the_chunk(tmp_path, monkeypatch):
    from worldtrace_cli.model import dit

    original = dit.CausalWanDiT.forward

    def poisoned(self, x, t, cond, chunk, commit=False):
        out = original(self, x, t, cond, chunk, commit)
        if chunk.frame_start == 6:
            out = out * float("nan")
        return out

    monkeypatch.setattr(dit.CausalWanDiT, "forward", poisoned)
    with pytest.raises(RunError, match="chunk 2: .*NaN"):
        run_generation(config(tmp_path / "o", "sliding"))
    assert [r["chunk"] for r in read_jsonl(tmp_path / "o" / "chunks.jsonl")] == [0, 1]
    assert probe_video(tmp_path / "o" / "video.mp4")["frames"] == 21
