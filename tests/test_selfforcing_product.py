"""Self-Forcing / LongLive in the product (issue 46): the text-to-video presets and their family checks,
``generate`` on prompt segments end to end (CliRunner, CPU), a prompt switch (chunks before it equal a
one-prompt run's, chunks after it differ), one-line refusals of bad prompt files (exit 2) and of
checkpoints with missing or extra keys (exit 3), ``self_forcing_dmd.pt`` read with its EMA weights,
prompts past the encoder's 512 tokens, and the run of 1,100 latent frames past the 1024-row RoPE
table with sliding, field and landmark."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from worldtrace_cli.cli import main
from worldtrace_cli.config import default_cache, load_preset, memory_config
from worldtrace_cli.errors import CheckpointError, InputError
from worldtrace_cli.outputs import probe_video, read_jsonl

from conftest import skip_without_ffmpeg

ROOT = Path(__file__).parent.parent
ABA = ROOT / "trajectories" / "prompts_aba.yaml"


def invoke(*args):
    return CliRunner().invoke(main, [*map(str, args)])


def one_line_error(result, code=2):
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.startswith("worldtrace: error:")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture(scope="module")
def pipe():
    from worldtrace_cli.engine.pipeline import Pipeline

    return Pipeline.from_preset(replace(load_preset("self-forcing-tiny"), height=32, width=64), device="cpu")


def test_text_presets_carry_the_models_own_caches_and_windows():
    sf, ll, full = load_preset("self-forcing-tiny"), load_preset("longlive-tiny"), load_preset("self-forcing")
    assert all(p.is_text and p.mode == "text" and p.dit.model_type == "t2v" for p in (sf, ll, full))
    assert (sf.window, sf.default_budget, ll.window, ll.default_budget) == (21, 18, 12, 9)
    assert default_cache(sf) == {"cache": "full", "positions": "actual"}  # Self-Forcing's global cache
    assert default_cache(ll) == {"cache": "sink", "budget": 9, "sink_frames": 3, "positions": "actual"}
    assert (full.dit.dim, full.dit.num_layers, full.height, full.width) == (1536, 30, 480, 832)


@pytest.mark.parametrize("base, edit, field", [
    ("self-forcing-tiny", ("mode: text", "mode: universal"), "mode: a selfforcing preset runs prompt segments"),
    ("self-forcing-tiny", ("model_type: t2v", "model_type: i2v"), "model_type: a selfforcing preset is a t2v"),
    ("self-forcing-tiny", ("architecture: selfforcing", "architecture: lingbot"), "needs architecture: selfforcing"),
    ("tiny", ("mode: universal", "mode: text"), "needs architecture: selfforcing, got mg2"),
    ("lingbot-tiny", ("model_type: i2v", "model_type: t2v"), "LingBot-World is i2v"),
])
def test_a_preset_mixing_families_is_one_line(tmp_path, base, edit, field):
    text = (ROOT / "worldtrace_cli" / "presets" / f"{base}.yaml").read_text()
    assert edit[0] in text
    (tmp_path / "p.yaml").write_text(text.replace(*edit))
    with pytest.raises(InputError, match=field):
        load_preset(str(tmp_path / "p.yaml"))


def test_generate_prompt_segments_end_to_end_and_a_switch_changes_only_later_chunks(tmp_path):
    skip_without_ffmpeg()
    res = invoke("generate", "--preset", "self-forcing-tiny", ABA, "--chunks", 6, "-o", tmp_path / "aba",
                 "--cache", "landmark", "--no-progress")
    assert res.exit_code == 0, res.output
    records = read_jsonl(tmp_path / "aba" / "chunks.jsonl")
    a, b = (s["prompt"] for s in yaml.safe_load(ABA.read_text())["segments"][:2])
    assert [r["prompt"] for r in records] == [a] * 4 + [b] * 2
    assert [r["waypoints"] for r in records][:5] == [["A"], [], [], [], ["B"]]
    summary = json.loads((tmp_path / "aba" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["totals"]["pixel_frames"] == 12 * 6 - 3
    assert probe_video(tmp_path / "aba" / "video.mp4")["frames"] == 69
    assert all(r["cache"]["positions"] == "slot_rank" for r in records)

    one = invoke("generate", "--preset", "self-forcing-tiny", ROOT / "trajectories" / "prompt.yaml", "--prompt", a,
                 "--seed", 0, "--chunks", 6, "-o", tmp_path / "one", "--cache", "landmark", "--no-progress")
    assert one.exit_code == 0, one.output
    single = read_jsonl(tmp_path / "one" / "chunks.jsonl")
    assert [r["prompt"] for r in single] == [a] * 6
    same = [r["frames_sha256"] == s["frames_sha256"] for r, s in zip(records, single)]
    assert same == [True] * 4 + [False] * 2  # the switch at chunk 4 changes chunk 4 on, nothing before


@pytest.mark.parametrize("body, where", [
    ("segments:\n  - {prompt: '', chunks: 2}\n", "segments[0].prompt: empty prompt"),
    ("segments:\n  - {prompt: a lighthouse, chunks: 0}\n", "segments[0].chunks: must be in [1, 100000]"),
    ("segments:\n  - {chunks: 2}\n", ":3: prompt: this segment has none"),
    ("segments:\n  - {prompt: a lighthouse, action: forward, chunks: 1}\n", "not a prompt-segment key"),
    ("prompt: '   '\nsegments:\n  - {chunks: 1}\n", ":2: prompt: empty prompt"),
])
def test_bad_prompt_files_end_in_one_line_with_exit_2(tmp_path, body, where):
    path = tmp_path / "p.yaml"
    path.write_text("mode: text\n" + body)
    line = one_line_error(invoke("generate", "--preset", "self-forcing-tiny", path, "-o", tmp_path / "o"))
    assert where in line and str(path) in line


def test_images_poses_pose_retrieval_and_action_files_are_refused_before_loading(tmp_path):
    image = ROOT / "assets" / "images" / "mg2_universal_0000.png"
    assert "takes prompts, not an image" in one_line_error(invoke(
        "generate", "--preset", "self-forcing-tiny", ABA, "--image", image, "-o", tmp_path / "o"))
    assert "no camera" in one_line_error(invoke(
        "generate", "--preset", "self-forcing-tiny", ABA, "--cache", "retrieval", "-o", tmp_path / "o"))
    line = one_line_error(invoke("generate", "--preset", "self-forcing-tiny", ROOT / "trajectories" / "aba.yaml",
                                 "-o", tmp_path / "o"))
    assert "mode 'universal'" in line and "prompt segments (mode: text)" in line
    assert not (tmp_path / "o").exists()


def test_a_prompt_past_512_tokens_is_truncated_with_a_warning(pipe, capsys):
    long = "a lighthouse " * 60  # 779 bytes once cleaned: 780 tokens of the byte tokenizer with EOS
    cond = pipe.condition(None, 2, [long, "a market"])
    assert cond.truncated == [long]
    assert "780 tokens, truncated to the encoder's 512" in capsys.readouterr().err
    assert cond.contexts[0].shape == (512, 4096) and cond.contexts[1].shape[0] == len("a market") + 1


def _checkpoint_root(tmp_path, sd):
    """A Self-Forcing repository root for a tiny preset (the VAE and umT5 files only need to exist:
    the DiT loads first) and the preset YAML reading it."""
    torch.save({"generator": {k: torch.zeros_like(v) for k, v in sd.items()}, "generator_ema": sd},
               tmp_path / "dmd.pt")
    for name in ("vae.pth", "t5.pth"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "tok").mkdir(exist_ok=True)
    preset = tmp_path / "sf.yaml"
    preset.write_text("extends: self-forcing-tiny\nweights: checkpoint\n"
                      "files: {dit: dmd.pt, vae: vae.pth, text_encoder: t5.pth, tokenizer: tok}\n")
    return preset


def test_checkpoint_keys_missing_or_extra_exit_3_naming_them(tmp_path):
    from worldtrace_cli.model.lingbot.world import random_dit

    cfg = load_preset("self-forcing-tiny").dit
    sd = {f"model.{k}": v for k, v in random_dit(cfg, 0, torch.device("cpu"), torch.float32).state_dict().items()}
    missing = dict(sd)
    del missing["model.blocks.1.ffn.2.bias"]
    preset = _checkpoint_root(tmp_path, missing)
    line = one_line_error(invoke("generate", "--preset", preset, ABA, "--checkpoint", tmp_path, "-o", tmp_path / "o"), 3)
    assert "1 missing: blocks.1.ffn.2.bias" in line and "dmd.pt" in line
    _checkpoint_root(tmp_path, {**sd, "model.blocks.0.extra.weight": torch.zeros(2)})
    line = one_line_error(invoke("generate", "--preset", preset, ABA, "--checkpoint", tmp_path, "-o", tmp_path / "o"), 3)
    assert "1 unexpected: blocks.0.extra.weight" in line
    line = one_line_error(invoke("generate", "--preset", preset, ABA, "-o", tmp_path / "o"))
    assert "needs --checkpoint DIR (the Self-Forcing repository root" in line


def test_self_forcing_dmd_pt_loads_its_ema_generator(tmp_path):
    from worldtrace_cli.model.lingbot.world import random_dit
    from worldtrace_cli.model.selfforcing.world import load_selfforcing_dit, read_generator

    cfg = load_preset("self-forcing-tiny").dit
    ref = random_dit(cfg, 5, torch.device("cpu"), torch.float32)
    _checkpoint_root(tmp_path, {f"model.{k}": v for k, v in ref.state_dict().items()})
    assert read_generator(tmp_path / "dmd.pt")[1] == "generator_ema"  # not the zeroed generator
    dit = load_selfforcing_dit(tmp_path / "dmd.pt", cfg, torch.float32, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(dit.state_dict().values(), ref.state_dict().values()))
    torch.save({"optimizer": {"step": torch.zeros(1)}}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="no DiT state dict"):
        read_generator(tmp_path / "bad.pt")


@pytest.mark.parametrize("cache", ["sliding", "field", "landmark"])
def test_1100_latent_frames_run_past_the_rope_table(pipe, cache):
    """Self-Forcing's RoPE table has 1024 rows (selfforcing-architecture.md §4): the official model
    stops at latent frame 1024. Through the cache contract the run goes on, reading its memory at
    offsets within the trained window (slot-rank positions for the memory writers)."""
    cond = pipe.condition(None, 1, ["a red lighthouse"])
    rollout = pipe.rollout(pipe.build_writer(memory_config(cache, preset=pipe.preset)), cond, seed=0)
    offsets = []
    while rollout.chunk * 3 < 1100:
        out = rollout.step()
        offsets.append(out.record["cache"]["max_offset"] or 0)
    assert rollout.chunk * 3 >= 1100 and out.record["latent_frames"][1] > 1024
    assert torch.isfinite(out.latents).all() and 0.5 < float(out.latents.std()) < 2.0
    assert max(offsets) <= pipe.window + 2 < 1024  # 20 for sliding; 23 for the writers' 6 + 12 + chunk
    assert out.record["cache"]["positions"] == ("actual" if cache == "sliding" else "slot_rank")
