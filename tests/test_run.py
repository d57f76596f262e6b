"""The one run object (worldtrace_cli.runs.run.Run) on its own, without a face: fed a trajectory's
requests by hand it makes ``generate``'s frames chunk for chunk, its summary is a valid summary.json,
and its saved parts continue it exactly (what resume states and saved sessions hold). Tiny MG2 preset,
CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGE = ROOT / "assets/images/mg2_universal_0000.png"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(cfg, inputs, pipeline, generate's chunks.jsonl shas) of a 3-chunk landmark run on aba.yaml."""
    from worldtrace_cli.config import RunConfig, load_preset, memory_config
    from worldtrace_cli.engine.pipeline import Pipeline
    from worldtrace_cli.jobs.generate import run_generation
    from worldtrace_cli.jobs.inputs import prepare_inputs

    preset = load_preset("tiny")
    out = tmp_path_factory.mktemp("run") / "generated"
    cfg = RunConfig(preset=preset, trajectory=ROOT / "trajectories/aba.yaml", output=out, image=IMAGE, chunks=3,
                    device="cpu", progress=False, memory=memory_config("landmark", preset=preset), attention_stats=True)
    pipeline = Pipeline.from_config(cfg)
    run_generation(cfg, pipeline=pipeline)
    shas = [json.loads(line)["frames_sha256"] for line in (out / "chunks.jsonl").read_text().splitlines()]
    return cfg, prepare_inputs(cfg), pipeline, shas


def _run(made, **options):
    from worldtrace_cli.jobs.generate import new_run

    cfg, inputs, pipeline, _ = made
    return new_run(pipeline, cfg, inputs, **options)  # whole when built


def test_a_run_fed_by_hand_makes_generates_frames_and_a_valid_summary(made, valid):
    cfg, inputs, _, shas = made
    run = _run(made)
    feed = run.feed
    assert feed is not None  # MG2 is fed a request per chunk
    got = [out.record["frames_sha256"] for c in range(3) for out in run.advance(feed.request(c))]
    run.close()
    assert got == shas
    summary = json.loads(json.dumps(run.summary("complete")))  # the document summary.json holds
    valid(summary, "summary")
    assert summary["run_dir"] is None and summary["totals"]["chunks"] == 3 and summary["cache"]["cache"] == "landmark"
    assert summary["attention"] is not None and summary["resolved"]["image"] == inputs.image_label
    assert summary["totals"]["seconds"]["denoise"] > 0 and summary["totals"]["seconds"]["conditioning"] > 0


def test_a_runs_parts_continue_it_exactly(made):
    from worldtrace_cli.runs.run import Restored
    from worldtrace_cli.session.parts import clone_tree

    *_, shas = made
    first = _run(made)
    feed = first.feed
    for c in range(2):
        first.advance(feed.request(c))
    # a fresh run given the first one's parts after chunk 2
    second = _run(made, restored=Restored(clone_tree(first.parts()), 2), records=list(first.records))
    feed = second.feed
    later = [out.record["frames_sha256"] for out in second.advance(feed.request(2))]
    assert later == shas[2:]
    assert len(second.records) == 3 and second.tally.max_offset() is not None
    first.close()
    second.close()
