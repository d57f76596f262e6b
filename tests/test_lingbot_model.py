"""LingBot-World DiT: the full-size module tree equals the released state dict (spec §3, §4, §13), the
tiny fixture weights load strictly under their official names, and one bidirectional call on an empty
cache reproduces the official v1 expert (fixtures README, ``v1_expert_call``)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from worldtrace_cli.errors import CheckpointError
from worldtrace_cli.model.lingbot.checkpoint import load_lingbot_dit
from worldtrace_cli.model.lingbot.config import A14B, LingbotConfig
from worldtrace_cli.model.lingbot.dit import LayerPast, LingbotChunk, LingbotDiT, camera_tokens

DATA = Path(__file__).parent / "data" / "lingbot"
CONFIG, WEIGHTS = DATA / "tiny_config.json", DATA / "tiny_weights.safetensors"


@pytest.fixture(scope="module")
def tiny():
    return load_lingbot_dit(CONFIG, weights=WEIGHTS)


@pytest.fixture(scope="module")
def data():
    return load_file(str(DATA / "tiny_data.safetensors"))


def _tsv():
    rows = [line.rstrip("\n").split("\t") for line in (DATA / "lingbot_state_dict_a14b.tsv").read_text().splitlines()
            if not line.startswith("#")]
    return [(name, [int(s) for s in shape.strip("[]").split(", ")]) for name, shape, _ in rows]


def test_full_size_tree_on_meta_equals_released_state_dict():
    with torch.device("meta"):
        model = LingbotDiT(A14B)
    sd = model.state_dict()
    assert [(k, list(v.shape)) for k, v in sd.items()] == _tsv()  # names, shapes and order
    assert len(sd) == 1421
    assert sum(v.numel() for v in sd.values()) == 18_544_332_864
    camera = [k for k in sd if "cam" in k or "c2ws" in k]
    assert sum(v.numel() for k, v in sd.items() if k not in camera) == 14_288_901_184


def test_tiny_weights_load_strictly_with_official_names(tiny):
    ref = load_file(str(WEIGHTS))
    sd = tiny.state_dict()
    assert set(sd) == set(ref) and len(ref) == 91
    assert all(torch.equal(sd[k], ref[k].float()) for k in ref)  # exact bf16 -> float32 upcast
    assert tiny.cfg.num_layers == 2 and tiny.cfg.head_dim == 128


def test_missing_or_renamed_key_is_one_line_error_naming_it(tmp_path):
    ref = load_file(str(WEIGHTS))
    ref["blocks.1.cam_scale_layer.weightt"] = ref.pop("blocks.1.cam_scale_layer.weight")
    save_file(ref, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_lingbot_dit(CONFIG, weights=tmp_path / "w.safetensors")
    msg = str(err.value)
    assert "\n" not in msg
    assert "1 missing: blocks.1.cam_scale_layer.weight" in msg
    assert "1 unexpected: blocks.1.cam_scale_layer.weightt" in msg


def test_wrong_shape_names_key(tmp_path):
    ref = load_file(str(WEIGHTS))
    ref["head.head.bias"] = torch.zeros(65, dtype=torch.bfloat16)
    save_file(ref, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match=r"head\.head\.bias \[65\] != \[64\]"):
        load_lingbot_dit(CONFIG, weights=tmp_path / "w.safetensors")


def test_diffusers_folder_loads_and_bad_config_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(CONFIG.read_text())
    (tmp_path / "diffusion_pytorch_model.safetensors").write_bytes(WEIGHTS.read_bytes())
    assert load_lingbot_dit(tmp_path).cfg.dim == 256
    (tmp_path / "config.json").write_text(CONFIG.read_text().replace('"dim"', '"dimm"'))
    with pytest.raises(CheckpointError, match="unknown LingBot config keys: dimm"):
        load_lingbot_dit(tmp_path)
    with pytest.raises(CheckpointError, match="model_type must be 'i2v' .* or 't2v'"):
        LingbotConfig.from_dict({"model_type": "ti2v"})  # Wan2.2-TI2V-5B (LongLive 2.0): another network
    assert not LingbotConfig.from_dict({"model_type": "t2v"}).has_camera  # Self-Forcing / LongLive v1.0
    assert LingbotConfig.from_dict({"model_type": "i2v"}).has_camera


def test_camera_tokens_fold_2x2_cells_channel_major():
    cam = torch.arange(2 * 3 * 4 * 6, dtype=torch.float32).view(1, 2, 3, 4, 6)  # C=2, F=3, lh=4, lw=6
    tok = camera_tokens(cam)
    assert tok.shape == (1, 3 * 2 * 3, 8)
    f, i, j = 2, 1, 2
    row = tok[0, f * 6 + i * 3 + j]
    for c in range(2):
        for q in range(2):
            for r in range(2):
                assert row[c * 4 + 2 * q + r] == cam[0, c, f, 2 * i + q, 2 * j + r]


@pytest.mark.parametrize("t", [999, 500])
def test_empty_cache_call_equals_official_v1_expert(tiny, data, t, one_thread):
    """Eight frames in one call from frame 0 with no past: the official bidirectional expert."""
    y = torch.cat([torch.zeros(4, 8, 4, 8), data["vae_latent"][:, :8]])
    y[:4, 0] = 1
    empty = torch.zeros(1, 0, 2, 128)
    past = [LayerPast(empty, empty, torch.zeros(0, dtype=torch.float64)) for _ in range(2)]
    chunk = LingbotChunk(rollout=tiny.new_rollout_state(), past=past, text_context=data["text_context"],
                         camera=data["cam_emb_head"])
    with torch.no_grad():
        flow = tiny(data["v1_x"][None], torch.tensor(t), y[None], chunk)
    assert flow.shape == (1, 16, 8, 4, 8) and flow.dtype == torch.float32
    assert (flow[0] - data[f"v1_flow_t{t}"]).abs().max().item() <= 1e-5


def test_mismatched_camera_is_refused(tiny, data):
    past = [LayerPast(torch.zeros(1, 0, 2, 128), torch.zeros(1, 0, 2, 128), torch.zeros(0)) for _ in range(2)]
    chunk = LingbotChunk(rollout=tiny.new_rollout_state(), past=past, text_context=data["text_context"],
                         camera=data["cam_emb_head"][:, :, :4])
    with pytest.raises(ValueError, match="must match x"):
        tiny(data["v1_x"][None], 999, torch.zeros(1, 20, 8, 4, 8), chunk)
