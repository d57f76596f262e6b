"""`worldtrace parity` on hostile folders: one line naming the file and field, exit 2, before any large
allocation; a file given as the folder, a folder holding two formats, stored outputs the replay does not
compare: each said, never a traceback or a silent pass. On copies of the MG2 golden fixture folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "data" / "fixtures"


def _copy(tmp_path) -> Path:
    folder = tmp_path / "fx"
    folder.mkdir()
    for name in ("tiny_config.json", "tiny_inputs.safetensors", "tiny_outputs.safetensors", "tiny_weights.safetensors"):
        shutil.copy(FIXTURES / name, folder / name)
    return folder


def _parity(folder) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worldtrace_cli", "parity", str(folder)], capture_output=True,
                          text=True, timeout=600)


def _config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "tiny_config.json").read_text())
    if changes.pop("action_config", None):  # the action module's width follows dim
        cfg["action_config"]["img_hidden_size"] = changes["dim"]
    cfg.update(changes)
    (folder / "tiny_config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, message", [
    ({"num_heads": 0}, r"tiny_config.json: num_heads: must be an integer >= 1, got 0"),
    ({"dim": 1_000_000, "ffn_dim": 1_000_000, "num_heads": 1000, "action_config": "img_hidden_size"},
     r"tiny_config.json: dim 1000000, .*GB of float32 weights, more than this machine's"),
])
def test_a_config_that_cannot_be_built_is_one_line(tmp_path, changes, message):
    import re

    folder = _copy(tmp_path)
    _config(folder, **changes)
    res = _parity(folder)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and re.search(message, lines[0]), res.stderr[-2000:]


def test_an_input_tensor_of_the_wrong_shape_names_it(tmp_path):
    folder = _copy(tmp_path)
    inputs = load_file(folder / "tiny_inputs.safetensors")
    inputs["noise"] = inputs["noise"][:, :, :4].contiguous()  # not whole chunks
    save_file(inputs, str(folder / "tiny_inputs.safetensors"))
    res = _parity(folder)
    assert res.returncode == 2 and "tiny_inputs.safetensors: noise: shape [1, 16, 4," in res.stderr, res.stderr[-2000:]
    assert "Traceback" not in res.stderr


def test_outputs_the_replay_does_not_compare_are_named_and_a_file_is_not_a_folder(tmp_path):
    folder = _copy(tmp_path)
    outputs = load_file(folder / "tiny_outputs.safetensors")
    outputs["extra_probe"] = torch.zeros(3)
    save_file(outputs, str(folder / "tiny_outputs.safetensors"))
    res = _parity(folder)
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("worldtrace: not checked:"))
    assert res.returncode == 0 and "extra_probe" in line and "call_c*_s*_flow_pred (" in line, res.stderr[-2000:]
    res = _parity(folder / "tiny_config.json")
    assert res.returncode == 2 and "is a file, not a folder" in res.stderr


def test_a_folder_holding_two_formats_says_which_it_replays(tmp_path):
    folder = _copy(tmp_path)
    save_file({"x": torch.zeros(1)}, str(folder / "tiny_data.safetensors"))  # LingBot-World's test-data file
    res = _parity(folder)
    first = res.stderr.strip().splitlines()[0]
    assert "holds LingBot-World and MG2 fixture files; replaying LingBot-World's" in first, res.stderr[-2000:]
    assert res.returncode == 2 and "Traceback" not in res.stderr  # the LingBot replay finds no fixture of its own


SELFFORCING = ROOT.parent / "shared" / "reference" / "selfforcing" / "fixtures"


@pytest.mark.skipif(not SELFFORCING.is_dir(), reason="../shared/reference/selfforcing/fixtures not present")
def test_selfforcing_outputs_the_replay_does_not_compare_are_named(tmp_path):
    folder = tmp_path / "sf"
    folder.mkdir()
    for name in ("tiny_config.json", "tiny_inputs.safetensors", "tiny_weights.safetensors"):
        shutil.copy(SELFFORCING / name, folder / name)
    shutil.copytree(SELFFORCING / "sf_global", folder / "sf_global")
    outputs = load_file(folder / "sf_global" / "tiny_outputs.safetensors")
    outputs["extra_probe"] = torch.zeros(3)
    save_file(outputs, str(folder / "sf_global" / "tiny_outputs.safetensors"))
    res = _parity(folder)
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("worldtrace: not checked:"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "extra_probe" in line and "call_c*_s*_flow_pred (" in line and "the last chunk's KV cache" in line
    assert "call_c*_s*_x0" not in line and "add_noise_draws" not in line  # compared ones are not named
    assert "kv_after_c*_L*_k" not in line and "kv_after_c*_L*_v" not in line  # its one cache snapshot is compared


def test_lingbot_outputs_the_replay_does_not_compare_are_named(tmp_path):
    """The fixture's reader names what the replay will not compare (the CLI prints it as the test above shows)."""
    from worldtrace_cli.jobs.parity import NOT_CHECKED
    from worldtrace_cli.jobs.parity_lingbot import load_lingbot_fixture

    folder = tmp_path / "lb"
    shutil.copytree(ROOT / "tests" / "data" / "lingbot", folder)
    data = load_file(folder / "tiny_data.safetensors")
    data["main/extra_probe"] = torch.zeros(3)
    save_file(data, str(folder / "tiny_data.safetensors"))
    _, variants = load_lingbot_fixture(folder)
    named = NOT_CHECKED[str(folder)]
    assert "main/extra_probe" in named
    compared = {f"{v}/{k}" for v, (_, _, want) in variants.items() for k in want}
    assert compared and not compared & set(named)  # x0 per call and output latents are compared, not named
