"""Issue 37: every refusal that needs no model comes at once, through a real process, before torch
is imported: a taken or wrong ``-o``, a checkpoint folder lacking files or a preset that takes none,
a truncated image, ``--spill-dir`` naming a file, a preset too large for the machine, click's own usage
errors. Each case is one line on stderr with its documented exit code, and the process never imported
torch (reported by an ``atexit`` hook in the child): what keeps a refusal fast. Its seconds are measured
by a benchmark (benchmarks/results/input-errors.md), not asserted here, where a loaded CI machine's
clock would make the test flaky."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABA = ROOT / "trajectories" / "aba.yaml"
LOOK = ROOT / "trajectories" / "look_around.yaml"
IMAGE = ROOT / "assets" / "images" / "mg2_universal_0000.png"  # a JPEG named .png, as MG2's demo ships
# runs the CLI as `worldtrace` does and says on stderr, after everything (SystemExit included), whether torch loaded
CHILD = ("import atexit, sys\n"
         "atexit.register(lambda: sys.stderr.write('torch imported: %s\\n' % ('torch' in sys.modules)))\n"
         "from worldtrace_cli.cli import main\n"
         "main(prog_name='worldtrace')\n")


def refuse(args, code: int, cwd: Path) -> str:
    """Run ``worldtrace ARGS`` in a fresh interpreter; check exit ``code``, one error line, no traceback,
    torch never imported. Returns the error line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("worldtrace: error:")]
    assert proc.returncode == code, proc.stderr
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "torch imported: False" in proc.stderr, proc.stderr
    return errors[0]


def test_a_finished_or_unfinished_run_in_the_output_folder(tmp_path):
    done, killed = tmp_path / "done", tmp_path / "killed"
    done.mkdir()
    (done / "summary.json").write_text(json.dumps({"status": "complete", "totals": {"chunks": 17}}))
    assert "already holds a finished run (use --overwrite)" in refuse(["generate", LOOK, "-o", done], 4, tmp_path)
    killed.mkdir()
    (killed / "chunks.jsonl").write_text(json.dumps({"chunk": 0}) + "\n")
    assert "holds an unfinished run" in refuse(["generate", LOOK, "-o", killed], 4, tmp_path)


def test_compare_and_loopbench_refuse_complete_runs_of_other_settings(tmp_path):
    other = json.dumps({"status": "complete", "config": {"chunks": 5}, "totals": {"chunks": 5}})
    (tmp_path / "cmp" / "sliding").mkdir(parents=True)
    (tmp_path / "cmp" / "sliding" / "summary.json").write_text(other)
    line = refuse(["compare", ABA, "--preset", "tiny", "--image", IMAGE, "--cache", "sliding,field", "--chunks", "1",
                   "-o", "cmp"], 4, tmp_path)
    assert "cmp/sliding holds a complete run made with chunks 5 (now 1)" in line
    job = tmp_path / "lb" / "aba" / "sliding" / "world0" / "seed0"  # a job of the quick default sweep
    job.mkdir(parents=True)
    (job / "summary.json").write_text(other)
    assert "1 of 18 jobs: lb/aba/sliding/world0/seed0 holds a complete run" in refuse(["loopbench", "run", "-o", "lb"],
                                                                                      4, tmp_path)


def test_output_and_spill_dir_naming_a_file_or_nothing(tmp_path):
    (tmp_path / "afile").write_text("mine")
    assert "exists and is not a folder" in refuse(["generate", LOOK, "-o", "afile"], 4, tmp_path)
    line = refuse(["generate", LOOK, "--cache", "field", "--spill-dir", "afile", "-o", "o"], 4, tmp_path)
    assert "--spill-dir afile: exists and is not a folder" in line
    assert "--output: an empty path" in refuse(["generate", LOOK, "-o", ""], 2, tmp_path)
    assert "exists and is not a folder" in refuse(["loopbench", "run", "-o", "afile"], 4, tmp_path)  # was a traceback
    line = refuse(["compare", LOOK, "--cache", "sliding", "-o", "afile"], 4, tmp_path)
    assert "afile exists and is not a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written anywhere


def test_checkpoint_folder_contents_and_presets_that_take_none(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "Wan2.1_VAE.pth").write_bytes(b"")
    line = refuse(["generate", "--preset", "mg2-universal", "--checkpoint", "ckpt", ABA, "-o", "o"], 3, tmp_path)
    assert "missing base_distilled_model/base_distill.safetensors, models_clip" in line
    # no --checkpoint: the message says so (it used to say "no conditioning image")
    line = refuse(["generate", "--preset", "mg2-universal", ABA, "-o", "o"], 2, tmp_path)
    assert "preset mg2-universal needs --checkpoint DIR" in line and "image" not in line.split("(")[0]
    line = refuse(["generate", "--preset", "loopworld", "--checkpoint", ".", LOOK, "-o", "o"], 2, tmp_path)
    assert "ships its own weights" in line and "drop --checkpoint" in line


def test_a_truncated_image_is_decoded_and_refused(tmp_path):
    (tmp_path / "cut.jpg").write_bytes(IMAGE.read_bytes()[:20_000])
    line = refuse(["generate", "--preset", "tiny", "--image", "cut.jpg", ABA, "-o", "o"], 2, tmp_path)
    assert "cut.jpg: truncated or corrupt image data" in line


def test_a_preset_too_large_for_the_machine(tmp_path):
    tiny = (ROOT / "worldtrace_cli" / "presets" / "tiny.yaml").read_text()
    big = tiny.replace("\n  dim: 256\n", "\n  dim: 1000000000\n").replace("img_hidden_size: 256",
                                                                          "img_hidden_size: 1000000000")
    assert big != tiny
    (tmp_path / "big.yaml").write_text(big)
    line = refuse(["generate", "--preset", "big.yaml", "--image", IMAGE, ABA, "-o", "o"], 2, tmp_path)
    assert "preset big: dit: dim 1000000000" in line and "GB of RAM" in line


@pytest.mark.parametrize("args, needle", [
    (["generate", LOOK, "--chunks", "0"], "worldtrace: error: --chunks: 0 is not in the range 1<=x<=100000"),
    (["generate", LOOK, "--world-seed", "-1"], "worldtrace: error: --world-seed: -1 is not in the range"),
    (["generate", LOOK, "--cache", "sliding,field"], "side by side: worldtrace compare"),
    (["loopbench", "run"], "Missing option '-o' / '--output'"),
])
def test_usage_errors_are_one_line(tmp_path, args, needle):
    assert needle in refuse(args, 2, tmp_path)


def test_model_size_against_the_memory_the_run_has(monkeypatch):
    """The estimate's branches: float32 against the RAM on a CPU; bf16 against the larger of the RAM
    and the largest single GPU's memory with CUDA (auto: when an NVIDIA device node exists)."""
    from dataclasses import replace

    from worldtrace_cli.config import load_preset
    from worldtrace_cli.errors import InputError
    from worldtrace_cli.model import layout

    monkeypatch.setattr(layout, "nvidia_present", lambda: False)
    mg2, lingbot = load_preset("mg2-universal"), load_preset("lingbot-fast")
    monkeypatch.setattr(layout, "physical_memory_bytes", lambda: 4 * 10**9)
    with pytest.raises(InputError, match=r"5.57 GB in float32, more than this machine's 4.0 GB of RAM"):
        layout.check_model_size(mg2, "cpu")
    layout.check_model_size(mg2, "cuda")  # 2.8 GB in bf16 on a GPU
    layout.check_model_size(lingbot, "cuda")  # 28 GB: an H100 or H200
    with pytest.raises(InputError, match="4.0 GB of RAM"):
        layout.check_model_size(lingbot, "auto")  # no NVIDIA device (patched above): float32 in RAM
    monkeypatch.setattr(layout, "nvidia_present", lambda: True)
    layout.check_model_size(lingbot, "auto")  # auto with a GPU present: bf16 on the GPU
    huge = replace(mg2, dit=replace(mg2.dit, dim=10**6))
    with pytest.raises(InputError, match="any single GPU's"):
        layout.check_model_size(huge, "cuda")
