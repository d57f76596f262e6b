"""`worldtrace compare` (click CliRunner, tiny preset, CPU): the side-by-side MP4, the table, and
the grid / HUD helpers on synthetic videos."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from worldtrace_cli.cli.compare import compare
from worldtrace_cli.jobs.compare import draw_panel, grid_shape, hud_rows, write_grid_video
from worldtrace_cli.outputs import VideoStreamWriter, probe_video, read_video_frames
from worldtrace_cli.trajectory import load_trajectory, plan_actions

ROOT = Path(__file__).parent.parent
ABA = ROOT / "trajectories" / "aba.yaml"


def one_line_error(result, code):
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("worldtrace: error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_a_stop_during_a_runs_last_chunk_stops_the_comparison(tmp_path, monkeypatch):
    """SIGTERM heard while a writer's run no longer looks at its stop flag (its last chunk) lets that
    run complete and stops the comparison before the next writer's run (exit 130); the same command
    then reuses the finished run and completes."""
    import os
    import signal

    from worldtrace_cli.jobs import generate as generate_job

    real = generate_job.run_generation
    ran = []

    def late_signal(cfg, resume=False, pipeline=None):
        from worldtrace_cli.jobs.sinks import StopFlag

        ran.append(cfg.memory.cache)
        with StopFlag():  # the run's own flag; the signal arrives after it looked for the last time
            summary = real(cfg, resume, pipeline)
            os.kill(os.getpid(), signal.SIGTERM)
            return summary

    monkeypatch.setattr(generate_job, "run_generation", late_signal)
    out = tmp_path / "cmp"
    args = [str(ABA), "--cache", "sliding,field", "--preset", "tiny", "--chunks", "1", "--metrics", "fast",
            "-o", str(out)]
    result = CliRunner().invoke(compare, args)
    assert result.exit_code == 130 and ran == ["sliding"], result.output
    assert json.loads((out / "sliding" / "summary.json").read_text())["status"] == "complete"
    assert not (out / "field").exists() and not (out / "compare.json").exists()
    monkeypatch.setattr(generate_job, "run_generation", real)
    result = CliRunner().invoke(compare, args)
    assert result.exit_code == 0 and (out / "compare.json").exists(), result.output


def test_compare_three_modes_writes_grid_video_and_table(tmp_path, valid):
    out, chunks = tmp_path / "cmp", 2
    args = [str(ABA), "--cache", "sliding,field,landmark", "--preset", "tiny", "--chunks", str(chunks),
            "--seed", "3", "-o", str(out), "--overlap-decode", "--rope-precision", "float64", "--attention-stats"]
    result = CliRunner().invoke(compare, args)
    assert result.exit_code == 0, result.output
    frames = 9 + 12 * (chunks - 1)
    assert probe_video(out / "compare.mp4") == {"frames": frames, "fps": 25.0, "width": 3 * 176, "height": 96}
    for mode in ("sliding", "field", "landmark"):
        assert probe_video(out / mode / "video.mp4")["frames"] == frames
        summary = json.loads((out / mode / "summary.json").read_text())
        assert summary["resolved"]["seed"] == 3
        assert summary["config"]["overlap_decode"] is True and summary["config"]["rope_precision"] == "float64"
        assert "other" not in summary["totals"]["seconds"]  # one shared model, loaded before each run's clock
    data = json.loads((out / "compare.json").read_text())
    valid(data, "compare")
    assert [m["cache"] for m in data["modes"]] == ["sliding", "field", "landmark"]
    assert data["video"]["rows"] == 1 and data["seed"] == 3 and data["chunks"] == chunks
    for m in data["modes"]:
        assert m["s_per_chunk"] > 0 and m["kv_bytes"] > 0 and m["peak_rss_bytes"] > 0
        assert m["metrics"]["temp_ssim"] is not None and "pac" in m["metrics"]
    md = (out / "compare.md").read_text()
    assert all(f"| {mode} |" in md for mode in ("sliding", "field", "landmark")) and "PAC" in md
    # --attention-stats: each writer's attention per slot drawn on one chunk axis, and tabulated
    assert data["attention_figure"] == "compare_attention.png" and (out / "compare_attention.png").stat().st_size > 5000
    assert "| mode | self | summary slots | recent slots | recall on return chunks |" in md
    shares = {m["cache"]: m["attention"] for m in data["modes"]}
    assert shares["sliding"]["summary"] == 0 and shares["landmark"]["summary"] > 0
    assert all(abs(a["self"] + a["summary"] + a["recent"] - 1) < 1e-4 for a in shares.values())

    # The same command again reuses the complete runs (an interrupted compare is finished this way):
    # here landmark's run was killed (no summary, no state), so only it is generated again.
    (out / "landmark" / "summary.json").unlink()
    (out / "compare.json").unlink()
    before = {m: (out / m / "video.mp4").stat().st_mtime_ns for m in ("sliding", "field", "landmark")}
    result = CliRunner().invoke(compare, args)
    assert result.exit_code == 0, result.output
    after = {m: (out / m / "video.mp4").stat().st_mtime_ns for m in ("sliding", "field", "landmark")}
    assert [after[m] == before[m] for m in before] == [True, True, False]
    assert json.loads((out / "landmark" / "summary.json").read_text())["status"] == "complete"
    assert (out / "compare.json").is_file()
    # Other settings in the same folder are refused (exit 4) rather than mixed or deleted.
    line = one_line_error(CliRunner().invoke(compare, [a if a != "3" else "4" for a in args]), 4)
    assert "seed 3 (now 4)" in line and "--overwrite" in line


def test_compare_rejects_bad_writers_before_running(tmp_path):
    line = one_line_error(CliRunner().invoke(compare, [str(ABA), "--cache", "sliding,nope", "-o", str(tmp_path)]), 2)
    assert "nope" in line and not any(tmp_path.iterdir())
    one_line_error(CliRunner().invoke(compare, [str(ABA), "--cache", "field,field", "-o", str(tmp_path)]), 2)


@pytest.mark.parametrize("modes, shape", [(1, (1, 1)), (3, (1, 3)), (4, (2, 2)), (5, (2, 3))])
def test_grid_shape(modes, shape):
    assert grid_shape(modes) == shape


def test_grid_video_two_rows_with_hud(tmp_path):
    """Four synthetic panels (solid colours) -> a 2 x 2 grid; labels and HUD drawn, panels placed."""
    colours = [(200, 0, 0), (0, 200, 0), (0, 0, 200), (200, 200, 0)]
    videos = []
    for k, colour in enumerate(colours):
        path = tmp_path / f"p{k}.mp4"
        with VideoStreamWriter(path, 64, 48) as w:
            w.write(np.broadcast_to(np.array(colour, np.uint8), (5, 48, 64, 3)).copy())
        videos.append(path)
    plan = plan_actions(load_trajectory(ABA), 1)
    info = write_grid_video(videos, ["a", "b", "c", "d"], tmp_path / "grid.mp4", 25.0, hud_rows(plan), "WSAD")
    assert info == {"frames": 5, "width": 128, "height": 96, "rows": 2, "columns": 2}
    grid = read_video_frames(tmp_path / "grid.mp4")
    assert grid.shape == (5, 96, 128, 3)
    for k, colour in enumerate(colours):  # the centre of each cell shows its panel
        y, x = (k // 2) * 48 + 24, (k % 2) * 64 + 32
        assert np.abs(grid[0, y, x].astype(int) - colour).max() < 40
    # --scale 3: the same grid with every panel three times larger
    info = write_grid_video(videos, ["a", "b", "c", "d"], tmp_path / "big.mp4", 25.0, None, "", scale=3)
    assert info == {"frames": 5, "width": 384, "height": 288, "rows": 2, "columns": 2}
    big = read_video_frames(tmp_path / "big.mp4")
    for k, colour in enumerate(colours):
        y, x = (k // 2) * 144 + 72, (k % 2) * 192 + 96
        assert np.abs(big[0, y, x].astype(int) - colour).max() < 40


def test_hud_rows_and_panel_drawing():
    plan = plan_actions(load_trajectory(ABA), 10)
    rows = hud_rows(plan)
    assert len(rows) == 9 + 12 * 9
    assert rows[0] == (["W"], (0.0, 0.0)) and rows[-1][0] == ["S"]  # forward, then back after chunk 8
    frame = np.zeros((96, 176, 3), np.uint8)
    plain = np.asarray(draw_panel(frame, "sliding"))
    with_hud = np.asarray(draw_panel(frame, "sliding", (["W"], (0.0, 0.1)), "WSAD"))
    assert plain[:12, :40].max() > 200  # the label
    assert plain[-14:].max() == 0 and with_hud[-14:, :14].max() > 200  # W key lit
    assert with_hud[-24:, -24:, 0].max() > 200  # mouse arrow (yellow)
