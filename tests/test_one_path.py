"""Issue 68: one path of a chunk through the code. One builder of a run's conditioning (its prompt its
own field), a declared pipeline interface whose registry rows agree with their classes, one way to feed
a rollout, a rollout step whose per-chunk inputs are arguments, and a run that is whole when built."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest


def _cfg(row, prompt=None, switch="recache"):
    return SimpleNamespace(preset=SimpleNamespace(backbone=row), prompt=prompt, prompt_switch=switch)


def test_one_conditioning_builder_keeps_the_prompt_as_its_own_field():
    """A backbone with a run prompt and no camera files keeps ``--prompt`` (generate, sessions and bench
    alike): the prompt never comes off the camera-file object."""
    from worldtrace_cli.config.backbones import BACKBONES
    from worldtrace_cli.engine.base import RunConditioning

    no_files = replace(BACKBONES["lingbot"], architecture="prompt-no-files", camera_files=False)
    got = RunConditioning.of(_cfg(no_files, prompt="a lighthouse"), 3, image="img")
    assert (got.num_chunks, got.image, got.prompt, got.camera) == (3, "img", "a lighthouse", None)
    assert RunConditioning.of(_cfg(no_files, prompt="flag"), 1, prompt="trajectory's").prompt == "trajectory's"
    mg2 = RunConditioning.of(_cfg(BACKBONES["mg2"], prompt="ignored"), 2, prompts=["x", "y"], camera=object())
    assert (mg2.prompt, mg2.prompts, mg2.camera) == (None, None, None)  # what the row does not take is dropped
    text = RunConditioning.of(_cfg(BACKBONES["selfforcing"], switch="plain"), 2, prompts=["x", "y"])
    assert (text.prompts, text.switch) == (["x", "y"], "plain")


def test_generate_reads_the_prompt_option_not_the_camera_files(tmp_path):
    """generate's conditioning: ``--prompt`` (else the trajectory's) as the prompt field, camera files or not."""
    from pathlib import Path

    from worldtrace_cli.config import RunConfig, load_preset
    from worldtrace_cli.jobs.generate import run_conditioning
    from worldtrace_cli.jobs.inputs import prepare_inputs

    root = Path(__file__).resolve().parent.parent
    cfg = RunConfig(preset=load_preset("lingbot-tiny"), trajectory=root / "trajectories/aba.yaml",
                    output=tmp_path / "out", chunks=1, device="cpu", prompt="a red lighthouse")
    inputs = prepare_inputs(cfg)
    cond = run_conditioning(cfg, inputs)
    assert cond.prompt == "a red lighthouse" == inputs.prompt


def test_every_registry_row_agrees_with_its_pipeline_class():
    """Each row's capability flags (start image, prompts, camera files, CLIP tokens, text encoder, camera)
    are what its class declares it reads, and the class implements every abstract method."""
    import inspect
    import sys
    from pathlib import Path

    from worldtrace_cli.config.backbones import BACKBONES
    from worldtrace_cli.engine.base import PipelineBase, check_row, expected_reads

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from echo_backbone import ROW, STILL

    rows = [*BACKBONES.values(), ROW, STILL]
    for row in rows:
        cls = row.load("pipeline")
        assert issubclass(cls, PipelineBase) and not inspect.isabstract(cls), row.architecture
        check_row(row, cls)
        assert ("clip" in cls.reads) == row.clip_conditioning  # the flag is read: it says what the class reads
    assert expected_reads(BACKBONES["mg2"]) == {"image", "clip", "poses"}


def test_a_row_that_disagrees_with_its_class_is_refused():
    from worldtrace_cli.config.backbones import BACKBONES
    from worldtrace_cli.engine.base import PipelineBase, check_row

    row = BACKBONES["mg2"]
    with pytest.raises(TypeError, match="clip"):
        check_row(replace(row, clip_conditioning=False), row.load("pipeline"))
    with pytest.raises(TypeError, match="image"):
        check_row(replace(row, start_image=False), row.load("pipeline"))

    class Half(PipelineBase):
        reads = frozenset({"image"})

        def condition(self, request):
            return None

    with pytest.raises(TypeError, match="from_preset"):
        check_row(row, Half)
    with pytest.raises(TypeError):
        Half(None, None, None, None, "float32", "none")  # abstract methods left: not instantiable


def test_one_prompt_switch_test_and_one_way_to_feed():
    """A switch is ``ChunkRequest.switches`` alone; a whole run's inputs feed a rollout through the same
    ConditioningFeed (``whole``), whose requests hold every row from row 0."""
    import torch

    from worldtrace_cli.engine.feed import ChunkRequest, ConditioningFeed

    assert not ChunkRequest(0, prompt="a").switches and not ChunkRequest(3).switches
    assert not ChunkRequest(2, prompt="a", previous_prompt="a").switches
    assert ChunkRequest(2, prompt="b", previous_prompt="a").switches
    kb, poses = torch.ones(21, 4), torch.eye(4).expand(6, 4, 4)
    got = ConditioningFeed.whole(kb, None, poses).request(1)
    assert got.chunk == 1 and got.keyboard is kb and got.first_row == 0 and got.poses is poses
    feed = ConditioningFeed.whole(prompts=["a", "a", "b"])
    assert [feed.request(c).switches for c in range(5)] == [False, False, True, False, False]


def test_the_hot_path_keeps_no_second_way_and_no_hidden_state():
    """No self-feeding hook beside the feed, no noise side channel, no step-by-step run building, no
    second chunk loop in bench speed."""
    import inspect

    from worldtrace_cli.engine import base, rollout, text_rollout
    from worldtrace_cli.jobs import bench_speed
    from worldtrace_cli.runs.run import Run

    assert not hasattr(base.PipelineBase, "feeds_itself") and hasattr(base.PipelineBase, "feed")
    for cls in (rollout.ChunkRollout, rollout.Rollout, text_rollout.TextRollout):
        assert not hasattr(cls, "own_request") and not hasattr(cls, "_dit")
    assert "chunk_draw" not in inspect.getsource(rollout) and "self._rows" not in inspect.getsource(text_rollout)
    for gone in ("condition", "start", "record_into", "open_loop", "load_parts", "feeds_itself"):
        assert not hasattr(Run, gone), gone
    src = inspect.getsource(bench_speed.speed_benchmark)
    assert ".step(" not in src and "DecodePipeline" not in src and "Run(" in src


def test_a_switch_not_recached_reads_the_new_prompt():
    """``recache-keep-sink`` before the sink is complete re-caches nothing; the chunk still reads the new
    prompt (its text K/V made anew), so it equals the ``plain`` switch's chunk. (Before the one switch
    test, this chunk read the old prompt's text K/V.)"""
    import torch

    from worldtrace_cli.config import load_preset, memory_config
    from worldtrace_cli.engine.base import RunConditioning
    from worldtrace_cli.engine.pipeline import Pipeline
    from worldtrace_cli.engine.text_rollout import TextRollout

    pipe = Pipeline.from_preset(replace(load_preset("self-forcing-tiny"), height=32, width=64), device="cpu")
    cond = pipe.condition(RunConditioning(2, prompts=["a red lighthouse", "a busy market street"]))

    def second_chunk(switch):
        writer = pipe.build_writer(memory_config("sink", preset=pipe.preset, budget=9, sink_frames=3,
                                                 positions="actual"))
        rollout = TextRollout(pipe.world.dit, writer, list(cond.contexts), 0, pipe.device, pipe.latent_hw,
                              trained_offset=11, switch=switch, recache_window=12, prompts=list(cond.prompts))
        rollout.step()
        out = rollout.step()
        return out.latents, [e for e in out.record["cache"]["events"] if e["type"].startswith("prompt")]

    kept, events = second_chunk("recache-keep-sink")
    plain, _ = second_chunk("plain")
    assert events[0]["recache"] is False and "kept sink" in events[0]["reason"]
    assert torch.equal(kept, plain)
