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

from worldtrace_cli.engine.base import RunConditioning
import yaml

from worldtrace_cli.config import default_cache, load_preset, memory_config
from worldtrace_cli.errors import CheckpointError, InputError
from worldtrace_cli.outputs import probe_video, read_jsonl

from conftest import invoke, one_line_error, skip_without_ffmpeg

ROOT = Path(__file__).parent.parent
ABA = ROOT / "trajectories" / "prompts_aba.yaml"


@pytest.fixture(scope="module")
def pipe():
    from worldtrace_cli.engine.pipeline import Pipeline

    return Pipeline.from_preset(replace(load_preset("self-forcing-tiny"), height=32, width=64), device="cpu")


def test_text_presets_carry_the_models_own_caches_and_windows():
    sf, ll, full = load_preset("self-forcing-tiny"), load_preset("longlive-tiny"), load_preset("self-forcing")
    assert all(p.backbone.takes_prompts and p.mode == "text" and p.dit.model_type == "t2v" for p in (sf, ll, full))
    assert (sf.window, sf.default_budget, ll.window, ll.default_budget) == (21, 18, 12, 9)
    assert default_cache(sf) == {"cache": "full", "positions": "actual"}  # Self-Forcing's global cache
    assert default_cache(ll) == {"cache": "sink", "budget": 9, "sink_frames": 3, "positions": "actual"}
    assert (full.dit.dim, full.dit.num_layers, full.height, full.width) == (1536, 30, 480, 832)


@pytest.mark.parametrize("base, edit, field", [
    ("self-forcing-tiny", ("mode: text", "mode: universal"),
     r"mode: Self-Forcing / LongLive presets run mode text, got 'universal' \(mode universal needs architecture: mg2 or"),
    ("self-forcing-tiny", ("model_type: t2v", "model_type: i2v"),
     "model_type: Self-Forcing / LongLive's DiT is t2v, got 'i2v'; model_type i2v is architecture: lingbot"),
    ("self-forcing-tiny", ("architecture: selfforcing", "architecture: lingbot"), "needs architecture: selfforcing"),
    ("tiny", ("mode: universal", "mode: text"), r"Matrix-Game-2.0 presets run mode .*got 'text' \(mode text needs architecture: selfforcing\)"),
    ("lingbot-tiny", ("model_type: i2v", "model_type: t2v"),
     "model_type: LingBot-World's DiT is i2v, got 't2v'; model_type t2v is architecture: selfforcing"),
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
    assert "takes no start image; only Matrix-Game-2.0 and LingBot-World presets do" in one_line_error(invoke(
        "generate", "--preset", "self-forcing-tiny", ABA, "--image", image, "-o", tmp_path / "o"))
    assert "no camera" in one_line_error(invoke(
        "generate", "--preset", "self-forcing-tiny", ABA, "--cache", "retrieval", "-o", tmp_path / "o"))
    line = one_line_error(invoke("generate", "--preset", "self-forcing-tiny", ROOT / "trajectories" / "aba.yaml",
                                 "-o", tmp_path / "o"))
    assert "mode 'universal' does not match preset self-forcing-tiny (mode 'text')" in line
    assert line.endswith("mode universal runs on preset lingbot-fast, lingbot-tiny, lingbot-v2-1.3b, "
                         "lingbot-v2-1.3b-tiny, loopworld, loopworld-euler, mg2-universal, tiny")
    assert not (tmp_path / "o").exists()


def test_a_prompt_past_512_tokens_is_truncated_with_a_warning(pipe):
    import logging

    long = "a lighthouse " * 60  # 779 bytes once cleaned: 780 tokens of the byte tokenizer with EOS
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("worldtrace").addHandler(handler)  # whether or not a CLI call set up stderr before
    try:
        cond = pipe.condition(RunConditioning(2, prompts=[long, "a market"]))
    finally:
        logging.getLogger("worldtrace").removeHandler(handler)
    assert cond.truncated == [long]
    assert any("780 tokens, truncated to the encoder's 512" in m for m in said), said
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
    assert "needs --checkpoint DIR (the Self-Forcing or LongLive repository root" in line


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


@pytest.mark.parametrize("cache", ["sliding", "field"])  # landmark reads slot-rank positions as field does
def test_1100_latent_frames_run_past_the_rope_table(pipe, cache):
    """Self-Forcing's RoPE table has 1024 rows (selfforcing-architecture.md §4): the official model
    stops at latent frame 1024. Through the cache contract the run goes on, reading its memory at
    offsets within the trained window (slot-rank positions for the memory writers)."""
    cond = pipe.condition(RunConditioning(1, prompts=["a red lighthouse"]))
    rollout = pipe.rollout(pipe.build_writer(memory_config(cache, preset=pipe.preset)), cond, seed=0)
    offsets = []
    while rollout.chunk * 3 < 1100:
        out = rollout.step()
        offsets.append(out.record["cache"]["max_offset"] or 0)
    assert rollout.chunk * 3 >= 1100 and out.record["latent_frames"][1] > 1024
    assert torch.isfinite(out.latents).all() and 0.5 < float(out.latents.std()) < 2.0
    assert max(offsets) <= pipe.window + 2 < 1024  # 20 for sliding; 23 for the writers' 6 + 12 + chunk
    assert out.record["cache"]["positions"] == ("actual" if cache == "sliding" else "slot_rank")


def _switch_run(pipe, switch, chunks=5, switch_at=4):
    """A LongLive-cache rollout (sink 3 + 6 recent, window 12, actual positions) switching prompt at
    ``switch_at``; returns (the sink's K/V per layer before the switch, after it, the switch event)."""
    from worldtrace_cli.engine.text_rollout import TextRollout

    cond = pipe.condition(RunConditioning(2, prompts=["a red lighthouse", "a busy market street"]))
    contexts = [cond.contexts[0]] * switch_at + [cond.contexts[1]] * (chunks - switch_at)
    prompts = [cond.prompts[0]] * switch_at + [cond.prompts[1]] * (chunks - switch_at)
    writer = pipe.build_writer(memory_config("sink", preset=pipe.preset, budget=9, sink_frames=3, positions="actual"))
    rollout = TextRollout(pipe.world.dit, writer, contexts, 0, pipe.device, pipe.latent_hw, trained_offset=11,
                          switch=switch, recache_window=12, prompts=prompts)
    for _ in range(switch_at):
        rollout.step()
    sink = lambda: [tuple(t.clone() for t in frame[layer]) for frame in writer._components[0]._kv  # noqa: E731
                    for layer in range(2)]
    before = sink()
    out = rollout.step()
    events = [e for e in out.record["cache"]["events"] if e["type"].startswith("prompt")]
    return before, sink(), events


def test_an_early_switch_rewrites_the_sink_as_longlive_does_unless_kept(pipe):
    """LongLive's early-switch surprise (selfforcing-architecture.md §11.5): a switch within the first
    window (here at frame 12 of a 12-frame window) re-caches from frame 0 and rewrites the sink with
    the new prompt's K/V: layer 1's sink changes, layer 0's cannot (no text reaches it yet).
    ``recache-keep-sink`` keeps the sink; ``plain`` does not re-cache at all."""
    before, after, events = _switch_run(pipe, "recache")
    assert events == [{"type": "prompt_recache", "frames": [0, 12], "query_only": 0,
                       "rewritten": [0, 1, 2, 6, 7, 8, 9, 10, 11], "sink_rewritten": True}]
    layer0 = [(b, a) for i, (b, a) in enumerate(zip(before, after)) if i % 2 == 0]
    layer1 = [(b, a) for i, (b, a) in enumerate(zip(before, after)) if i % 2 == 1]
    assert all(torch.allclose(b[0], a[0], atol=1e-5) and torch.allclose(b[1], a[1], atol=1e-5) for b, a in layer0)
    assert all((b[1] - a[1]).abs().max() > 1e-3 for b, a in layer1)  # the values carry the new prompt

    before, after, events = _switch_run(pipe, "recache-keep-sink")
    assert events[0]["frames"] == [3, 12] and not events[0]["sink_rewritten"] and events[0]["rewritten"] == list(range(6, 12))
    assert all(torch.equal(b[0], a[0]) and torch.equal(b[1], a[1]) for b, a in zip(before, after))

    before, after, events = _switch_run(pipe, "plain")
    assert events == [{"type": "prompt_switch", "recache": False}]
    assert all(torch.equal(b[1], a[1]) for b, a in zip(before, after))


def test_a_later_switch_keeps_the_sink_and_queries_through_its_frames(pipe):
    """Past the first window (switch at frame 18): the call covers frames 6..17, reads the sink, its
    first 3 frames only query, and the recent frames 12..17 are rewritten (the fixture's case)."""
    before, after, events = _switch_run(pipe, "recache", chunks=7, switch_at=6)
    assert events == [{"type": "prompt_recache", "frames": [6, 18], "query_only": 3,
                       "rewritten": list(range(12, 18)), "sink_rewritten": False}]
    assert all(torch.equal(b[0], a[0]) and torch.equal(b[1], a[1]) for b, a in zip(before, after))


def test_prompt_switch_flag_belongs_to_text_presets(tmp_path):
    line = one_line_error(invoke("generate", "--preset", "tiny", ROOT / "trajectories" / "aba.yaml", "--image",
                                 ROOT / "assets" / "images" / "mg2_universal_0000.png", "--prompt-switch", "plain",
                                 "-o", tmp_path / "o"))
    assert "--prompt-switch: preset tiny (Matrix-Game-2.0) takes no prompt switch; only Self-Forcing / LongLive" in line


def test_a_longlive_root_loads_its_generator_with_the_lora_merged(tmp_path):
    """longlive_base.pt's ``generator`` (its configs: use_ema false), lora.pt's ``generator_lora``
    merged at scale alpha / rank = 1 into the 10 targets of every block; a LoRA key of another
    layer is refused naming it."""
    from worldtrace_cli.model.lingbot.world import random_dit
    from worldtrace_cli.model.selfforcing.world import load_selfforcing_dit

    cfg = load_preset("longlive-tiny").dit
    ref = random_dit(cfg, 7, torch.device("cpu"), torch.float32)
    sd = {f"model.{k}": v for k, v in ref.state_dict().items()}
    torch.save({"generator": sd, "generator_ema": {k: torch.zeros_like(v) for k, v in sd.items()}}, tmp_path / "base.pt")
    g = torch.Generator().manual_seed(0)
    lora = {}
    for layer in range(cfg.num_layers):
        for target in [f"{a}.{p}" for a in ("self_attn", "cross_attn") for p in "qkvo"] + ["ffn.0", "ffn.2"]:
            w = ref.get_submodule(f"blocks.{layer}.{target}").weight
            lora[f"base_model.model.blocks.{layer}.{target}.lora_A.weight"] = torch.randn(4, w.shape[1], generator=g)
            lora[f"base_model.model.blocks.{layer}.{target}.lora_B.weight"] = torch.randn(w.shape[0], 4, generator=g)
    torch.save({"generator_lora": lora}, tmp_path / "lora.pt")
    dit = load_selfforcing_dit(tmp_path / "base.pt", cfg, torch.float32, torch.device("cpu"), tmp_path / "lora.pt")
    q = "blocks.1.cross_attn.q"
    want = ref.get_submodule(q).weight + lora[f"base_model.model.{q}.lora_B.weight"] @ lora[f"base_model.model.{q}.lora_A.weight"]
    assert torch.allclose(dit.get_submodule(q).weight, want, atol=1e-5)
    assert torch.equal(dit.head.head.weight, ref.head.head.weight)  # not a target
    torch.save({"generator_lora": {**lora, "base_model.model.head.head.lora_A.weight": torch.zeros(4, 4)}},
               tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="unexpected LoRA key base_model.model.head.head.lora_A.weight"):
        load_selfforcing_dit(tmp_path / "base.pt", cfg, torch.float32, torch.device("cpu"), tmp_path / "bad.pt")


def test_prompt_loops_pair_the_return_with_the_first_segment():
    from worldtrace_cli.metrics.revisit import pairs_from_prompts

    assert pairs_from_prompts(list("AAAABBBAAAA")) == [(0, 7), (1, 8), (2, 9), (3, 10)]
    assert pairs_from_prompts(list("AABBCAAA")) == [(0, 5), (1, 6)]  # the shorter of the two runs
    assert pairs_from_prompts(list("AABBAABB")) == [(0, 4), (1, 5), (2, 6), (3, 7)]  # B returns too
    assert pairs_from_prompts(list("AAAA")) == []  # no detour, no revisit


def test_recall_attention_of_a_prompt_loop_reads_the_whole_first_segment():
    """LoopBench for prompts' recall attention: a return chunk's first-visit frames are every latent
    frame of the first A segment (not only its paired chunk), and a record's share on slots holding
    them is its recall."""
    import torch

    from worldtrace_cli.metrics import first_visit_frames
    from worldtrace_cli.metrics.revisit import pairs_from_prompts
    from worldtrace_cli.outputs.records import recall_attention, recall_share
    from worldtrace_cli.trajectory.actions import ActionPlan

    prompts = list("AABBBAA")
    plan = ActionPlan("text", 7, torch.zeros(7 * 12 - 3, 0), None, [""] * 7, [], [], 3, prompts)
    firsts = first_visit_frames(plan, pairs_from_prompts(prompts))
    assert firsts == {5: set(range(6)), 6: set(range(6))}  # A's two chunks, 3 latent frames each
    def slot(kind, first, last, shares):  # one run of chunks.jsonl's slot records
        n = len(shares)
        return {"role": "summary" if kind == "landmark" else "recent", "kind": kind, "count": n,
                "frames": [[first, last]], "tokens": 4, "offset": [-n], "virtual_position": [-n], "attention": shares}

    def record(chunk, landmark_share):
        return {"chunk": chunk, "cache": {"attention": {"self": 0.4}, "slots": [
            slot("landmark", 1, 2, [landmark_share]),  # an average of A's frames 1 and 2
            slot("recent", 12, 14, [0.1, 0.1, 0.15])]}}  # B's last chunk

    assert recall_share(record(5, 0.25), firsts[5]) == pytest.approx(0.25)
    recall = recall_attention([record(4, 0.2), record(5, 0.25), record(6, 0.3)], firsts)
    assert recall["chunks"] == [5, 6] and recall["mean"] == pytest.approx(0.275)
    assert recall["expected"] == pytest.approx(0.2) and recall["lift"] == pytest.approx(0.075)


def test_prompt_scene_files_are_checked_in_one_line(tmp_path):
    from worldtrace_cli.loopbench.prompts import load_prompt_scenes, prompt_loop_document

    good = tmp_path / "p.yaml"
    good.write_text("harbour: {A: a harbour at dawn, B: a desert road}\n")
    assert load_prompt_scenes(good) == {"harbour": {"A": "a harbour at dawn", "B": "a desert road"}}
    with pytest.raises(InputError, match="loop prompt_abca visits C"):
        prompt_loop_document("prompt_abca", load_prompt_scenes(good)["harbour"])
    for text, match in (("harbour: {A: '', B: x}\n", "harbour.A: empty prompt"),
                        ("'a/b': {A: x, B: y}\n", "scene name"), ("harbour: {a: x}\n", "one capital letter"),
                        ("[1, 2]\n", "expected a mapping")):
        good.write_text(text)
        with pytest.raises(InputError, match=match):
            load_prompt_scenes(good)


def test_loopbench_for_prompts_runs_and_reports(tmp_path):
    """A -> B -> A prompt loops as a LoopBench sweep on the tiny preset: PAC pairs the return with
    the first A segment (summary: source prompts), the report has the prompt-loop tier and no
    paper table; images and worlds are refused for a text preset."""
    skip_without_ffmpeg()
    scenes = tmp_path / "scenes.yaml"
    scenes.write_text("harbour: {A: a harbour at dawn with fishing boats, B: a desert road at noon}\n")
    res = invoke("loopbench", "run", "--preset", "self-forcing-tiny", "--configs", "prompt_aba", "--caches",
                 "sliding,landmark", "--prompts", scenes, "-o", tmp_path / "lb", "--no-progress")
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "lb" / "prompt_aba" / "landmark" / "harbour" / "seed0" / "summary.json").read_text())
    assert summary["metrics"]["revisit"] == {"source": "prompts", "chunk_pairs": [[i, 8 + i] for i in range(4)]}
    assert summary["metrics"]["pac"] is not None
    assert invoke("loopbench", "report", tmp_path / "lb").exit_code == 0
    report = (tmp_path / "lb" / "report.md").read_text()
    assert "### Prompt loops (text-to-video)" in report and "prompt_aba (N=12)" in report
    assert "paper's table" not in report
    assert "scenes are prompts" in one_line_error(invoke("loopbench", "run", "--preset", "self-forcing-tiny",
                                                         "--worlds", "0", "-o", tmp_path / "x"))
    assert "--prompts: only text-to-video presets" in one_line_error(invoke(
        "loopbench", "run", "--preset", "tiny", "--prompts", scenes, "--images", ROOT / "assets" / "images",
        "-o", tmp_path / "x"))


@pytest.mark.parametrize("cache, held", [("sliding", [3, 4, 5]), ("full", [0, 1, 2, 3, 4, 5]),
                                         ("sink", [0, 3, 4, 5]), ("landmark", [4, 5])])
def test_rewrite_replaces_only_the_verbatim_frames_held(cache, held):
    """CacheWriter.rewrite (the re-cache's commit): frames the writer holds verbatim among the ids
    get the new K/V; nothing is added, evicted or moved; summaries keep theirs (sinks only with
    ``summary``)."""
    from worldtrace_cli.memory import CacheGeometry, MemoryConfig, build_writer

    extra = {"budget": 3} if cache == "sliding" else {"budget": 4, "sink_frames": 1} if cache == "sink" else {}
    writer = build_writer(MemoryConfig.of(cache, **extra), 3, 6)
    writer.reset(CacheGeometry(2, 1, 4, 2, 3, 5, torch.device("cpu"), torch.float32))
    for c in range(2):
        kv = [(torch.full((1, 6, 1, 4), 10.0 * c + layer), torch.full((1, 6, 1, 4), -10.0 * c - layer))
              for layer in range(2)]
        writer.commit(kv, [3 * c, 3 * c + 1, 3 * c + 2])
    writer.begin_chunk(6)
    before = [writer.read(layer)[:2] for layer in range(2)]
    slots = [s.frames for s in writer.slots()]
    new = [(torch.full((1, 12, 1, 4), 99.0), torch.full((1, 12, 1, 4), -99.0)) for _ in range(2)]
    done = writer.rewrite(new, [0, 1, 2, 3, 4, 5], summary=cache == "sink")
    assert sorted(done) == held
    writer.begin_chunk(6)
    assert [s.frames for s in writer.slots()] == slots
    for layer in range(2):
        k, v = writer.read(layer)[:2]
        for i, frames in enumerate(slots):
            rows = slice(2 * i, 2 * i + 2)
            rewritten = len(frames) == 1 and frames[0] in held and writer.slots()[i].kind in ("past", "recent", "sink")
            assert torch.equal(k[:, rows], torch.full_like(k[:, rows], 99.0) if rewritten else before[layer][0][:, rows])


def test_a_text_session_steps_on_prompts_and_generate_replays_it(tmp_path):
    """``wt.open("self-forcing-tiny")``: ``step(prompt=...)`` per chunk (none: the last prompt goes
    on; a new one re-caches), the recorded trajectory.yaml is prompt segments that ``generate``
    replays to the same frames; fork and save/load continue identically."""
    skip_without_ffmpeg()
    import worldtrace_cli as wt
    from worldtrace_cli.session import Session

    s = wt.open("self-forcing-tiny", cache="sliding", device="cpu", record=tmp_path / "rec")
    for p in ["a red lighthouse", None, "a busy market", None, "a red lighthouse"]:
        frames, record = s.step(prompt=p)
    assert frames.shape == (12, 96, 176, 3) and record["prompt"] == "a red lighthouse"
    assert s.actions_taken() == ["a red lighthouse"] * 2 + ["a busy market"] * 2 + ["a red lighthouse"]
    assert any(e["type"] == "prompt_recache" for e in record["cache"]["events"])
    twin = s.fork()
    s.save(tmp_path / "state")
    loaded = Session.load(tmp_path / "state", s.pipeline)
    shas = {x.step("a quiet beach").record["frames_sha256"] for x in (s, twin, loaded)}
    assert len(shas) == 1
    twin.close(), loaded.close(), s.close()
    assert "- {prompt: a busy market, chunks: 2}" in (tmp_path / "rec" / "trajectory.yaml").read_text()
    res = invoke("generate", tmp_path / "rec" / "trajectory.yaml", "--preset", "self-forcing-tiny", "--cache",
                 "sliding", "-o", tmp_path / "replay", "--no-progress")
    assert res.exit_code == 0, res.output
    want = [r["frames_sha256"] for r in read_jsonl(tmp_path / "rec" / "chunks.jsonl")]
    assert [r["frames_sha256"] for r in read_jsonl(tmp_path / "replay" / "chunks.jsonl")] == want


def test_text_session_refusals():
    import worldtrace_cli as wt

    with pytest.raises(InputError, match="takes no start image"):
        wt.open("self-forcing-tiny", image=ROOT / "assets" / "images" / "mg2_universal_0000.png")
    with pytest.raises(InputError, match="prompt_switch must be one of"):
        wt.open("self-forcing-tiny", prompt_switch="sometimes")
    s = wt.open("self-forcing-tiny", device="cpu")
    with pytest.raises(InputError, match="first chunk of a text-to-video session needs a prompt"):
        s.step()
    with pytest.raises(InputError, match="empty prompt"):
        s.step(prompt="  ")
    with pytest.raises(InputError, match="takes a prompt"):
        s.step({"keys": "W"})
    assert s.chunk == 0
    s.close()
    m = wt.open("tiny", image=ROOT / "assets" / "images" / "mg2_universal_0000.png", device="cpu")
    with pytest.raises(InputError, match="prompt= is for text-to-video presets"):
        m.step(prompt="a lighthouse")
    m.close()


def test_compare_and_bench_speed_take_the_text_presets(tmp_path):
    """``compare`` runs writers side by side on prompt segments (PAC paired by prompts; ``--sink-frames``
    goes to the sink alone); ``bench speed``
    runs the model's own cache with its official settings (LongLive: a 3-frame sink) and refuses an image."""
    skip_without_ffmpeg()
    res = invoke("compare", "--preset", "longlive-tiny", ABA, "--cache", "sink,landmark", "--sink-frames", 3, "--chunks", 9,
                 "-o", tmp_path / "cmp", "--no-progress")
    assert res.exit_code == 0, res.output
    assert len(json.loads((tmp_path / "cmp" / "compare.json").read_text())["modes"]) == 2
    summary = json.loads((tmp_path / "cmp" / "sink" / "summary.json").read_text())
    assert summary["config"]["memory"]["sink_frames"] == 3 and summary["metrics"]["revisit"]["source"] == "prompts"
    res = invoke("bench", "speed", "--preset", "longlive-tiny", "--caches", "sink", "--chunks", 2, "--device", "cpu",
                 "-o", tmp_path / "bench")
    assert res.exit_code == 0, res.output
    assert "takes no start image" in one_line_error(invoke("bench", "speed", "--preset", "longlive-tiny", "--image",
                                                     ROOT / "assets" / "images" / "mg2_universal_0000.png",
                                                     "--chunks", 2, "-o", tmp_path / "b2"))


def test_keep_sink_never_rewrites_a_sink_frame(pipe):
    """``recache-keep-sink`` before the sink is complete: a switch at frame 3 re-caches nothing; at
    frame 6 the call starts after frames 0-2 and reads them, so the sink they become holds exactly
    what a run without re-cache holds."""
    *_, events = _switch_run(pipe, "recache-keep-sink", chunks=2, switch_at=1)
    assert events == [{"type": "prompt_switch", "recache": False, "reason": "the frames so far are the kept sink"}]
    _, plain, _ = _switch_run(pipe, "plain", chunks=3, switch_at=2)
    _, kept, events = _switch_run(pipe, "recache-keep-sink", chunks=3, switch_at=2)
    assert events[0]["frames"] == [3, 6] and events[0]["rewritten"] == [3, 4, 5] and not events[0]["sink_rewritten"]
    assert len(kept) == 6 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(plain, kept))


def test_a_recache_reads_every_frame_held_before_it_at_the_writers_positions():
    """The call on frames r0.. reads the slots held before r0 (Self-Forcing's global cache: every older
    frame), positioned among themselves as a chunk at r0 would read them: rank positions contiguous."""
    from worldtrace_cli.engine.recache import past_before
    from worldtrace_cli.memory import CacheGeometry, MemoryConfig, build_writer

    geometry = CacheGeometry(1, 1, 4, 2, 3, 20, torch.device("cpu"), torch.float32)
    for spec, want in (({"cache": "full", "positions": "actual"}, [-6, -5, -4, -3, -2, -1]),
                       ({"cache": "sink", "budget": 9, "sink_frames": 3, "positions": "rank"}, [-3, -2, -1])):
        writer = build_writer(MemoryConfig.of(**spec), 9, 21)
        writer.reset(geometry)
        for c in range(6):
            writer.commit([(torch.full((1, 6, 1, 4), float(c)), torch.full((1, 6, 1, 4), float(c)))], [3 * c, 3 * c + 1, 3 * c + 2])
        start = 6 if spec["cache"] == "full" else 3
        writer.begin_chunk(start)
        (layer,) = past_before(writer, 1, start)
        assert layer.positions.tolist() == want and layer.k.shape[1] == 2 * len(want)


def test_a_text_session_replay_command_keeps_its_prompt_switch(tmp_path):
    import worldtrace_cli as wt

    s = wt.open("self-forcing-tiny", device="cpu", prompt_switch="plain")
    assert "--prompt-switch plain" in s.replay_command("t.yaml")
    s.close()
