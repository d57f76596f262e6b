"""`worldtrace loopbench run|report` (click CliRunner, CPU): job planning, idempotent and resumable
sweeps, failure records, shards (flag and torchrun env), and the report's statistics.

Most sweeps replace ``run_generation`` by a stub that writes a complete summary.json, so the
runner's logic is tested on 36-job matrices in milliseconds; one sweep runs the real tiny model.
"""

import csv
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from worldtrace_cli.jobs import generate as generate_job
from worldtrace_cli.errors import InputError
from worldtrace_cli.jobs import loopbench as sweep
from worldtrace_cli.loopbench import plan
from worldtrace_cli.cli.loopbench import loopbench
from worldtrace_cli.loopbench.report import collect, mean_ci, paired_test, report
from worldtrace_cli.outputs import write_json_atomic
from worldtrace_cli.runs import RunFolder

ROOT = Path(__file__).parent.parent
IMAGES = ROOT / "assets" / "images"
TWO_IMAGES = f"{IMAGES / 'mg2_universal_0000.png'},{IMAGES / 'mg2_universal_0004.png'}"
MATRIX = ["--configs", "aba,abca,pan_90", "--caches", "sliding,field,landmark", "--images", TWO_IMAGES,
          "--seeds", "0,42", "--chunks", "2"]
T_975_DF2 = 4.302652729911275  # Student t quantile t_{0.975, 2}, from tables


def lb(*args, env=None):
    return CliRunner().invoke(loopbench, [str(a) for a in args], env=env)


def one_line_error(result, code):
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("worldtrace: error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def fake_summary(cfg, pac=0.5, temp_ssim=0.7):
    return {"status": "complete", "run_dir": str(cfg.output), "config": cfg.to_dict(),
            "resolved": {"seed": cfg.seed, "chunks": cfg.chunks or 16, "image": str(cfg.image)},
            "cache": {"cache": cfg.memory.cache, "kv_bytes": 1000},
            "metrics": {"level": cfg.metrics, "temp_ssim": temp_ssim, "latent_diff": 0.1, "scene_drift": 0.01,
                        "pac": None if pac is None else {"pairs": 4, "mean": pac}},
            "totals": {"chunks": cfg.chunks or 16, "seconds_per_chunk": 0.5, "peak_rss_bytes": 2**20,
                       "gpu_peak_bytes": None}}


@pytest.fixture
def fake_generate(monkeypatch):
    """Replace run_generation by a stub writing a complete run; returns the list of job keys run.
    ``calls.fail`` = a set of job-key substrings that raise instead."""

    class Calls(list):
        fail: set = set()

    calls = Calls()

    def generate(cfg, resume=False, pipeline=None):
        key = "/".join(Path(cfg.output).parts[-4:])
        calls.append(key + (" (resumed)" if resume else ""))
        if any(s in key for s in calls.fail):
            raise RuntimeError(f"boom in {key}\nsecond line")
        RunFolder(cfg.output).prepare(cfg.overwrite or resume)
        summary = fake_summary(cfg)
        write_json_atomic(Path(cfg.output) / "summary.json", summary)
        return summary

    monkeypatch.setattr(generate_job, "run_generation", generate)
    return calls


def test_plan_is_sorted_and_folders_are_deterministic():
    images = plan.resolve_images(TWO_IMAGES)
    a = plan.plan_jobs(["pan_90", "aba"], ["landmark", "mixed:2"], images, [42, 0])
    b = plan.plan_jobs(["aba", "pan_90"], ["mixed:2", "landmark"], images[::-1], [0, 42])
    assert a == b and len(a) == 2 * 2 * 2 * 2
    assert a[0].key == "aba/landmark/mg2_universal_0000/seed0"
    assert any(j.key == "pan_90/mixed-2/mg2_universal_0004/seed42" for j in a)
    assert a[0].trajectory == ROOT / "trajectories" / "loopbench" / "aba.yaml"
    folder_images = plan.resolve_images(str(IMAGES))
    assert [p.name for p in folder_images] == sorted(p.name for p in IMAGES.iterdir() if p.suffix == ".png")


def test_sweep_is_idempotent_and_resumable(tmp_path, fake_generate):
    import logging

    class Lines(logging.Handler):  # on the logger itself: the CLI turns its propagation off
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    def logged_run(*args):
        logger, lines = logging.getLogger("worldtrace"), Lines()
        level = logger.level
        logger.addHandler(lines)
        logger.setLevel(logging.INFO)
        try:
            return lb("run", *args), [ln for ln in lines.lines if ": done in " in ln]
        finally:
            logger.removeHandler(lines)
            logger.setLevel(level)

    out = tmp_path / "lb"
    result, done = logged_run(*MATRIX, "-o", out)  # each job's line with the time the jobs left take
    assert result.exit_code == 0, result.output
    assert len(fake_generate) == 36 and len(set(fake_generate)) == 36
    assert "36 done, 0 skipped, 0 failed" in result.output
    assert (out / "abca" / "field" / "mg2_universal_0004" / "seed42" / "summary.json").is_file()
    assert len(done) == 36 and "for the 35 left" in done[0] and "for the 1 left" in done[34] and "left" not in done[35]
    assert [sweep._duration(s) for s in (20, 95, 4000)] == ["20 s", "2 min", "1 h 7 min"]

    fake_generate.clear()
    result = lb("run", *MATRIX, "-o", out)
    assert result.exit_code == 0 and fake_generate == [] and "0 done, 36 skipped" in result.output

    # A kill leaves a job without summary.json (maybe with a partial video): only it is redone.
    victim = out / "pan_90" / "landmark" / "mg2_universal_0000" / "seed0"
    (victim / "summary.json").unlink()
    (victim / "video.mp4").write_bytes(b"partial")
    result, done = logged_run(*MATRIX, "-o", out)
    assert result.exit_code == 0, result.output
    assert len(done) == 1 and "left" not in done[0]  # the 35 complete jobs cost nothing: no estimate for them
    assert fake_generate == ["pan_90/landmark/mg2_universal_0000/seed0"] and "1 done, 35 skipped" in result.output
    assert not (victim / "video.mp4").exists()  # overwrite removed the stale run files

    # Another tau clashes with the complete landmark runs only (a writer without the detector is the
    # same run): the sweep is refused before any job runs; at the old settings everything is reused.
    fake_generate.clear()
    result = lb("run", *MATRIX, "--landmark-threshold", "0.3", "-o", out)
    line = one_line_error(result, 4)
    assert fake_generate == [] and "12 of 36 jobs" in line and "landmark_threshold 0.0047 (now 0.3)" in line
    result = lb("run", *MATRIX, "-o", out)
    assert result.exit_code == 0 and "0 done, 36 skipped" in result.output and not list(out.rglob("failed.json"))


def test_speed_options_reach_every_job(tmp_path, fake_generate):
    out = tmp_path / "lb"
    result = lb("run", "--configs", "aba", "--caches", "sliding", "--images", TWO_IMAGES, "--seeds", "0",
                "--compile", "default", "--rope-precision", "float64", "--overlap-decode", "-o", out)
    assert result.exit_code == 0, result.output
    configs = [json.loads(p.read_text())["config"] for p in out.rglob("summary.json")]
    assert len(configs) == 2
    assert all((c["compile"], c["rope_precision"], c["overlap_decode"]) == ("default", "float64", True)
               for c in configs)


def test_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path, fake_generate):
    out = tmp_path / "lb"
    fake_generate.fail = {"abca/field/mg2_universal_0000/seed0"}
    result = lb("run", *MATRIX, "-o", out)
    line = one_line_error(result, 5)
    assert "1 of 36 jobs failed" in line and "failures.jsonl" in line
    assert "35 done, 0 skipped, 1 failed" in result.output
    records = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert len(records) == 1
    rec = records[0]
    assert rec["job"] == "abca/field/mg2_universal_0000/seed0" and rec["error"] == "RuntimeError"
    assert rec["message"].startswith("boom in") and "\n" not in rec["message"]
    failed = out / "abca" / "field" / "mg2_universal_0000" / "seed0" / "failed.json"
    assert json.loads(failed.read_text())["error"] == "RuntimeError"
    assert len(collect(out)) == 35

    fake_generate.fail = set()
    fake_generate.clear()
    result = lb("run", *MATRIX, "-o", out)
    assert result.exit_code == 0 and fake_generate == ["abca/field/mg2_universal_0000/seed0"]
    assert not failed.exists() and len(collect(out)) == 36


def test_interrupted_job_resumes_from_its_state_and_stops_the_sweep(tmp_path, fake_generate, monkeypatch):
    from dataclasses import replace

    from worldtrace_cli.config import RunConfig
    from worldtrace_cli.errors import Interrupted
    from worldtrace_cli.runs import resume as run

    out = tmp_path / "lb"
    args = ["--configs", "aba", "--caches", "sliding", "--images", TWO_IMAGES, "--seeds", "0", "--chunks", 2]
    assert lb("run", *args, "-o", out).exit_code == 0
    job = out / "aba" / "sliding" / "mg2_universal_0004" / "seed0"
    saved = json.loads((job / "summary.json").read_text())["config"]
    (job / "summary.json").unlink()
    (job / "resume").mkdir()  # a state saved on SIGTERM; its config is what resume_config returns
    (job / "resume" / "state.json").write_text("{}")
    (job / "resume" / ".worldtrace-state").write_bytes(b"")  # the mark every saved state carries
    monkeypatch.setattr(run, "resume_config", lambda folder: RunConfig.from_dict(saved))
    fake_generate.clear()
    assert lb("run", *args, "-o", out).exit_code == 0
    assert fake_generate == ["aba/sliding/mg2_universal_0004/seed0 (resumed)"]

    # A state saved with other settings is not resumed: the job is redone from chunk 0.
    (job / "summary.json").unlink()
    monkeypatch.setattr(run, "resume_config", lambda folder: replace(RunConfig.from_dict(saved), seed=7))
    fake_generate.clear()
    assert lb("run", *args, "-o", out).exit_code == 0
    assert fake_generate == ["aba/sliding/mg2_universal_0004/seed0"]

    # Ctrl-C / SIGTERM inside a job (generate raises Interrupted, exit 130) stops the sweep unrecorded.
    def interrupted(cfg, resume=False, pipeline=None):
        raise Interrupted("interrupted after chunk 0 of 2")

    monkeypatch.setattr(generate_job, "run_generation", interrupted)
    result = lb("run", *args, "--seeds", "1", "-o", out)
    assert result.exit_code == 130 and not (out / "failures.jsonl").exists()
    stopped = [ln for ln in result.output.splitlines() if ln.startswith("worldtrace: stopped:")]
    assert len(stopped) == 1 and "rerun the same command to resume the sweep" in stopped[0]
    assert "generate --resume" not in result.output


def test_a_stop_during_a_jobs_last_chunk_stops_the_sweep(tmp_path, fake_generate, monkeypatch):
    """SIGTERM arriving while a job's run holds its own stop flag but no longer looks at it (its last
    chunk) lets that job complete, then stops the sweep before the next job (exit 130), instead of
    being swallowed with the job's flag; the rerun skips the finished job and runs the other."""
    import os
    import signal

    from worldtrace_cli.jobs.sinks import StopFlag

    stub = generate_job.run_generation

    def generate(cfg, resume=False, pipeline=None):
        with StopFlag():  # as a real run holds one until its summary is written
            os.kill(os.getpid(), signal.SIGTERM)
            return stub(cfg, resume, pipeline)

    monkeypatch.setattr(generate_job, "run_generation", generate)
    out = tmp_path / "lb"
    args = ["--configs", "aba", "--caches", "sliding,field", "--images", TWO_IMAGES.split(",")[0], "--seeds", "0",
            "--chunks", 2, "-o", out]
    result = lb("run", *args)
    assert result.exit_code == 130, result.output
    assert len(fake_generate) == 1 and not (out / "failures.jsonl").exists()
    stopped = [ln for ln in result.output.splitlines() if ln.startswith("worldtrace: stopped:")]
    assert len(stopped) == 1 and "stopped before job [2/2]" in stopped[0] and "rerun the same command" in stopped[0]
    assert signal.getsignal(signal.SIGTERM) is not None and not isinstance(
        getattr(signal.getsignal(signal.SIGTERM), "__self__", None), StopFlag)  # handlers restored
    monkeypatch.setattr(generate_job, "run_generation", stub)
    result = lb("run", *args)
    assert result.exit_code == 0 and "1 done, 1 skipped" in result.output and len(fake_generate) == 2


def test_a_stop_heard_before_a_runs_own_flag_reaches_that_flag():
    """A signal the sweep's flag hears while a job sets up (before the run holds its own flag) is the
    run's too: it stops after its first chunk rather than running every chunk, and a second Ctrl-C
    then aborts at once, as the first one's message ("Ctrl-C again to abort now") says."""
    import os
    import signal

    from worldtrace_cli.jobs.sinks import StopFlag

    with StopFlag("stopping after the current job") as outer:
        with StopFlag() as fresh:
            assert fresh.signal is None  # nothing heard: a run's flag starts clear
        os.kill(os.getpid(), signal.SIGTERM)
        assert outer.signal == signal.SIGTERM
        with StopFlag() as inner:
            assert inner.signal == signal.SIGTERM
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler runs between bytecodes
                    pass
        assert outer.signal == signal.SIGTERM
    assert not isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), StopFlag)


def test_changed_settings_do_not_reuse_runs(tmp_path, fake_generate):
    """Complete runs of other settings refuse the whole sweep before any job runs: one line naming
    how many jobs clash and the first one's differences (exit 4), nothing run, no failure records."""
    out = tmp_path / "lb"
    assert lb("run", *MATRIX[:-2], "--seeds", "0", "--configs", "aba", "--chunks", 2, "-o", out).exit_code == 0
    ran = len(fake_generate)
    result = lb("run", *MATRIX[:-2], "--seeds", "0", "--configs", "aba", "--chunks", 3, "-o", out)
    line = one_line_error(result, 4)
    assert "6 of 6 jobs" in line and "chunks 2 (now 3)" in line and "use another -o folder" in line
    assert "--overwrite" not in line  # loopbench run has no such option
    assert len(fake_generate) == ran and not (out / "failures.jsonl").exists()
    # settings that change the numbers count too; --overlap-decode does not
    result = lb("run", *MATRIX[:-2], "--seeds", "0", "--configs", "aba", "--chunks", 2, "--overlap-decode", "-o", out)
    assert result.exit_code == 0 and "skipped" in result.output
    result = lb("run", *MATRIX[:-2], "--seeds", "0", "--configs", "aba", "--chunks", 2, "--rope-precision", "float64",
                "-o", out)
    assert "rope_precision 'float32' (now 'float64')" in one_line_error(result, 4)


def test_a_job_whose_folder_cannot_be_read_is_its_failure_not_the_sweeps(tmp_path, fake_generate, monkeypatch):
    """The next step of every job is decided before any runs; an unexpected error there is recorded
    as that job's failure and the other jobs run, as when a job itself fails."""
    from worldtrace_cli.runs import resume as run

    real = run.next_step

    def next_step(folder, cfg, remedy=None):
        if "seed0" in str(folder) and "field" in str(folder):
            raise RuntimeError("unreadable folder")
        return real(folder, cfg, remedy)

    monkeypatch.setattr(run, "next_step", next_step)
    out = tmp_path / "lb"
    result = lb("run", *MATRIX[:-2], "--seeds", "0", "--configs", "aba", "--chunks", 2, "-o", out)
    assert result.exit_code == 5 and len(fake_generate) == 4  # 6 jobs, the 2 field ones failed
    assert "unreadable folder" in (out / "failures.jsonl").read_text()


def test_a_checkpoint_that_is_not_a_folder_stops_the_sweep_before_any_job(tmp_path, fake_generate):
    out = tmp_path / "lb"
    result = lb("run", *MATRIX[:-2], "--seeds", "0", "--configs", "aba", "--chunks", 2, "--preset", "mg2-universal",
                "--checkpoint", tmp_path / "nosuch", "-o", out)
    assert "not a folder" in one_line_error(result, 3)
    assert fake_generate == [] and not (out / "failures.jsonl").exists()


def test_shard_flags_partition_the_jobs(tmp_path, fake_generate):
    out = tmp_path / "lb"
    assert lb("run", *MATRIX, "--shard", "0/2", "-o", out).exit_code == 0
    first = list(fake_generate)
    fake_generate.clear()
    assert lb("run", *MATRIX, "--shard", "1/2", "-o", out).exit_code == 0
    assert len(first) == len(fake_generate) == 18 and not set(first) & set(fake_generate)
    assert len(collect(out)) == 36

    jobs = plan.plan_jobs(["aba", "abca"], ["sliding"], plan.resolve_images(TWO_IMAGES), [0, 1, 2])
    parts = [plan.shard(jobs, i, 4) for i in range(4)]
    assert sorted(j for p in parts for j in p) == jobs


def test_torchrun_env_shards(tmp_path, fake_generate):
    out = tmp_path / "lb"
    ranks = []
    for rank in range(3):
        fake_generate.clear()
        env = {"RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": "0"}  # one node per rank: GPU 0 if any
        result = lb("run", *MATRIX, "-o", out, env=env)
        assert result.exit_code == 0, result.output
        assert f"shard {rank}/3" in result.output
        ranks.append(set(fake_generate))
    assert [len(r) for r in ranks] == [12, 12, 12] and len(set.union(*ranks)) == 36
    # --shard on top of torchrun: machine 1 of 2, rank 1 of 3 -> shard 4 of 6.
    assert plan.combine_shards((1, 2), (1, 3)) == (4, 6)
    assert plan.shard_from_env({}) == (0, 1, None)
    assert plan.shard_from_env({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})[:2] == (2, 4)


def test_local_rank_selects_the_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert plan.shard_from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == (5, 8, "cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plan.shard_from_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == (5, 8, None)


@pytest.mark.parametrize("args, code, words", [
    (["--shard", "2/2"], 2, ["--shard", "2/2"]),
    (["--shard", "one/two"], 2, ["--shard", "i/n"]),
    (["--configs", "aba,nope"], 2, ["nope", "abcda", "aba_n256"]),
    (["--caches", "sliding,nope"], 2, ["--caches: unknown writer 'nope'"]),  # the flag is --caches here
    (["--caches", "sliding", "--summary-slots", "2"], 2, ["--summary-slots: --caches sliding does not use it"]),
    (["--images", "/no/such.png"], 2, ["/no/such.png"]),
    (["--seeds", "0,x"], 2, ["--seeds"]),
])
def test_bad_inputs_are_one_line_errors(tmp_path, fake_generate, args, code, words):
    base = {"--configs": "aba", "--caches": "sliding", "--images": TWO_IMAGES, "--seeds": "0"}
    base.update(dict(zip(args[::2], args[1::2])))
    line = one_line_error(lb("run", *[x for kv in base.items() for x in kv], "-o", tmp_path / "lb"), code)
    assert all(w in line for w in words), line
    assert fake_generate == []


def test_bad_torchrun_env_is_an_error(tmp_path, fake_generate):
    line = one_line_error(lb("run", *MATRIX, "-o", tmp_path, env={"RANK": "3", "WORLD_SIZE": "2"}), 2)
    assert "RANK=3" in line


def test_real_tiny_sweep_and_report(tmp_path):
    """The real model end to end: two writers at 2 chunks, then the report (PAC undefined: no
    revisit within 2 chunks, so the tables show dashes)."""
    out = tmp_path / "lb"
    args = ["--preset", "tiny", "--configs", "pan_90", "--caches", "sliding,landmark",
            "--images", IMAGES / "mg2_universal_0000.png", "--seeds", "0", "--chunks", 2, "-o", out]
    result = lb("run", *args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "pan_90" / "landmark" / "mg2_universal_0000" / "seed0" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["chunks"] == 2
    assert summary["metrics"]["level"] == "all" and summary["metrics"]["temp_ssim"] is not None
    assert summary["metrics"]["gt"] is None  # a random preset with --images: no ground truth, said as null
    assert "0 done, 2 skipped" in lb("run", *args).output

    result = lb("report", out)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert len(rows) == 2 and {r["cache"] for r in rows} == {"sliding", "landmark"}
    assert all(r["pac"] == "" and float(r["temp_ssim"]) > -1 for r in rows)
    md = (out / "report.md").read_text()
    pac = md.split("## 1. PAC")[1].split("## 2.")[0]  # no ground truth: PAC and TempSSIM, one table each
    assert "| landmark | — |" in pac and "| p vs sliding |" not in md  # one pair per cell: no t-test
    assert "| pan_90 (pan_90, N=2) | not run |" not in md and "Pan 360° (pan_360, N=8)" in md


def test_real_sweep_with_attention_stats_reports_recall_attention(tmp_path):
    """``loopbench run --attention-stats`` end to end on the real tiny model: pan_360 comes back to its
    start view; landmark's cache still holds it there (its recall attention above 0) and sliding's
    window of the last chunks does not (0), in report.csv and report.md's recall table."""
    out = tmp_path / "lb"
    result = lb("run", "--preset", "tiny", "--configs", "pan_360", "--caches", "sliding,landmark", "--images",
                IMAGES / "mg2_universal_0000.png", "--seeds", "0", "--attention-stats", "-o", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "pan_360" / "landmark" / "mg2_universal_0000" / "seed0" / "summary.json").read_text())
    assert summary["config"]["attention_stats"] is True and summary["attention"]["recall"]["chunks"]
    result = lb("report", out)
    assert result.exit_code == 0, result.output
    rows = {r["cache"]: r for r in csv.DictReader((out / "report.csv").open())}
    assert float(rows["sliding"]["recall_attention"]) == 0.0 < float(rows["landmark"]["recall_attention"])
    assert float(rows["landmark"]["attention_self"]) > 0
    md = (out / "report.md").read_text()
    assert "## 1. Recall attention on return chunks" in md and "| landmark | 0." in md.split("## 1. Recall")[1]


# --------------------------------------------------------------------------- report statistics


@pytest.fixture
def summaries_only(monkeypatch):
    """Synthetic sweeps hold summaries only (no records, no video): the report's folder check is
    tested on real folders (test_report_checks_every_run_folder)."""
    monkeypatch.setattr(RunFolder, "check", lambda self, frames_for_chunks: {})


def write_run(out, config, cache, image, seed, pac, temp_ssim, chunks=16, gt=None, detail=None, recall=None):
    folder = out / config / cache.replace(":", "-") / image / f"seed{seed}"
    folder.mkdir(parents=True)
    write_json_atomic(folder / "summary.json", {
        "status": "complete", "config": {"memory": {"cache": cache}, "preset": {"name": "tiny"}},
        "resolved": {"seed": seed}, "cache": {"kv_bytes": 4096},
        "attention": None if recall is None else {"pass": "last_denoising_step", "queries": "all", "chunks": chunks,
                                                  "self": 0.5, "summary": 0.3, "recent": 0.2,
                                                  "recall": {"chunks": [9], "per_chunk": [recall], "mean": recall}},
        "metrics": {"temp_ssim": temp_ssim, "latent_diff": 0.2, "scene_drift": 0.05,
                    "pac": None if pac is None else {"mean": pac, "pairs": 3},
                    **({} if gt is None else {"gt": {"psnr": gt + 1, "ssim": 0.5,
                                                     "return": {"chunks": [9], "psnr": gt, "ssim": 0.4,
                                                                "detail": detail}}})},
        "totals": {"chunks": chunks, "seconds_per_chunk": 1.5, "peak_rss_bytes": 10 * 2**20, "gpu_peak_bytes": None}})


def synthetic_value(config, cache, image, seed):
    base, slope = {"sliding": (0.6, 0.03), "field": (0.65, 0.03), "landmark": (0.8, 0.05)}[cache]
    return round(base + slope * int(image[-1]) + 0.01 * seed * (1 + (cache == "field")) + 0.002 * len(config), 6)


def hand_paired_p(xs, ys):
    """Two-sided paired t-test p from the closed form t = mean(d) / (sd(d) / sqrt(n))."""
    from scipy.stats import t as student

    d = [x - y for x, y in zip(xs, ys)]
    n, md = len(d), sum(d) / len(d)
    t = md / (math.sqrt(sum((v - md) ** 2 for v in d) / (n - 1)) / math.sqrt(n))
    return 2 * student.sf(abs(t), n - 1)


@pytest.fixture
def synthetic_sweep(tmp_path, summaries_only):
    out = tmp_path / "sweep"
    configs = {"aba": 16, "abca": 17, "aba_short": 8, "aba_long": 32, "pan_90": 4, "aba_n64": 64}
    for config, n in configs.items():
        for cache in ("sliding", "field", "landmark"):
            for image in ("s1", "s2", "s3"):
                for seed in (0, 1):
                    v = synthetic_value(config, cache, image, seed)
                    pac = None if config == "pan_90" and cache == "field" else v
                    write_run(out, config, cache, image, seed, pac, v / 2, chunks=n)
    (out / "aba" / "field" / "s1" / "seed5").mkdir(parents=True)  # an unfinished job: not a row
    return out


def test_report_tables_csv_json_and_plots(synthetic_sweep, valid):
    result = CliRunner().invoke(loopbench, ["report", str(synthetic_sweep), "-o", str(synthetic_sweep / "rep")])
    assert result.exit_code == 0, result.output
    rep = synthetic_sweep / "rep"
    rows = list(csv.DictReader((rep / "report.csv").open()))
    assert len(rows) == 6 * 3 * 3 * 2
    md = (rep / "report.md").read_text()
    tables = md.count("| writer |")
    assert tables == 2 * (1 + 3 + 1 + 1) + 1  # per metric (PAC, TempSSIM): by tier; tiers 1-3 + sweep; by N; cost
    for writer in ("sliding", "field", "landmark"):
        assert md.count(f"| {writer} |") == tables
    assert md.index("## 1. PAC") < md.index("## 2. TempSSIM")  # no ground truth: the paper's order
    assert "p vs sliding" in md and "aba_long (N=32)" in md and "| N=64 |" in md
    assert "108 complete runs (6 configurations x 3 writers x 3 scenes x 2 seeds)." in md  # a full grid
    from worldtrace_cli.loopbench.tables import plural

    assert plural(1, "run") == "1 run" and plural(0, "seed") == "0 seeds"
    pan = md.split("## 1. PAC")[1].split("### Tier 3: camera orientation")[1].split("###")[0]
    assert "| field | — |" in pan  # pan_90 field has no PAC: a dash, not a crash
    paper = md.split("## The paper's table, side by side")[1].split("## 1.")[0]
    assert "| ABA (aba, N=16) | 0.723 ± 0.013 | 0.864 ± 0.009 |" in paper  # the paper's own numbers
    assert "| ABABA (ababa, N=32) | 0.892 ± 0.004 | 0.941 ± 0.005 | not run | not run | 3 |" not in paper
    assert "| ABABA (ababa, N=32) | 0.892 ± 0.004 | 0.941 ± 0.005 | not run | not run | not run |" in paper
    assert "Not in this sweep: ababa, pan_360" in paper
    data = json.loads((rep / "report.json").read_text())
    assert len(data["rows"]) == 108 and data["baseline"] == "sliding"
    valid(data, "loopbench-report")
    for name in ("pac_vs_chunks.png", "tiers.png"):
        assert (rep / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # CI against a hand computation: landmark on aba, PAC; per scene the mean over seeds 0 and 1.
    cell = next(c for c in data["by_config"] if c["config"] == "aba" and c["writer"] == "landmark")
    scenes = [(synthetic_value("aba", "landmark", s, 0) + synthetic_value("aba", "landmark", s, 1)) / 2
              for s in ("s1", "s2", "s3")]
    mean = sum(scenes) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in scenes) / 2)
    assert cell["pac"]["mean"] == pytest.approx(mean)
    assert cell["pac"]["ci"] == pytest.approx(T_975_DF2 * sd / math.sqrt(3))
    assert cell["pac"]["scenes"] == 3 and cell["pac"]["pairs"] == 6
    keys = [(s, seed) for s in ("s1", "s2", "s3") for seed in (0, 1)]
    assert cell["pac"]["p"] == pytest.approx(hand_paired_p([synthetic_value("aba", "landmark", *k) for k in keys],
                                                           [synthetic_value("aba", "sliding", *k) for k in keys]))
    base = next(c for c in data["by_config"] if c["config"] == "aba" and c["writer"] == "sliding")
    assert base["pac"]["p"] is None


def test_mean_ci_and_paired_test_edge_cases():
    assert mean_ci([]) == (None, None) and mean_ci([0.5]) == (0.5, None)
    m, ci = mean_ci([1.0, 2.0, 3.0])
    assert m == 2.0 and ci == pytest.approx(T_975_DF2 * 1.0 / math.sqrt(3))
    rows = [{"config": "aba", "image": f"s{i}", "seed": 0, "pac": v} for i, v in enumerate([0.8, 0.9, 0.7, 0.95])]
    base = [{"config": "aba", "image": f"s{i}", "seed": 0, "pac": v} for i, v in enumerate([0.6, 0.65, 0.66, 0.7])]
    p, pairs = paired_test(rows, base, "pac")
    assert pairs == 4 and p == pytest.approx(hand_paired_p([0.8, 0.9, 0.7, 0.95], [0.6, 0.65, 0.66, 0.7]))
    assert paired_test(rows[:1], base, "pac") == (None, 1)
    base[1]["pac"] = None
    assert paired_test(rows, base, "pac")[1] == 3


def test_report_checks_every_run_folder(tmp_path):
    """Issue 15: the report trusted any complete summary. A run folder whose records repeat a chunk
    (two writers) or whose video lost chunks is a one-line error naming it (exit 7)."""
    import numpy as np

    from worldtrace_cli.outputs import VideoStreamWriter
    from worldtrace_cli.trajectory import frames_for_chunks

    out = tmp_path / "lb"
    for cache in ("sliding", "landmark"):
        write_run(out, "aba", cache, "s1", 0, 0.7, 0.8, chunks=2)
        folder = RunFolder(out / "aba" / cache / "s1" / "seed0")
        with VideoStreamWriter(folder.video, 32, 16) as video:
            video.write(np.zeros((frames_for_chunks(2), 16, 32, 3), np.uint8))
        folder.chunks.write_text('{"chunk": 0}\n{"chunk": 1}\n')
    assert lb("report", out).exit_code == 0
    folder.chunks.write_text('{"chunk": 0}\n{"chunk": 1}\n{"chunk": 0}\n{"chunk": 1}\n')
    line = one_line_error(lb("report", out), 7)
    assert str(folder.chunks) in line and "repeated" in line


def test_report_of_an_empty_folder_is_an_error(tmp_path):
    line = one_line_error(CliRunner().invoke(loopbench, ["report", str(tmp_path)]), 2)
    assert "no complete LoopBench runs" in line


def test_report_says_when_a_sweep_is_not_a_full_grid(synthetic_sweep):
    write_run(synthetic_sweep, "abcda", "landmark", "s1", 0, 0.5, 0.25, chunks=16)  # one config, one writer
    md = report(synthetic_sweep)["report.md"].read_text()
    assert "109 complete runs (7 configurations x 3 writers x 3 scenes x 2 seeds, not every combination)." in md


def test_report_counts_failed_jobs(synthetic_sweep):
    job = plan.Job("aba", "field", "s9", 0, image=Path("s9.png"))
    sweep.record_failure(synthetic_sweep, job, ValueError("bad | thing"))
    paths = report(synthetic_sweep)
    md = paths["report.md"].read_text()
    assert "1 failed" in md and "aba/field/s9/seed0" in md and "bad \\| thing" in md


def test_world_scenes(tmp_path):
    """Procedural worlds are scenes too: --worlds parses ranges, jobs run in world<N> folders and pass
    the world seed to the run; image-only presets refuse --worlds."""
    assert plan.parse_worlds("0-3,7") == [0, 1, 2, 3, 7] and plan.parse_worlds("5") == [5]
    for bad in ("3-1", "-2", "a", ","):
        with pytest.raises(InputError):
            plan.parse_worlds(bad)
    jobs = plan.plan_jobs(["pan_90"], ["sliding"], [], [0], worlds=[2, 1])
    assert [j.key for j in jobs] == ["pan_90/sliding/world1/seed0", "pan_90/sliding/world2/seed0"]
    assert jobs[0].world == 1 and jobs[0].image is None
    mixed = plan.plan_jobs(["pan_90"], ["sliding"], [IMAGES / "mg2_universal_0000.png"], [0], worlds=[0])
    assert {j.scene for j in mixed} == {"mg2_universal_0000", "world0"}
    line = one_line_error(lb("run", "--preset", "tiny", "--worlds", "0-1", "--configs", "aba", "-o", tmp_path), 2)
    assert "--worlds" in line and "tiny" in line
    line = one_line_error(lb("run", "--preset", "tiny", "--configs", "aba", "-o", tmp_path), 2)
    assert "--images" in line


def test_world_jobs_reach_the_run(tmp_path, fake_generate):
    result = lb("run", "--configs", "pan_90", "--caches", "sliding", "--worlds", "3", "--seeds", "0", "-o", tmp_path)
    assert result.exit_code == 0, result.output
    assert list(fake_generate) == ["pan_90/sliding/world3/seed0"]
    cfg = json.loads((tmp_path / "pan_90" / "sliding" / "world3" / "seed0" / "summary.json").read_text())["config"]
    assert cfg["world_seed"] == 3 and cfg["image"] is None and cfg["preset"]["name"] == "loopworld"


def test_report_has_a_ground_truth_column(tmp_path, summaries_only):
    """Runs with ground truth (procedural worlds) add return-leg GT-PSNR and GT detail beside PAC /
    TempSSIM, with CIs over scenes and a paired test against sliding."""
    out = tmp_path / "gt"
    runs = {"world0": ((14.0, 0.20), (16.0, 0.30)), "world1": ((15.0, 0.25), (16.5, 0.28)),
            "world2": ((13.0, 0.10), (15.2, 0.26))}
    for scene, ((s_gt, s_detail), (l_gt, l_detail)) in runs.items():
        write_run(out, "aba", "sliding", scene, 0, 0.7, 0.8, gt=s_gt, detail=s_detail)
        write_run(out, "aba", "landmark", scene, 0, 0.8, 0.8, gt=l_gt, detail=l_detail)
    report(out)
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert {float(r["gt_return_psnr"]) for r in rows if r["cache"] == "landmark"} == {16.0, 16.5, 15.2}
    md = (out / "report.md").read_text()
    assert md.index("## 1. GT-PSNR on return legs (dB)") < md.index("## 2. GT detail on return legs") \
        < md.index("## 3. PAC") < md.index("## 4. TempSSIM") and "nearer 1" in md
    psnr = md.split("## 1. GT-PSNR")[1].split("## 2.")[0]
    detail = md.split("## 2. GT detail")[1].split("## 3.")[0]
    assert "| landmark | 15.900 ± " in psnr and "| landmark | 0.280 ± " in detail  # means of 16.0, 16.5, 15.2 / 0.30, 0.28, 0.26
    paper = next(ln for ln in md.splitlines() if ln.startswith("| ABA (aba, N=16) |"))
    cells = paper.strip(" |").split(" | ")
    assert cells[3:5] == ["0.700 ± 0.000", "0.800 ± 0.000"] and cells[5].startswith("14.000 ± ")
    assert cells[6].startswith("15.900 ± ") and float(cells[7]) == pytest.approx(
        hand_paired_p([16.0, 16.5, 15.2], [14.0, 15.0, 13.0]), abs=5e-4) and cells[8] == "3"
    data = json.loads((out / "report.json").read_text())
    cell = next(c for c in data["by_config"] if c["writer"] == "landmark")
    assert cell["gt_return_psnr"]["p"] == pytest.approx(hand_paired_p([16.0, 16.5, 15.2], [14.0, 15.0, 13.0]))
    assert cell["gt_return_detail"]["p"] == pytest.approx(hand_paired_p([0.30, 0.28, 0.26], [0.20, 0.25, 0.10]))
    assert cell["gt_return_detail"]["mean"] == pytest.approx(0.28) and cell["gt_return_detail"]["scenes"] == 3


def test_report_leads_with_ground_truth_and_prints_no_impossible_interval(tmp_path, summaries_only):
    """Issue 37: the report led with PAC (which does not track ground truth here) and, over two
    scenes, printed intervals past what a metric can take (PAC above 1, GT detail below 0)."""
    out = tmp_path / "two"
    for scene, (pac, gt, detail) in {"world0": (0.99, 14.0, 0.02), "world1": (0.40, 15.0, 0.60)}.items():
        write_run(out, "aba", "sliding", scene, 0, pac, 0.8, gt=gt, detail=detail)
    report(out)
    md = (out / "report.md").read_text()
    firsts = [md.split(f"## {k}. ")[1].split("\n")[0] for k in (1, 2, 3, 4)]
    assert firsts == ["GT-PSNR on return legs (dB)", "GT detail on return legs", "PAC", "TempSSIM"]
    psnr, detail, pac, ssim = [next(ln for ln in md.split(f"## {k}. ")[1].splitlines() if ln.startswith("| sliding |"))
                               .strip(" |").split(" | ")[1] for k in (1, 2, 3, 4)]
    assert psnr.startswith("14.500 ± ")  # 14.5 +- 6.4 dB stays above 0
    assert detail == "0.310 †" and pac == "0.695 †" and ssim == "0.800 ± 0.000"  # one number per cell
    assert md.count("too few scenes") == 1 and md.count("† = no interval") == 1  # the reason said once


def test_report_has_recall_attention_with_paired_tests_beside_gt(tmp_path, summaries_only):
    """Runs made with --attention-stats: the recall attention on return chunks gets its table after the GT
    metrics (CIs over scenes, the paired test against sliding) and columns in the paper's layout."""
    out = tmp_path / "recall"
    runs = {"world0": (0.00, 0.12), "world1": (0.02, 0.10), "world2": (0.01, 0.15)}
    for scene, (slid, land) in runs.items():
        write_run(out, "aba", "sliding", scene, 0, 0.7, 0.8, gt=14.0, detail=0.2, recall=slid)
        write_run(out, "aba", "landmark", scene, 0, 0.8, 0.8, gt=15.0 + slid, detail=0.3, recall=land)
    report(out)
    md = (out / "report.md").read_text()
    assert md.index("## 2. GT detail") < md.index("## 3. Recall attention on return chunks") < md.index("## 4. PAC")
    table = md.split("## 3. Recall attention")[1].split("## 4.")[0]
    assert "| landmark | 0.123 ± " in table and "p vs sliding" in table and "the memory being read" in md
    paper = next(ln for ln in md.splitlines() if ln.startswith("| ABA (aba, N=16) |")).strip(" |").split(" | ")
    header = next(ln for ln in md.splitlines() if ln.startswith("| loop |")).strip(" |").split(" | ")
    recall = dict(zip(header, paper))
    assert recall["sliding recall attention"] == "0.010 †"  # its interval would reach below 0: none given
    assert recall["landmark recall attention"].startswith("0.123 ± ")
    assert float(recall["p (recall)"]) == pytest.approx(hand_paired_p([0.12, 0.10, 0.15], [0.0, 0.02, 0.01]), abs=5e-4)
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert {float(r["recall_attention"]) for r in rows if r["cache"] == "landmark"} == {0.12, 0.10, 0.15}


def test_report_of_runs_before_gt_detail_has_no_detail_entry(tmp_path, summaries_only):
    """Runs scored before GT detail existed (no return-leg detail) keep the three entries: no column
    of dashes."""
    out = tmp_path / "old"
    for scene, value in {"world0": 14.0, "world1": 15.0}.items():
        write_run(out, "aba", "sliding", scene, 0, 0.7, 0.8, gt=value)
    report(out)
    md = (out / "report.md").read_text()
    assert "GT-PSNR on return legs" in md and "GT detail" not in md
    assert "gt_return_detail" not in json.loads((out / "report.json").read_text())["by_config"][0]


def test_plots_name_tiers_and_scale_to_the_data():
    from matplotlib.figure import Figure

    from worldtrace_cli.loopbench.plots import _fit_y, clipped, tier_label

    assert tier_label(1) == "Tier 1\ntopology" and tier_label("sweep") == "ABA sweep"
    ax = Figure().add_subplot()
    _fit_y(ax, [(0.97, 0.01), (0.99, 0.005), (None, None), (float("nan"), 0.1)])
    low, high = ax.get_ylim()
    assert 0.95 < low < 0.96 and 0.995 < high < 1.0  # PAC differences visible, not bars from 0
    # issue 47: bars stay inside each metric's range (two scenes gave PAC up to 1.47, GT detail -1.0)
    # issue 47: no error bar reaches values a metric cannot take (two scenes gave PAC up to 1.47, GT
    # detail -1.0): as the table's †, such a cell has no bar
    assert clipped(0.695, 0.775, "pac") == (0.0, 0.0) and clipped(0.31, 1.31, "gt_return_detail") == (0.0, 0.0)
    assert clipped(14.5, 6.4, "gt_return_psnr") == (6.4, 6.4) and clipped(0.9, 0.05, "pac") == (0.05, 0.05)
    assert clipped(None, 1.0) == (0.0, 0.0) and clipped(0.5, None, "pac") == (0.0, 0.0)
    _fit_y(ax, [(0.695, 0.775), (0.99, None)], "pac")
    assert ax.get_ylim() == pytest.approx((0.695 - 0.0295, 0.99 + 0.0295))  # no bar: the means alone, plus 10 %
