"""worldtrace's own chunk loop on diffusers' transformer (issue 65, ``--backend diffusers``): TextRollout with
:class:`~worldtrace_cli.integrations.diffusers_backend.DiffusersWanDiT` equals TextRollout with worldtrace's own
t2v LingbotDiT on the same random weights (preset self-forcing-tiny / longlive-tiny), every writer's
every denoising call, the records (slots, positions, attention shares), the LongLive prompt-switch re-cache.
The real diffusers package, no mocks; small grids and few chunks so each test takes seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from worldtrace_cli.config import load_preset
from worldtrace_cli.engine.text_rollout import TextRollout
from worldtrace_cli.integrations.diffusers_backend import DiffusersWanDiT, diffusers_dit_from
from worldtrace_cli.memory import MemoryConfig, build_writer
from worldtrace_cli.model.lingbot.world import random_dit

ROOT = Path(__file__).resolve().parents[1]
HW, F, WINDOW = (4, 8), 3, 6  # latent grid 4 x 8 = 8 tokens per frame, chunks of 3, window 6
TOL = 1e-5  # the brief's bound in float32; measured: 0.0 (the same arithmetic, in the same order)


def tiny_dit(preset: str = "self-forcing-tiny", seed: int = 7):
    dit = random_dit(load_preset(preset).dit, seed, torch.device("cpu"), torch.float32)
    dit.rope.precision = torch.float32  # --rope-precision float32, what runs use (diffusers' tables are float32)
    return dit


@pytest.fixture(scope="module")
def pair():
    dit = tiny_dit()
    return dit, diffusers_dit_from(dit)


TEXT = torch.randn(12, 4096, generator=torch.Generator().manual_seed(1))


def rollout(dit, spec, options, chunks, window=WINDOW, hw=HW, attention=False, contexts=None, prompts=None,
            switch="recache"):
    """(x0 of every denoising call, the chunks' latents, their records) of a TextRollout."""
    writer = build_writer(MemoryConfig.of(spec, **options), window - F, window)
    x0s = {}
    r = TextRollout(dit, writer, TEXT if contexts is None else contexts, 0, torch.device("cpu"), hw,
                    trained_offset=window - 1, on_step=lambda c, s, x0: x0s.__setitem__((c, s), x0.clone()),
                    switch=switch, recache_window=window, prompts=prompts)
    if attention:
        r.measure_attention()
    outs = [r.step() for _ in range(chunks)]
    return x0s, [o.latents for o in outs], [o.record for o in outs]


def deviation(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def cache_view(record: dict) -> dict:
    """A record's cache part that the backend must not change (timings aside)."""
    c = record["cache"]
    return {k: c[k] for k in ("slots", "events") if k in c}


def test_the_backend_object_takes_the_dits_weights_and_interface(pair):
    dit, ddit = pair
    assert isinstance(ddit, DiffusersWanDiT) and ddit.cfg is dit.cfg
    assert ddit.patch_embedding.weight.dtype == torch.float32 and ddit.tokens_per_frame(HW) == dit.tokens_per_frame(HW)
    shared = {p.data_ptr() for p in dit.parameters()}
    assert all(p.data_ptr() in shared for p in ddit.transformer.parameters())  # taken over, not copied
    assert not any(p.requires_grad for p in ddit.parameters()) and not ddit.training
    from worldtrace_cli.model.lingbot.config import LingbotConfig

    with pytest.raises(ValueError, match="t2v"):  # LingBot-World's camera branch: not a Wan 2.1 t2v layout
        diffusers_dit_from(random_dit(LingbotConfig(dim=256, ffn_dim=512, num_heads=2, num_layers=1), 0,
                                      torch.device("cpu"), torch.float32))


@pytest.mark.parametrize("spec,options", [("sliding", {}), ("sink", {"sink_frames": 1}), ("field", {}),
                                          ("landmark", {}), ("full", {}), ("yarn", {})])
def test_text_rollout_on_diffusers_equals_the_native_dit(pair, spec, options):
    """4 chunks (window 6: field / landmark summarise evicted frames by chunk 2, yarn scales its frequencies):
    every call's x0 and every chunk's latents and cache record equal."""
    (a, la, ra), (b, lb, rb) = (rollout(d, spec, options, 4) for d in pair)
    assert deviation(a, b) <= TOL
    assert max((x - y).abs().max().item() for x, y in zip(la, lb)) <= TOL
    assert [cache_view(r) for r in ra] == [cache_view(r) for r in rb]


def test_attention_stats_on_the_diffusers_backend(pair):
    """--attention-stats: the probe sees the key buffer diffusers' attention reads; shares per slot equal."""
    (a, _, ra), (b, _, rb) = (rollout(d, "landmark", {}, 3, attention=True) for d in pair)
    assert deviation(a, b) <= TOL
    for x, y in zip(ra, rb):
        sx, sy = x["cache"]["attention"], y["cache"]["attention"]
        assert sx is not None and len(sx) == len(sy)
        assert all(abs(p - q) <= 1e-9 for p, q in zip(_flat(sx), _flat(sy)))
        slots = [_flat(s.get("attention")) for r in (x, y) for s in r["cache"]["slots"]]
        half = len(slots) // 2
        assert all(a == pytest.approx(b, abs=1e-9) for a, b in zip(slots[:half], slots[half:]))


def _flat(value):
    if isinstance(value, dict):
        return [v for k in sorted(value) for v in _flat(value[k])]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _flat(item)]
    return [value] if isinstance(value, (int, float)) else []


@pytest.mark.parametrize("switch_at", [2, 5])
def test_a_longlive_prompt_switch_recaches_the_same_on_diffusers(switch_at):
    """longlive-tiny's sink (budget 9, 3 sink frames), window 12: a switch at chunk 2 (LongLive's early switch:
    every frame re-cached, the sink rewritten) and at chunk 5 (the sink's 3 frames only query: the re-cache
    call's query_only_tokens), on a 2 x 4 grid (2 tokens per frame)."""
    dit = tiny_dit("longlive-tiny")
    ddit = diffusers_dit_from(dit)
    other = torch.randn(7, 4096, generator=torch.Generator().manual_seed(2))
    chunks = switch_at + 1
    contexts = [TEXT] * switch_at + [other] * (chunks - switch_at)
    prompts = ["a"] * switch_at + ["b"] * (chunks - switch_at)
    runs = [rollout(d, "sink", {"budget": 9, "sink_frames": 3, "positions": "actual"}, chunks, window=12, hw=(2, 4),
                    contexts=contexts, prompts=prompts) for d in (dit, ddit)]
    (a, _, ra), (b, _, rb) = runs
    assert deviation(a, b) <= TOL
    events = [e for e in ra[switch_at]["cache"]["events"] if e["type"].startswith("prompt")]
    assert events and events[0]["type"] == "prompt_recache"
    assert events[0]["query_only"] == (0 if switch_at == 2 else 3)
    assert [cache_view(r) for r in ra] == [cache_view(r) for r in rb]


def test_a_restored_rollout_on_diffusers_continues_exactly(pair):
    """What --resume (and a session's save / load) does: the writer's and the rollout's state_dict restored
    into a fresh writer and rollout; chunk 2 then equals the uninterrupted run's."""
    _, ddit = pair
    whole, _, _ = rollout(ddit, "landmark", {}, 3)
    writer = build_writer(MemoryConfig.of("landmark"), WINDOW - F, WINDOW)
    first = TextRollout(ddit, writer, TEXT, 0, torch.device("cpu"), HW, trained_offset=WINDOW - 1)
    first.step(), first.step()
    saved, state = writer.state_dict(), first.state.state_dict()
    again = build_writer(MemoryConfig.of("landmark"), WINDOW - F, WINDOW)
    x0s = {}
    second = TextRollout(ddit, again, TEXT, 0, torch.device("cpu"), HW, trained_offset=WINDOW - 1,
                         on_step=lambda c, s, x0: x0s.__setitem__((c, s), x0.clone()))
    again.load_state_dict(saved)
    second.restore(state, 2)
    second.step()
    assert deviation(x0s, {k: v for k, v in whole.items() if k[0] == 2}) <= TOL


def test_diffusers_own_offloading_casting_and_attention_backend_apply_to_the_backend(pair):
    """diffusers' settings on the wrapped transformer, as its documentation applies them: block-level group
    offloading (on a CPU the hooks run and nothing moves) and the ``native`` attention backend give the
    same x0 (0.0); float8 layerwise casting runs (the patch embedding stays in the compute dtype), its
    rounding moving x0 by a few percent of its range."""
    base, _, _ = rollout(pair[0], "sliding", {}, 2)
    offloaded = diffusers_dit_from(tiny_dit())
    offloaded.transformer.enable_group_offload(onload_device=torch.device("cpu"), offload_device=torch.device("cpu"),
                                               offload_type="block_level", num_blocks_per_group=1)
    offloaded.transformer.set_attention_backend("native")
    assert deviation(base, rollout(offloaded, "sliding", {}, 2)[0]) <= TOL
    cast = diffusers_dit_from(tiny_dit())
    cast.transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)
    assert cast.patch_embedding.weight.dtype == torch.float32
    assert cast.transformer.blocks[0].attn1.to_q.weight.dtype == torch.float8_e4m3fn
    fp8 = rollout(cast, "sliding", {}, 2)[0]
    span = max(v.abs().max().item() for v in base.values())
    assert 0 < deviation(base, fp8) < 0.1 * span


def test_external_past_mode_and_the_own_writer_mode_exclude_each_other():
    from worldtrace_cli.integrations import WorldTraceKVCacheConfig
    from worldtrace_cli.integrations.diffusers import apply_worldtrace_kv_cache, remove_worldtrace_kv_cache
    from worldtrace_cli.integrations.diffusers_external import apply_external_past

    ddit = diffusers_dit_from(tiny_dit())
    transformer = ddit.transformer
    with pytest.raises(ValueError, match="already attached"):
        apply_external_past(transformer)
    x, t = torch.randn(1, 16, F, *HW), torch.full((1,), 500.0)
    text = torch.cat([TEXT, torch.zeros(500, 4096)])[None]
    with pytest.raises(RuntimeError, match="outside ExternalPastState.call"):
        transformer(x, t, text, return_dict=False)
    assert ddit.release() and not ddit.release()
    plain = transformer(x, t, text, return_dict=False)[0]  # diffusers' own forward again
    apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig(window=WINDOW))
    with pytest.raises(ValueError, match="already attached"):
        apply_external_past(transformer)
    assert torch.equal(transformer(x, t, text, return_dict=False)[0], plain)  # an empty cache: bit for bit
    remove_worldtrace_kv_cache(transformer)


# --------------------------------------------------------------------------- the CLI: generate --backend


def test_generate_backend_diffusers_makes_the_native_runs_frames(tmp_path):
    """`generate --preset self-forcing-tiny --backend diffusers --chunks 2`: each chunk's latents statistics and
    metrics equal the native run's within float rounding (measured: the decoded frames' sha256 are equal), the
    backend is in summary.json's config, and a run compared with another backend names the difference."""
    import json
    from dataclasses import replace

    from conftest import invoke
    from worldtrace_cli.config import RunConfig
    from worldtrace_cli.runs.resume import differences

    preset = tmp_path / "small.yaml"  # self-forcing-tiny at 32 x 64 pixels: a 2 x 4 latent grid, quick to decode
    preset.write_text("description: self-forcing-tiny, smaller\nextends: self-forcing-tiny\nheight: 32\nwidth: 64\n")
    runs = {}
    for backend in ("native", "diffusers"):
        res = invoke("generate", "--preset", preset, ROOT / "trajectories" / "prompts_aba.yaml",
                     "--chunks", 2, "--backend", backend, "--no-progress", "-o", tmp_path / backend)
        assert res.exit_code == 0, res.output
        runs[backend] = [json.loads(line) for line in (tmp_path / backend / "chunks.jsonl").read_text().splitlines()]
    for a, b in zip(runs["native"], runs["diffusers"], strict=True):
        for key in ("latents", "metrics"):
            assert a[key].keys() == b[key].keys()
            assert all(abs(a[key][k] - b[key][k]) <= 1e-5 for k in a[key]), (a[key], b[key])
        assert a["cache"]["slots"] == b["cache"]["slots"]
    config = json.loads((tmp_path / "diffusers" / "summary.json").read_text())["config"]
    assert config["backend"] == "diffusers"
    saved = RunConfig.from_dict(config)
    assert differences(config, replace(saved, backend="native")) == ["backend 'diffusers' (now 'native')"]
    assert RunConfig.from_dict({k: v for k, v in config.items() if k != "backend"}).backend == "native"  # older runs


@pytest.mark.parametrize("args,says", [
    (("--preset", "tiny"), "--backend diffusers: preset tiny (Matrix-Game-2.0) runs --backend native; diffusers "
                               "runs the Self-Forcing / LongLive presets"),
    (("--preset", "self-forcing-tiny", "--compile", "default"), "--backend diffusers with --compile default"),
    (("--preset", "self-forcing-tiny", "--rope-precision", "float64"), "with --rope-precision float64"),
])
def test_generate_backend_diffusers_refusals_are_one_line_before_loading(tmp_path, args, says):
    from conftest import invoke, one_line_error

    trajectory = ROOT / "trajectories" / ("prompts_aba.yaml" if "self-forcing-tiny" in args else "aba.yaml")
    line = one_line_error(invoke("generate", trajectory, *args, "--backend", "diffusers", "-o", tmp_path / "o"))
    assert says in line
    assert not (tmp_path / "o").exists()


def test_a_session_on_the_diffusers_backend_makes_the_native_sessions_frames_and_replays_with_it(tmp_path):
    """``wt.open(..., backend="diffusers")``: the same prompts give the native session's frames, its replay
    command names the backend, and a saved session loads on the backend it ran on."""
    import worldtrace_cli as wt

    preset = tmp_path / "small.yaml"
    preset.write_text("description: self-forcing-tiny, smaller\nextends: self-forcing-tiny\nheight: 32\nwidth: 64\n")
    shas = {}
    for backend in ("native", "diffusers"):
        with wt.open(str(preset), cache="sliding", device="cpu", backend=backend) as s:
            shas[backend] = [s.step(prompt=p).record["frames_sha256"] for p in ("a red room", "a blue sea")]
            if backend == "diffusers":
                assert "--backend diffusers" in s.replay_command("t.yaml")
                assert type(s.pipeline.world.dit).__name__ == "DiffusersWanDiT"
                s.save(tmp_path / "saved")
    assert shas["diffusers"] == shas["native"]
    loaded = wt.load(tmp_path / "saved")
    try:
        assert loaded.cfg.backend == "diffusers" and type(loaded.pipeline.world.dit).__name__ == "DiffusersWanDiT"
    finally:
        loaded.close()


def test_compare_and_loopbench_take_the_backend(tmp_path):
    """``compare --backend diffusers`` runs every writer on diffusers' transformer (each run's summary says
    so, its frames the native compare's); ``loopbench run --backend diffusers`` on a preset whose DiT is
    not t2v is one line before any job."""
    import json

    from conftest import invoke, one_line_error

    preset = tmp_path / "small.yaml"
    preset.write_text("description: self-forcing-tiny, smaller\nextends: self-forcing-tiny\nheight: 32\nwidth: 64\n")
    shas = {}
    for backend in ("native", "diffusers"):
        res = invoke("compare", "--preset", preset, ROOT / "trajectories" / "prompts_aba.yaml", "--caches",
                     "sliding,field", "--chunks", 1, "--metrics", "fast", "--backend", backend, "--no-progress",
                     "-o", tmp_path / backend)
        assert res.exit_code == 0, res.output
        for cache in ("sliding", "field"):
            run = tmp_path / backend / cache
            assert json.loads((run / "summary.json").read_text())["config"]["backend"] == backend
            shas[backend, cache] = [json.loads(line)["frames_sha256"] for line in
                                    (run / "chunks.jsonl").read_text().splitlines()]
    assert all(shas["diffusers", c] == shas["native", c] for c in ("sliding", "field"))
    line = one_line_error(invoke("loopbench", "run", "--configs", "aba_short", "--caches", "sliding", "--worlds", "8",
                                 "--chunks", 1, "--backend", "diffusers", "-o", tmp_path / "lb"))
    assert "--backend diffusers: preset loopworld" in line and not (tmp_path / "lb").exists()
