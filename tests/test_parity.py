"""Golden parity: our DiT + sliding writer replay the official MG2 rollouts (fixtures made by the
official code, see tests/data/fixtures/FIXTURES.md) within 1e-4 in float32, with RoPE computed in
float64 (MG2's own arithmetic) and in float32 (the default)."""

from pathlib import Path

import shutil

import pytest
import torch

from worldtrace_cli.jobs import parity
from worldtrace_cli.model.speed import configure_speed
from worldtrace_cli.model.rope import MainRope

FIXTURES = Path(__file__).parent / "data" / "fixtures"
FOLDERS = [FIXTURES, FIXTURES / "templerun", FIXTURES / "universal_la4"]


@pytest.fixture(scope="module", params=[(f, p) for f in FOLDERS for p in ("float64", "float32")],
                ids=lambda p: f"{p[0].name}-{p[1]}")
def replayed(request):
    """Replay each fixture once per RoPE precision: (model, inputs, outputs, x0 per call, final latents, writer)."""
    folder, precision = request.param
    model, inputs, outputs = parity.load_fixture(folder)
    configure_speed(model, precision)
    cfg = model.cfg
    writer = parity.build_writer(parity.MemoryConfig.of(cache="sliding"), cfg.local_attn_size - 3)
    x0s = {}
    latents = parity.replay(model, inputs, lambda name, x0: x0s.__setitem__(name, x0), writer)
    return model, inputs, outputs, x0s, latents, writer


def test_every_step_and_final_latents_match(replayed):
    model, inputs, outputs, x0s, latents, _ = replayed
    assert len(x0s) == 6 * len(inputs["denoising_timesteps"])
    for name, x0 in x0s.items():
        assert (x0 - outputs[f"{name}_x0"]).abs().max().item() <= 1e-4, name
    assert (latents - outputs["output_latents"]).abs().max().item() <= 1e-4


def test_canonical_cache_equals_official_rotated_cache(replayed):
    """The sliding writer stores canonical keys; rotated to absolute positions they equal the
    official cache buffers (which hold keys rotated at their absolute frame index, spec §6.1)."""
    model, _, outputs, _, _, writer = replayed
    rope = MainRope(model.cfg.head_dim)
    frames = torch.tensor([s.frames[0] for s in writer.slots()], dtype=torch.float64)
    assert frames.tolist() == list(range(18 - len(frames), 18))
    for layer in range(model.cfg.num_layers):
        k, v = writer._read_kv(layer)
        k_abs = rope.rotate_slots(k, frames)
        local_end = int(outputs[f"kv_after_c5_L{layer}_local_end"])
        # the official buffer holds the past window then the last chunk: compare the last chunk
        n = k.shape[1]
        ref_k = outputs[f"kv_after_c5_L{layer}_k"][:, local_end - n:local_end]
        ref_v = outputs[f"kv_after_c5_L{layer}_v"][:, local_end - n:local_end]
        assert torch.allclose(k_abs, ref_k, atol=1e-4)
        assert torch.allclose(v, ref_v, atol=1e-4)


def _parity(*args):
    """``worldtrace parity ARGS`` through click's runner: (exit code, stdout)."""
    from click.testing import CliRunner

    from worldtrace_cli.cli import main

    result = CliRunner().invoke(main, ["parity", *args])
    return result.exit_code, result.output


def test_parity_cli_passes_on_fixture():
    code, out = _parity(str(FIXTURES / "universal_la4"))
    assert code == 0
    last = out.strip().splitlines()[-1]
    assert last.startswith("max_abs_diff=") and float(last.split("=")[1]) <= 1e-4


def test_parity_cli_fails_when_model_is_wrong(tmp_path):
    """A one-row shift of the action rows (a classic off-by-one) must be caught."""
    from safetensors.torch import load_file, save_file
    import shutil

    for name in ("tiny_config.json", "tiny_weights.safetensors", "tiny_outputs.safetensors"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    inputs = load_file(str(FIXTURES / "tiny_inputs.safetensors"))
    inputs["keyboard_cond"] = torch.roll(inputs["keyboard_cond"], 1, dims=1)
    save_file(inputs, str(tmp_path / "tiny_inputs.safetensors"))
    code, out = _parity(str(tmp_path))
    assert code == 1
    worst = next(ln for ln in out.splitlines() if ln.startswith("max_abs_diff="))
    assert float(worst.split("=")[1]) > 1e-4
    # one line per entry over the bound, naming it, its deviation and the bound
    over = [ln for ln in out.splitlines() if "deviates by" in ln]
    assert over and all("over the bound 1e-04" in ln for ln in over) and any("output_latents" in ln for ln in over)


def test_parity_cli_reports_missing_folder(tmp_path):
    code, output = _parity(str(tmp_path / "nope"))
    assert code == 2 and "no such folder" in output
    code, output = _parity(str(tmp_path))
    assert code == 2 and "not a golden fixture folder" in output


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_blocks_with_float32_rope_replay_the_official_rollout():
    """The fastest settings `generate` offers still replay the official code (CPU; on a GPU run the
    same command with --device cuda)."""
    code, out = _parity(str(FIXTURES / "universal_la4"), "--rope-precision", "float32", "--compile", "default")
    last = out.strip().splitlines()[-1]
    assert code == 0 and float(last.split("=")[1]) <= 1e-4


def test_parity_cli_refuses_bad_arguments():
    assert _parity(str(FIXTURES), "--compile", "fastest")[0] == 2
    assert _parity()[0] == 2


def test_replay_turns_tf32_off_and_restores_the_callers_settings(monkeypatch):
    """compare() and compare_lingbot() replay in IEEE float32 (TF32 moved an H200's CUDA replay by 6.9e-4, off: 2.9e-6):
    inside the replay both TF32 switches are off; afterwards, also after an error, the caller's
    settings are back."""
    from worldtrace_cli.jobs import parity_lingbot
    from worldtrace_cli.model.lingbot import checkpoint

    seen = []

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        raise RuntimeError("stop after the check")

    # Not monkeypatch.setattr for the switches: cuBLASModule's allow_tf32 is computed (__getattr__),
    # so pytest >= 9.2 undoes such a patch with delattr, which torch refuses. Saved and restored here.
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        monkeypatch.setattr(parity, "load_fixture", spy)
        with pytest.raises(RuntimeError, match="stop after the check"):
            parity.compare(FIXTURES)
        assert seen == [(False, False)]
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        monkeypatch.setattr(checkpoint, "load_lingbot_dit", spy)  # LingBot-World's replay: the same
        with pytest.raises(RuntimeError, match="stop after the check"):
            parity_lingbot.compare_lingbot(Path(__file__).parent / "data" / "lingbot")
        assert seen == [(False, False), (False, False)]
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
