"""--offload blocks (issue 45 part 3): the DiT's blocks in host memory through diffusers' group offloading.
On this CPU host and device are one, so the hooks run and nothing moves: what can be proven here is that
the frames do not change and that a block's weights are used only inside its own forward (what makes
the offloading correct on a GPU, where the other blocks are not there)."""

import json

import pytest
import torch

from worldtrace_cli.engine.base import RunConditioning

from conftest import invoke, one_line_error
from worldtrace_cli.config import load_preset


def shas(run) -> list[str]:
    return [json.loads(line)["frames_sha256"] for line in (run / "chunks.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("preset,trajectory,extra", [
    ("lingbot-tiny", "trajectories/aba.yaml", ["--image", "assets/images/mg2_universal_0000.png"]),
    ("tiny", "trajectories/aba.yaml", ["--image", "assets/images/mg2_universal_0000.png"]),
    ("longlive-tiny", "trajectories/prompts_aba.yaml", [])])
def test_block_offloading_keeps_every_frame(preset, trajectory, extra, tmp_path, one_thread):
    runs = {}
    for offload in ("text", "blocks"):
        out = tmp_path / offload
        result = invoke("generate", "--preset", preset, trajectory, "--chunks", "3", "--metrics", "none",
                        "--no-progress", "--offload", offload, "-o", out, *extra)
        assert result.exit_code == 0, result.output
        assert json.loads((out / "summary.json").read_text())["config"]["offload"] == offload
        runs[offload] = shas(out)
    assert runs["text"] == runs["blocks"]


class BlockWeights(torch.overrides.TorchFunctionMode):
    """Records every use of a block's parameter while a different block (or none) is running."""

    def __init__(self, model):
        super().__init__()
        self.owner = {id(p): i for i, block in enumerate(model.blocks) for p in block.parameters()}
        self.running, self.strays = None, []
        for i, block in enumerate(model.blocks):
            block.register_forward_pre_hook(lambda m, a, i=i: setattr(self, "running", i))
            block.register_forward_hook(lambda m, a, o: setattr(self, "running", None))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for a in [*args, *(kwargs or {}).values()]:
            if isinstance(a, torch.nn.Parameter) and self.owner.get(id(a), self.running) != self.running:
                self.strays.append((getattr(func, "__name__", str(func)), self.owner[id(a)], self.running))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["tiny", "lingbot-tiny"])
def test_a_blocks_weights_are_used_only_inside_its_forward(name, one_thread):
    """Before ContextKV the cross-attention K/V of every block were made at the top of the first call,
    outside the blocks: with the blocks offloaded they would have read weights not on the GPU."""
    from PIL import Image

    from worldtrace_cli.config import default_cache, memory_config
    from worldtrace_cli.engine.pipeline import Pipeline
    from worldtrace_cli.trajectory import MODES, frames_for_chunks

    preset = load_preset(name)
    pipe = Pipeline.from_preset(preset, None, True, 0, "cpu", "fp32")
    spec = MODES[preset.mode]
    rows = frames_for_chunks(2, preset.frames_per_chunk)
    rollout = pipe.rollout(pipe.build_writer(memory_config(preset=preset, **default_cache(preset))),
                           pipe.condition(RunConditioning(2, Image.new("RGB", (preset.width, preset.height)))),
                           torch.zeros(1, rows, spec.keyboard_dim), torch.zeros(1, rows, 2) if spec.mouse else None, 0)
    mode = BlockWeights(pipe.world.dit)
    with mode:
        rollout.step()
        rollout.step()
    assert mode.owner and mode.strays == []


def test_block_offloading_is_refused_with_compile(tmp_path):
    line = one_line_error(invoke("generate", "--preset", "tiny", "trajectories/aba.yaml", "--image",
                                 "assets/images/mg2_universal_0000.png", "--offload", "blocks", "--compile", "default",
                                 "-o", tmp_path / "run"))
    assert "--offload blocks" in line and "--compile" in line


def test_offload_auto_takes_blocks_when_only_blocks_fit(monkeypatch, tmp_path, one_thread):
    """The device query stands in for a card (this machine has none); the plans, the choice and the run
    with the hooks are real."""
    from worldtrace_cli.config import default_cache, memory_config
    from worldtrace_cli.engine.memory_plan import plan_memory
    from worldtrace_cli.jobs import bench_memory

    preset = load_preset("loopworld")  # 4 blocks: 2 of them leave the GPU (the tiny presets have 2)
    memory = memory_config(preset=preset, **default_cache(preset))
    need = {o: plan_memory(preset, memory, o, "auto", torch.float32, 2, False).peak / 1e9 * bench_memory.HEADROOM
            + bench_memory.RESERVE_GB for o in ("text", "blocks")}
    assert need["blocks"] < need["text"]
    card = (need["text"] + need["blocks"]) / 2
    monkeypatch.setattr(bench_memory, "device_memory_gb", lambda device: (card, "a test card"))
    result = invoke("generate", "--preset", "loopworld", "trajectories/aba.yaml", "--chunks", "2", "--metrics", "none",
                    "--no-progress", "-o", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["config"]["offload"] == "blocks"
