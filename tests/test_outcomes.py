"""Issue 37: nothing reports success that it did not deliver. A damaged resume state is refused, a
run whose video lost its frames is not "complete", a lock that cannot be created is an output error,
and `metrics` neither scores a folder a run is still writing nor calls a missing folder "no video"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from worldtrace_cli.cli import main
from worldtrace_cli.config import RunConfig, load_preset
from worldtrace_cli.errors import RunError
from worldtrace_cli.jobs.generate import run_generation
from worldtrace_cli.memory import MemoryConfig
from worldtrace_cli.runs import RunFolder

ROOT = Path(__file__).parent.parent
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0004.png"
ABA = ROOT / "trajectories" / "aba.yaml"


def worldtrace(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worldtrace_cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def error_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("worldtrace: error:")]


def tiny(out, chunks=2, **kw) -> list[str]:
    return ["generate", "--preset", "tiny", "--image", str(IMAGE), str(ABA), "--chunks", str(chunks), "-o", str(out),
            "--no-progress", *kw.get("extra", ())]


def test_a_damaged_resume_state_is_refused(tmp_path, monkeypatch):
    """Bytes flipped inside state.safetensors used to resume silently into a different video."""
    import worldtrace_cli.engine.rollout as rollout_mod

    out = tmp_path / "run"
    cfg = RunConfig(preset=load_preset("tiny"), trajectory=ABA, output=out, image=IMAGE, chunks=5, progress=False,
                    save_every=2, memory=MemoryConfig.of(cache="field"))
    real_step, calls = rollout_mod.Rollout.step, {"n": 0}

    def dying_step(self, request=None):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RunError("simulated crash")
        return real_step(self, request)

    monkeypatch.setattr(rollout_mod.Rollout, "step", dying_step)
    with pytest.raises(RunError, match="simulated"):
        run_generation(cfg)
    monkeypatch.setattr(rollout_mod.Rollout, "step", real_step)
    state = out / "resume" / "state.safetensors"
    data = bytearray(state.read_bytes())
    for i in range(len(data) - 64, len(data) - 32):  # inside the last tensor's bytes, not the header
        data[i] ^= 0x55
    state.write_bytes(bytes(data))
    result = worldtrace("generate", "--resume", out, "--no-progress")
    assert result.returncode == 2, result.stderr
    (line,) = error_lines(result.stderr)
    assert "resume state is damaged" in line and "--overwrite" in line and "Traceback" not in result.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"  # unchanged
    assert len(json.loads((out / "resume" / "state.json").read_text())["tensors_sha256"]) == 64


def test_a_video_deleted_while_the_run_writes_it_is_not_success(tmp_path, monkeypatch):
    from worldtrace_cli.jobs import sinks

    out = tmp_path / "run"
    real_write = sinks.RunSinks.write

    def write_then_delete(self, ready):
        real_write(self, ready)
        if self.records:
            self.folder.video.unlink(missing_ok=True)  # the user's `rm` while ffmpeg still writes

    monkeypatch.setattr(sinks.RunSinks, "write", write_then_delete)
    result = CliRunner().invoke(main, tiny(out))
    assert result.exit_code == 4, result.output
    (line,) = error_lines(result.output)
    assert "pixel frames" in line and "--overwrite" in line
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"


def test_a_lock_that_cannot_be_created_is_an_output_error(tmp_path, monkeypatch):
    """An existing run folder on a read-only filesystem: the lock file's OSError was a traceback."""
    import errno

    import filelock

    class ReadOnlyLock:
        def __init__(self, *args, **kwargs):
            pass

        def acquire(self, *args, **kwargs):
            raise OSError(errno.EROFS, "Read-only file system")

    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setattr(filelock, "FileLock", ReadOnlyLock)
    result = CliRunner().invoke(main, tiny(out))
    assert result.exit_code == 4, result.output
    (line,) = error_lines(result.output)
    assert "not writable" in line and "Read-only file system" in line


def test_metrics_on_a_missing_folder_says_so(tmp_path):
    result = worldtrace("metrics", tmp_path / "nothing")
    assert result.returncode == 2 and "the folder does not exist" in error_lines(result.stderr)[0], result.stderr


def test_metrics_on_a_folder_still_being_written_is_busy(tmp_path):
    out = tmp_path / "run"
    assert CliRunner().invoke(main, tiny(out, chunks=1)).exit_code == 0
    with RunFolder(out).lock("generate"):  # a run still writing the folder
        result = worldtrace("metrics", out, "--level", "fast")
    assert result.returncode == 6, result.stderr
    (line,) = error_lines(result.stderr)
    assert "still being written" in line and "when it has finished" in line
    result = worldtrace("metrics", out, "--level", "fast")  # finished: scored, the path on stdout
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out / "metrics.json")
    assert json.loads((out / "metrics.json").read_text())["status"] == "complete"
