"""CLIP image tower: shipped configs, MG2 weight conversion, preprocessing and outputs (spec §12.4)."""

import pytest
from conftest import check_seeded_random_init
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import CLIPVisionModelWithProjection

from worldtrace_cli.errors import CheckpointError
from worldtrace_cli.model.image_encoder import build_clip_tower, clip_config, convert_mg2_clip_state_dict


pytestmark = pytest.mark.usefixtures("one_thread")


_LAYER = {"norm1": "layer_norm1", "attn.proj": "self_attn.out_proj", "norm2": "layer_norm2",
          "mlp.0": "mlp.fc1", "mlp.2": "mlp.fc2"}


def to_mg2_state_dict(model: CLIPVisionModelWithProjection) -> dict:
    """Inverse of the conversion: transformers names -> the Wan names of MG2's CLIP file, plus the
    text tower and logit scale the file also holds."""
    sd = model.state_dict()
    v = "vision_model."
    d = model.config.hidden_size
    out = {
        "visual.patch_embedding.weight": sd[v + "embeddings.patch_embedding.weight"],
        "visual.cls_embedding": sd[v + "embeddings.class_embedding"].reshape(1, 1, d),
        "visual.pos_embedding": sd[v + "embeddings.position_embedding.weight"].unsqueeze(0),
        "visual.pre_norm.weight": sd[v + "pre_layrnorm.weight"], "visual.pre_norm.bias": sd[v + "pre_layrnorm.bias"],
        "visual.post_norm.weight": sd[v + "post_layernorm.weight"],
        "visual.post_norm.bias": sd[v + "post_layernorm.bias"],
        "visual.head": sd["visual_projection.weight"].t(),
        "log_scale": torch.tensor(4.6),
        "textual.token_embedding.weight": torch.randn(10, 8),
    }
    for i in range(model.config.num_hidden_layers):
        src, dst = f"{v}encoder.layers.{i}.", f"visual.transformer.{i}."
        for kind in ("weight", "bias"):
            out[f"{dst}attn.to_qkv.{kind}"] = torch.cat(
                [sd[f"{src}self_attn.{p}_proj.{kind}"] for p in ("q", "k", "v")], dim=0)
            for wan, hf in _LAYER.items():
                out[f"{dst}{wan}.{kind}"] = sd[f"{src}{hf}.{kind}"]
    return {k: t.clone().contiguous() for k, t in out.items()}


@pytest.fixture(scope="module")
def tiny_tower():
    return build_clip_tower("tiny", seed=0)


def test_shipped_configs():
    real, tiny = clip_config("vit-h-14"), clip_config("tiny")
    assert (real.hidden_size, real.intermediate_size, real.num_hidden_layers, real.num_attention_heads,
            real.image_size, real.patch_size, real.hidden_act, real.layer_norm_eps, real.projection_dim) == \
        (1280, 5120, 32, 16, 224, 14, "gelu", 1e-5, 1024)
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.image_size, tiny.patch_size, tiny.projection_dim) == \
        (64, 2, 224, 14, 32)
    with torch.device("meta"):
        model = CLIPVisionModelWithProjection(real)
    assert sum(p.numel() for p in model.parameters()) == 632_076_800
    with pytest.raises(ValueError, match="unknown CLIP variant"):
        clip_config("vit-l-14")


def test_random_init_is_seeded_and_leaves_global_rng_alone():
    check_seeded_random_init(lambda seed: build_clip_tower("tiny", seed=seed))


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_mg2_weights_round_trip(tmp_path, suffix):
    src = build_clip_tower("tiny", seed=3)
    mg2 = to_mg2_state_dict(src.model)
    path = tmp_path / f"models_clip{suffix}"
    torch.save(mg2, path) if suffix == ".pth" else save_file(mg2, str(path))
    tower = build_clip_tower("tiny", path)
    ref, got = src.model.state_dict(), tower.model.state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    # meta-device trap: the non-persistent position_ids buffer must be real
    ids = tower.model.vision_model.embeddings.position_ids
    assert ids.device.type == "cpu" and torch.equal(ids, torch.arange(257).expand(1, -1))
    assert not any(t.is_meta for t in (*tower.parameters(), *tower.buffers()))
    torch.manual_seed(0)
    images = torch.rand(2, 3, 48, 80) * 2 - 1
    assert torch.equal(tower.conditioning_tokens(images), src.conditioning_tokens(images))
    assert torch.equal(tower.image_embeds(images), src.image_embeds(images))


def test_conversion_maps_every_tensor(tiny_tower):
    mg2 = to_mg2_state_dict(tiny_tower.model)
    converted = convert_mg2_clip_state_dict(mg2)  # layer count inferred from the keys
    assert converted.keys() == tiny_tower.model.state_dict().keys()
    assert convert_mg2_clip_state_dict(mg2, 2).keys() == converted.keys()


def test_missing_and_unexpected_keys_raise_one_line_errors(tmp_path, tiny_tower):
    mg2 = to_mg2_state_dict(tiny_tower.model)
    lacking = {k: v for k, v in mg2.items() if k != "visual.transformer.1.mlp.2.bias"}
    with pytest.raises(CheckpointError, match=r"1 missing: visual\.transformer\.1\.mlp\.2\.bias"):
        convert_mg2_clip_state_dict(lacking, 2)
    path = tmp_path / "clip.pth"
    torch.save(lacking, path)
    with pytest.raises(CheckpointError) as err:
        build_clip_tower("tiny", path)
    assert str(path) in str(err.value) and "visual.transformer.1.mlp.2.bias" in str(err.value)
    assert "\n" not in str(err.value)
    # a 2-layer file for a 3-layer expectation, and a stray visual key
    with pytest.raises(CheckpointError, match="12 missing: visual.transformer.2"):
        convert_mg2_clip_state_dict(mg2, 3)
    with pytest.raises(CheckpointError, match="1 unexpected: visual.extra"):
        convert_mg2_clip_state_dict({**mg2, "visual.extra": torch.zeros(1)}, 2)
    # the complete tiny file into the 32-layer ViT-H config
    save_file(mg2, str(tmp_path / "tiny.safetensors"))
    with pytest.raises(CheckpointError, match="with 32 layers: 360 missing: visual.transformer.2"):
        build_clip_tower("vit-h-14", tmp_path / "tiny.safetensors")
    wide = {k: (v if k != "visual.head" else torch.zeros(64, 16)) for k, v in mg2.items()}
    save_file(wide, str(tmp_path / "wide.safetensors"))
    with pytest.raises(CheckpointError, match=r"wrong shape: visual_projection.weight \[16, 64\] != \[32, 64\]"):
        build_clip_tower("tiny", tmp_path / "wide.safetensors")
    with pytest.raises(CheckpointError, match="not found"):
        build_clip_tower("tiny", tmp_path / "absent.pth")


def test_preprocess_matches_independent_computation(tiny_tower):
    torch.manual_seed(1)
    images = torch.rand(2, 3, 96, 176) * 2 - 1
    x = F.interpolate(images, size=(224, 224), mode="bicubic", align_corners=False, antialias=False)
    x = x * 0.5 + 0.5
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
    expected = (x - mean) / std
    got = tiny_tower.preprocess(images)
    assert got.shape == (2, 3, 224, 224) and got.dtype == torch.float32
    assert (got - expected).abs().max() <= 1e-6


def test_conditioning_tokens_are_the_penultimate_hidden_states(tiny_tower):
    torch.manual_seed(2)
    images = torch.rand(3, 3, 96, 176) * 2 - 1
    tokens = tiny_tower.conditioning_tokens(images)
    assert tokens.shape == (3, 257, 64) and tokens.dtype == torch.float32
    assert tiny_tower.hidden_size == 64
    with torch.no_grad():
        out = tiny_tower.model(pixel_values=tiny_tower.preprocess(images), output_hidden_states=True)
    assert len(out.hidden_states) == 3  # embeddings + 2 layers
    assert torch.equal(tokens, out.hidden_states[-2])
    assert not torch.allclose(tokens, out.hidden_states[-1])
    # batch elements are independent
    assert torch.allclose(tiny_tower.conditioning_tokens(images[1:2]), tokens[1:2], atol=1e-5)
    embeds = tiny_tower.image_embeds(images)
    assert embeds.shape == (3, 32) and torch.equal(embeds, out.image_embeds)
