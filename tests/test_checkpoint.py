"""Official checkpoint layout: our module tree has exactly the official state-dict names/shapes,
and bad checkpoints give one-line CheckpointErrors."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from worldtrace_cli.config import load_preset
from worldtrace_cli.errors import CheckpointError, InputError
from worldtrace_cli.model.checkpoint import (load_dit_weights, read_state_dict, resolve_checkpoint_files,
                                             strip_prefix)
from worldtrace_cli.model.config import DiTConfig
from worldtrace_cli.model.dit import CausalWanDiT

DATA = Path(__file__).parent / "data"
FIXTURES = DATA / "fixtures"
LISTINGS = {"mg2-universal": "universal", "mg2-gta-drive": "gta_drive", "mg2-templerun": "templerun"}
PARAMS = {"mg2-universal": 1_619_242_304, "mg2-gta-drive": 1_619_238_464, "mg2-templerun": 1_508_715_584}


class _Evil:
    """An arbitrary object a malicious .pth could carry."""


def _listing(mode):
    rows = (DATA / f"mg2_state_dict_{mode}.tsv").read_text().splitlines()[1:]
    return {name: [int(x) for x in shape.strip("[]").split(",") if x.strip()]
            for name, shape, _ in (r.split("\t") for r in rows)}


@pytest.mark.parametrize("preset", sorted(LISTINGS))
def test_preset_module_tree_matches_official_state_dict(preset):
    cfg = load_preset(preset).dit
    with torch.device("meta"):
        model = CausalWanDiT(cfg)
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert ours == _listing(LISTINGS[preset])
    assert sum(v.numel() for v in model.state_dict().values()) == PARAMS[preset]


@pytest.fixture(scope="module")
def tiny_model():
    import json

    return CausalWanDiT(DiTConfig.from_dict(json.loads((FIXTURES / "tiny_config.json").read_text())))


def test_loads_with_and_without_model_prefix(tiny_model, tmp_path):
    sd = load_file(str(FIXTURES / "tiny_weights.safetensors"))
    prefixed = tmp_path / "prefixed.safetensors"
    save_file({f"model.{k}": v for k, v in sd.items()}, str(prefixed))
    load_dit_weights(tiny_model, prefixed)
    a = tiny_model.blocks[0].self_attn.q.weight.clone()
    load_dit_weights(tiny_model, FIXTURES / "tiny_weights.safetensors")
    assert torch.equal(a, tiny_model.blocks[0].self_attn.q.weight)
    assert torch.equal(a, sd["blocks.0.self_attn.q.weight"].float())


def test_mismatch_names_missing_unexpected_and_shapes(tiny_model, tmp_path):
    sd = load_file(str(FIXTURES / "tiny_weights.safetensors"))
    del sd["head.head.bias"]
    sd["blocks.0.extra.weight"] = torch.zeros(2)
    sd["blocks.1.ffn.0.weight"] = torch.zeros(3, 3)
    bad = tmp_path / "bad.safetensors"
    save_file(sd, str(bad))
    with pytest.raises(CheckpointError) as err:
        load_dit_weights(tiny_model, bad)
    msg = str(err.value)
    assert "\n" not in msg and str(bad) in msg
    assert "1 missing: head.head.bias" in msg
    assert "1 unexpected: blocks.0.extra.weight" in msg
    assert "blocks.1.ffn.0.weight [3, 3] != [512, 256]" in msg


def test_truncated_and_unsafe_files_are_refused(tmp_path):
    data = (FIXTURES / "tiny_weights.safetensors").read_bytes()
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cannot read weights"):
        read_state_dict(trunc)
    pickled = tmp_path / "evil.pth"
    torch.save({"w": _Evil()}, str(pickled))
    with pytest.raises(CheckpointError, match="cannot read weights") as err:
        read_state_dict(pickled)  # weights_only=True never unpickles arbitrary objects
    # issue 15: torch's advice to retry with weights_only=False was passed on for a malicious pickle
    assert "weights_only" not in str(err.value) and "could run code" in str(err.value)
    with pytest.raises(CheckpointError, match="file not found"):
        read_state_dict(tmp_path / "nope.safetensors")


def test_strip_prefix_only_when_every_key_has_it():
    assert strip_prefix({"model.a": 1, "model.b": 2}) == {"a": 1, "b": 2}
    assert strip_prefix({"model.a": 1, "b": 2}) == {"model.a": 1, "b": 2}


def test_missing_checkpoint_files_listed_in_one_line(tmp_path):
    preset = load_preset("mg2-universal")
    (tmp_path / "Wan2.1_VAE.pth").write_bytes(b"")
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint_files(preset.files, tmp_path, preset.name)
    msg = str(err.value)
    assert "base_distilled_model/base_distill.safetensors" in msg and "models_clip" in msg
    assert "missing Wan2.1_VAE.pth" not in msg and "\n" not in msg


@pytest.mark.parametrize("raw,field", [({"sink_size": 3}, "sink_size"),
                                       ({"action_config": {"rope_theta": 100}}, "action_config.rope_theta"),
                                       ({"action_config": {"mouse_qk_dim_list": [16, 24, 24]}},
                                        "action_config.mouse_qk_dim_list"),
                                       ({"action_config": {"enable_keyboard": False}}, "action_config.enable_keyboard")])
def test_config_values_the_model_does_not_implement_are_errors(raw, field):
    """A config that would silently run a different model is refused, naming the field."""
    with pytest.raises(CheckpointError, match=f"{field}.* is not supported"):
        DiTConfig.from_dict(raw, "config.json")


def test_unknown_config_keys_and_presets_are_errors(tmp_path):
    with pytest.raises(CheckpointError, match="unknown config keys: bogus"):
        DiTConfig.from_dict({"bogus": 1})
    with pytest.raises(InputError, match="unknown preset"):
        load_preset("no-such-preset")
    bad = tmp_path / "p.yaml"
    bad.write_text("mode: universal\nheight: 96\nwidth: 176\ndit: {}\ncolour: red\n")
    with pytest.raises(InputError, match="unknown keys: colour"):
        load_preset(str(bad))


def test_wrong_dtype_is_named(tiny_model, tmp_path):
    sd = load_file(str(FIXTURES / "tiny_weights.safetensors"))
    sd["head.head.weight"] = sd["head.head.weight"].to(torch.int8)
    bad = tmp_path / "int.safetensors"
    save_file(sd, str(bad))
    with pytest.raises(CheckpointError, match="non-float dtype: head.head.weight torch.int8"):
        load_dit_weights(tiny_model, bad)
