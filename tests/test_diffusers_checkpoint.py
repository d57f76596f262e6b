"""A diffusers-format DiT as ``--checkpoint`` (issue 65, point 4; docs/diffusers.md, "Diffusers-format
checkpoints"): the tiny Self-Forcing DiT saved by diffusers' own ``WanTransformer3DModel.save_pretrained``
(sharded, and as one file) runs ``generate`` to the same frames as the same weights in worldtrace's own
form, and every wrong folder is one line, exit 3, before anything loads (torch-free checks)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worldtrace_cli.config import load_preset
from worldtrace_cli.errors import CheckpointError

from conftest import invoke, one_line_error

ROOT = Path(__file__).resolve().parents[1]
PROMPT = ROOT / "trajectories" / "prompt.yaml"
TINY = {"dim": 256, "ffn_dim": 512, "num_heads": 2, "num_layers": 2, "in_dim": 16, "out_dim": 16}
SHARDS = 7  # the tiny DiT (13 MB in float32) saved with max_shard_size 2MB


def tiny_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """self-forcing-tiny's DiT weights in worldtrace's names: the preset's own random DiT at ``seed``
    (``generate``'s default weights seed is 0)."""
    from worldtrace_cli.model.lingbot.world import random_dit

    return random_dit(load_preset("self-forcing-tiny").dit, seed, torch.device("cpu"), torch.float32).state_dict()


def save_diffusers(sd: dict[str, torch.Tensor], folder: Path, max_shard_size: str = "2MB") -> Path:
    """``sd`` converted with the key map into diffusers' ``WanTransformer3DModel`` and written by its own
    ``save_pretrained`` (config.json, safetensors shards and their index)."""
    from worldtrace_cli.integrations.wan_keys import wan_transformer_from_original

    wan_transformer_from_original(sd, TINY).save_pretrained(folder, max_shard_size=max_shard_size)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A pipeline folder holding a sharded ``transformer/`` of seed 0, and a model folder (one file) of seed 5."""
    base = tmp_path_factory.mktemp("diffusers")
    save_diffusers(tiny_state_dict(0), base / "pipeline" / "transformer")
    save_diffusers(tiny_state_dict(5), base / "single", max_shard_size="1GB")
    return base / "pipeline", base / "single"


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def test_the_key_map_lives_in_model_and_its_shapes_are_the_dits():
    from worldtrace_cli.integrations import wan_keys as reexported
    from worldtrace_cli.model import wan_keys
    from worldtrace_cli.model.lingbot.dit import LingbotDiT

    assert reexported.wan_to_diffusers is wan_keys.wan_to_diffusers  # integrations imports it from model/
    for name in ("self-forcing-tiny", "self-forcing"):
        cfg = load_preset(name).dit
        with torch.device("meta"):
            dit = LingbotDiT(cfg)
        ours = {k: tuple(v.shape) for k, v in dit.state_dict().items()}
        assert wan_keys.wan_t2v_shapes(cfg.dim, cfg.ffn_dim, cfg.num_heads, cfg.num_layers, cfg.in_dim, cfg.out_dim,
                                       cfg.freq_dim) == ours
        assert all(wan_keys.diffusers_key_to_wan(wan_keys.wan_key_to_diffusers(k)) == k for k in ours)
    assert len(ours) == 825
    with pytest.raises(ValueError, match="add_k_proj"):
        wan_keys.diffusers_key_to_wan("blocks.0.attn2.add_k_proj.weight")


def test_the_folder_checks_load_no_torch(folders, tmp_path):
    """The checks run with the other input checks before torch loads: in a fresh process a good folder
    passes and a missing shard is refused, and torch is never imported."""
    pipeline, _ = folders
    broken = copy_of(pipeline, tmp_path)
    (broken / "transformer" / f"diffusion_pytorch_model-00002-of-0000{SHARDS}.safetensors").unlink()
    code = ("import sys\nfrom worldtrace_cli.config import load_preset\nfrom worldtrace_cli.errors import CheckpointError\n"
            "from worldtrace_cli.model.layout import check_weights_source\n"
            f"check_weights_source(load_preset('self-forcing-tiny'), {str(pipeline)!r}, False)\n"
            f"try:\n    check_weights_source(load_preset('self-forcing-tiny'), {str(broken)!r}, False)\n"
            "except CheckpointError as e:\n    print(e)\n"
            "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    said, torch_modules = out.stdout.strip().splitlines()
    assert f"shard diffusion_pytorch_model-00002-of-0000{SHARDS}.safetensors missing" in said and torch_modules == "[]"


def test_a_diffusers_folder_loads_the_same_dit_as_the_pt(folders, tmp_path):
    """The sharded folder and the official ``.pt`` layout (``generator_ema``, keys prefixed ``model.``)
    give the same tensors, bit for bit; the config and every shard are named in the check's result."""
    from worldtrace_cli.model.diffusers_folder import check_diffusers_dit
    from worldtrace_cli.model.selfforcing.world import load_selfforcing_dit

    cfg = load_preset("self-forcing-tiny").dit
    sd = tiny_state_dict(0)
    torch.save({"generator_ema": {f"model.{k}": v for k, v in sd.items()}}, tmp_path / "dmd.pt")
    checked = check_diffusers_dit(folders[0] / "transformer", cfg, "self-forcing-tiny")
    assert len(checked.files) == SHARDS and checked.config["_class_name"] == "WanTransformer3DModel"
    from_pt = load_selfforcing_dit(tmp_path / "dmd.pt", cfg, torch.float32, torch.device("cpu")).state_dict()
    from_folder = load_selfforcing_dit(checked, cfg, torch.float32, torch.device("cpu")).state_dict()
    assert list(from_folder) == list(from_pt) and all(torch.equal(from_folder[k], from_pt[k]) for k in from_pt)
    assert all(torch.equal(from_pt[k], sd[k]) for k in sd)


def _shas(run: Path) -> list[str]:
    return [json.loads(line)["frames_sha256"] for line in (run / "chunks.jsonl").read_text().splitlines()]


def test_generate_with_a_diffusers_folder_gives_the_frames_of_the_same_weights(folders, tmp_path):
    """self-forcing-tiny's own DiT (seed 0) saved by diffusers, sharded, as a pipeline folder's
    ``transformer/``: ``generate --checkpoint`` writes the frames of the preset's own run, chunk for chunk;
    another DiT (seed 5, one file, the model folder itself) writes other frames; the summary names the shards;
    the folder on ``--backend diffusers`` writes the same frames."""
    pipeline, single = folders
    args = ("generate", "--preset", "self-forcing-tiny", PROMPT, "--prompt", "a red lighthouse", "--chunks", "2",
            "--device", "cpu", "--dtype", "fp32")
    for out, extra in (("own", ()), ("folder", ("--checkpoint", pipeline)), ("other", ("--checkpoint", single)),
                       ("on-diffusers", ("--checkpoint", pipeline, "--backend", "diffusers"))):
        result = invoke(*args, *extra, "-o", tmp_path / out)
        assert result.exit_code == 0, result.output
    assert _shas(tmp_path / "folder") == _shas(tmp_path / "own") and len(_shas(tmp_path / "own")) == 2
    assert _shas(tmp_path / "on-diffusers") == _shas(tmp_path / "own")  # the folder on both backends
    assert _shas(tmp_path / "other")[0] != _shas(tmp_path / "own")[0]
    files = json.loads((tmp_path / "folder" / "summary.json").read_text())["checkpoint"]
    assert [f["role"] for f in files] == ["dit"] * SHARDS
    assert files[0]["file"] == f"diffusion_pytorch_model-00001-of-0000{SHARDS}.safetensors"


def _edit_config(folder: Path, **fields) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


def _rewrite_tensor(file: Path, name: str, value: torch.Tensor | None) -> None:
    """Replace (or, with None, drop) one tensor of a safetensors file."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(file))
    if value is None:
        del sd[name]
    else:
        sd[name] = value
    save_file(sd, str(file), metadata={"format": "pt"})


def _missing_shard(folder):
    (folder / "transformer" / f"diffusion_pytorch_model-00003-of-0000{SHARDS}.safetensors").unlink()


def _wrong_shape(folder):
    index = json.loads((folder / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    name = "blocks.1.ffn.net.0.proj.weight"
    _rewrite_tensor(folder / "transformer" / index["weight_map"][name], name, torch.zeros(384, 256))


def _truncated(folder):
    file = folder / "transformer" / f"diffusion_pytorch_model-00001-of-0000{SHARDS}.safetensors"
    file.write_bytes(file.read_bytes()[:-1000])


REFUSALS = {  # how the folder is broken -> what the one line says (besides the file it names)
    "missing shard": (_missing_shard, f"index.json: shard diffusion_pytorch_model-00003-of-0000{SHARDS}.safetensors missing"),
    "wrong shape": (_wrong_shape, "1 wrong shape: blocks.1.ffn.net.0.proj.weight [384, 256] != [512, 256]"),
    "i2v config": (lambda f: _edit_config(f / "transformer", image_dim=1280, added_kv_proj_dim=256),
                   "config.json: image_dim 1280: an image embedder (image-to-video); preset self-forcing-tiny is a "
                   "text-to-video model (image_dim null)"),
    "not wan": (lambda f: _edit_config(f / "transformer", _class_name="FluxTransformer2DModel"),
                "config.json: _class_name 'FluxTransformer2DModel' is not a Wan transformer (WanTransformer3DModel)"),
    "other sizes": (lambda f: _edit_config(f / "transformer", num_layers=30, ffn_dim=8960),
                    "config.json: does not describe preset self-forcing-tiny's DiT: ffn_dim 8960 (the preset's: 512), "
                    "num_layers 30 (the preset's: 2)"),
    "truncated": (_truncated, "00001-of-00007.safetensors: not a readable safetensors file"),
    "no weights": (lambda f: [p.unlink() for p in (f / "transformer").glob("diffusion_pytorch_model*")],
                   "transformer: no weights: expected diffusion_pytorch_model.safetensors or "
                   "diffusion_pytorch_model.safetensors.index.json beside config.json"),
    "not diffusers": (lambda f: shutil.rmtree(f / "transformer"),
                      "not a diffusers Wan DiT folder (transformer/config.json, or config.json beside "
                      "diffusion_pytorch_model*.safetensors); preset self-forcing-tiny has random weights"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_wrong_diffusers_folder_is_one_line_exit_3_before_anything_loads(folders, tmp_path, monkeypatch, case):
    from worldtrace_cli.model.lingbot import world

    loaded = []
    monkeypatch.setattr(world, "random_dit", lambda *a, **k: loaded.append(a) or pytest.fail("the model loaded"))
    folder = copy_of(folders[0], tmp_path)
    breaks, says = REFUSALS[case]
    breaks(folder)
    line = one_line_error(invoke("generate", "--preset", "self-forcing-tiny", PROMPT, "--prompt", "a red lighthouse",
                                 "--checkpoint", folder, "-o", tmp_path / "o"), 3)
    assert says in line, line
    assert not loaded and not (tmp_path / "o").exists()


def test_tensors_missing_or_extra_are_named_in_both_namings(folders, tmp_path):
    from worldtrace_cli.model.layout import check_weights_source

    folder = copy_of(folders[1], tmp_path)
    file = folder / "diffusion_pytorch_model.safetensors"
    _rewrite_tensor(file, "blocks.0.attn2.norm_k.weight", None)
    _rewrite_tensor(file, "blocks.0.attn2.add_k_proj.weight", torch.zeros(256, 256))
    with pytest.raises(CheckpointError) as err:
        check_weights_source(load_preset("self-forcing-tiny"), folder, False)
    assert str(err.value) == (f"{folder}: does not match preset self-forcing-tiny's DiT: 1 missing: "
                              f"blocks.0.attn2.norm_k.weight (ours: blocks.0.cross_attn.norm_k.weight); "
                              f"1 unexpected: blocks.0.attn2.add_k_proj.weight")
    (folder / "diffusion_pytorch_model.safetensors").rename(folder / "diffusion_pytorch_model-00001-of-00001.safetensors")
    with pytest.raises(CheckpointError, match="safetensors shards without their index"):
        check_weights_source(load_preset("self-forcing-tiny"), folder, False)


def test_the_full_presets_sizes_are_checked_against_the_config(tmp_path):
    """``self-forcing``'s 1.3B sizes against a folder's config.json: a tiny one is refused naming each size
    that differs; the 1.3B one of the converted Self-Forcing checkpoint passes."""
    from worldtrace_cli.model.diffusers_folder import check_diffusers_config
    from worldtrace_cli.model.wan_keys import wan_transformer_kwargs

    preset = load_preset("self-forcing")
    config = {"_class_name": "WanTransformer3DModel", "image_dim": None, "added_kv_proj_dim": None,
              "rope_max_seq_len": 1024, **wan_transformer_kwargs(**TINY)}
    config["patch_size"] = list(config["patch_size"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as err:
        check_diffusers_config(tmp_path / "config.json", preset.dit, preset.name)
    assert str(err.value) == (f"{tmp_path / 'config.json'}: does not describe preset self-forcing's DiT: "
                              f"num_attention_heads 2 (the preset's: 12), ffn_dim 512 (the preset's: 8960), "
                              f"num_layers 2 (the preset's: 30)")
    config.update(num_attention_heads=12, ffn_dim=8960, num_layers=30)
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert check_diffusers_config(tmp_path / "config.json", preset.dit, preset.name)["num_layers"] == 30
    del config["eps"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"DiT: eps missing \(the preset's: 1e-06\)$"):
        check_diffusers_config(tmp_path / "config.json", preset.dit, preset.name)


def test_a_checkpoint_preset_takes_a_pipeline_folder_and_names_what_it_lacks(tmp_path):
    """A checkpoint preset given a diffusers pipeline folder: the DiT from ``transformer/`` (the ``.pt`` is not
    needed), the VAE and umT5 at the preset's paths or the pipeline's ``vae/``, ``text_encoder/``,
    ``tokenizer/``; what is at neither is one line naming both."""
    from worldtrace_cli.model.layout import check_weights_source, diffusers_checkpoint_paths

    (tmp_path / "sf.yaml").write_text("extends: self-forcing-tiny\nweights: checkpoint\n"
                                      "files: {dit: dmd.pt, vae: vae.pth, text_encoder: t5.pth, tokenizer: tok}\n")
    preset = load_preset(str(tmp_path / "sf.yaml"))
    root = save_diffusers(tiny_state_dict(0), tmp_path / "root" / "transformer", max_shard_size="1GB").parent
    with pytest.raises(CheckpointError) as err:
        check_weights_source(preset, root, False)
    assert str(err.value).endswith("missing vae.pth (or vae/diffusion_pytorch_model.safetensors), t5.pth (or "
                                   "text_encoder), tok (or tokenizer) (preset sf reads them too)"), err.value
    (root / "vae").mkdir()
    (root / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    (root / "text_encoder").mkdir()
    (root / "tok").mkdir()  # the preset's own path first
    paths = diffusers_checkpoint_paths(preset, root)
    assert paths["dit"].folder == root / "transformer" and paths["vae"] == root / "vae" / "diffusion_pytorch_model.safetensors"
    assert (paths["text_encoder"], paths["tokenizer"]) == (root / "text_encoder", root / "tok")
    check_weights_source(preset, root, False)
