"""WorldTrace's memory outside worldtrace (issue 65; docs/diffusers.md): the backbone-free memory API, and the
hook on diffusers' own ``WanTransformer3DModel`` proven against worldtrace's Self-Forcing backbone and the
official Self-Forcing / LongLive fixtures. Everything runs the real diffusers package, no mocks."""

from __future__ import annotations

import io
import json
import re
import runpy
from pathlib import Path

import pytest
import torch

from worldtrace_cli.errors import InputError
from worldtrace_cli.integrations import KVMemory, TemporalRope, WorldTraceKVCacheConfig
from worldtrace_cli.integrations.diffusers import (ATTN_HOOK_NAME, HOOK_NAME, WorldTraceSelfAttentionHook,
                                                   apply_worldtrace_kv_cache, commit_chunk, get_worldtrace_kv_state,
                                                   remove_worldtrace_kv_cache)
from worldtrace_cli.integrations.wan_keys import diffusers_to_wan, wan_to_diffusers, wan_transformer_from_original

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "reference" / "selfforcing" / "fixtures"
HW, F, WINDOW, CHUNKS = (4, 8), 3, 6, 8  # latent grid 4 x 8 = 8 tokens per frame, chunks of 3, window 6
WRITERS = {"sliding": {}, "sink": {"sink_frames": 1}, "field": {}, "landmark": {}, "full": {}, "memrope": {},
           "mixed:2": {}, "naive": {}, "field-streaming": {}, "yarn": {}}
TINY = {"dim": 256, "ffn_dim": 512, "num_heads": 2, "num_layers": 2, "in_dim": 16, "out_dim": 16}


def tiny_dit(text_len: int = 512, seed: int = 7):
    """worldtrace's self-forcing-tiny DiT (t2v LingbotDiT) with seeded random weights, float32 RoPE tables
    (``--rope-precision float32``, what runs use)."""
    from worldtrace_cli.model.lingbot.config import LingbotConfig
    from worldtrace_cli.model.lingbot.world import random_dit

    dit = random_dit(LingbotConfig(**TINY, text_len=text_len, model_type="t2v"), seed, torch.device("cpu"),
                     torch.float32)
    dit.rope.precision = torch.float32
    return dit


@pytest.fixture(scope="module")
def tiny():
    dit = tiny_dit()
    transformer = wan_transformer_from_original(dit.state_dict(), TINY)
    text = torch.randn(12, 4096, generator=torch.Generator().manual_seed(1))
    padded = torch.cat([text, torch.zeros(512 - 12, 4096)])[None]  # Wan's zero padding to text_len rows
    return dit, transformer, text, padded


def noise(c: int, s: int, shape=(1, 16, F, *HW)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * c + s))


def worldtrace_rollout(dit, spec, options, text, chunks=CHUNKS, window=WINDOW, hw=HW, schedule=None,
                       attention=False):
    """worldtrace's own Self-Forcing chunk loop (TextRollout): (x0 of every call, latents per chunk, rollout)."""
    from worldtrace_cli.engine.text_rollout import TextRollout
    from worldtrace_cli.memory import MemoryConfig, build_writer
    from worldtrace_cli.model.selfforcing.sampler import SelfForcingSchedule

    writer = build_writer(MemoryConfig.of(spec, **options), window - F, window)
    x0s, records = {}, []
    rollout = TextRollout(dit, writer, text, 0, torch.device("cpu"), hw, trained_offset=window - 1,
                          schedule=schedule or SelfForcingSchedule(),
                          noise=lambda c, s, shape: noise(c, s, shape),
                          on_step=lambda c, s, x0: x0s.__setitem__((c, s), x0.clone()))
    if attention:
        rollout.measure_attention()
    latents = []
    for _ in range(chunks):
        out = rollout.step()
        latents.append(out.latents)
        records.append(out.record)
    return x0s, latents, rollout, records


@torch.no_grad()
def diffusers_rollout(transformer, padded, chunks=CHUNKS, hw=HW, schedule=None, on_chunk=None, start=0):
    """The same Self-Forcing loop written against diffusers' transformer, the hook marking the context pass."""
    from worldtrace_cli.model.lingbot.sampler import add_noise, flow_to_x0
    from worldtrace_cli.model.selfforcing.sampler import SelfForcingSchedule

    schedule = schedule or SelfForcingSchedule()
    ts, sig = schedule.timesteps(), schedule.sigmas()
    x0s, latents = {}, []
    for c in range(start, start + chunks):
        x = noise(c, 0, (1, 16, F, *hw))
        for s in range(len(ts)):
            flow = transformer(x, ts[s].reshape(1), padded, return_dict=False)[0]
            x0 = flow_to_x0(x, flow, sig[s])
            x0s[(c, s)] = x0
            if s < len(ts) - 1:
                x = add_noise(x0, noise(c, s + 1, (1, 16, F, *hw)), sig[s + 1])
        with commit_chunk(transformer):
            transformer(x0, torch.zeros(1), padded, return_dict=False)
        latents.append(x0)
        if on_chunk is not None:
            on_chunk(c)
    return x0s, latents


def deviation(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture
def hooked(tiny):
    """The tiny transformer with a cache attached by the test (``hooked(config)``), removed afterwards."""
    transformer = tiny[1]

    def attach(config):
        return apply_worldtrace_kv_cache(transformer, config)

    yield attach
    remove_worldtrace_kv_cache(transformer)


# --------------------------------------------------------------------------- weights


def test_the_wan_key_map_agrees_with_diffusers_own_converter(tiny):
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    sd = tiny[0].state_dict()
    ours, theirs = wan_to_diffusers(sd), convert_wan_transformer_to_diffusers(dict(sd))
    assert ours.keys() == theirs.keys() == tiny[1].state_dict().keys()
    assert all(ours[k] is theirs[k] for k in ours)
    back = diffusers_to_wan(tiny[1].state_dict())
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)
    assert wan_to_diffusers({"model.blocks.0.self_attn.q.weight": sd["blocks.0.self_attn.q.weight"]}).keys() == \
        {"blocks.0.attn1.to_q.weight"}  # Self-Forcing's .pt prefix
    with pytest.raises(ValueError, match="cam_injector_layer1"):
        wan_to_diffusers({"blocks.0.cam_injector_layer1.weight": torch.zeros(1)})  # LingBot's camera branch


# --------------------------------------------------------------------------- the hook itself


def test_hooks_register_through_diffusers_registry_and_remove_cleanly(tiny):
    _, transformer, _, padded = tiny
    x, t = noise(0, 0), torch.tensor([937.5])
    with torch.no_grad():
        plain = transformer(x, t, padded, return_dict=False)[0]
        state = apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig(cache="landmark", window=WINDOW))
        assert get_worldtrace_kv_state(transformer) is state
        assert transformer._diffusers_hook.get_hook(HOOK_NAME).state is state
        hooks = [b.attn1._diffusers_hook.get_hook(ATTN_HOOK_NAME) for b in transformer.blocks]
        assert all(isinstance(h, WorldTraceSelfAttentionHook) and h.state is state for h in hooks)
        assert [h.layer for h in hooks] == [0, 1]
        with pytest.raises(ValueError, match="already attached"):
            apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig())
        first = transformer(x, t, padded, return_dict=False)[0]  # chunk 0: an empty cache
        assert torch.equal(first, plain)  # the hooked attention is WanAttnProcessor's, bit for bit
        with commit_chunk(transformer):
            transformer(x, torch.zeros(1), padded, return_dict=False)
        assert state.chunks == 1 and state.memory.next_frame == F
        second = transformer(x, t, padded, return_dict=False)[0]
        assert not torch.allclose(second, plain)  # chunk 1 reads chunk 0
        transformer._reset_stateful_cache()  # diffusers' own reset of stateful hooks: a new video
        assert state.chunks == 0 and state.memory is None
        assert torch.equal(transformer(x, t, padded, return_dict=False)[0], plain)
        assert remove_worldtrace_kv_cache(transformer) and not remove_worldtrace_kv_cache(transformer)
        assert all(b.attn1._diffusers_hook.get_hook(ATTN_HOOK_NAME) is None for b in transformer.blocks)
        assert torch.equal(transformer(x, t, padded, return_dict=False)[0], plain)
    with pytest.raises(ValueError, match="no WorldTrace KV cache"):
        get_worldtrace_kv_state(transformer)


@pytest.mark.parametrize("spec", list(WRITERS))
def test_a_diffusers_rollout_equals_worldtraces_selfforcing_backbone(tiny, hooked, spec):
    """The proof: every denoising call's x0 and every chunk's latents, diffusers + hook vs TextRollout."""
    dit, transformer, text, padded = tiny
    want_x0, want_latents, rollout, records = worldtrace_rollout(dit, spec, WRITERS[spec], text)
    state = hooked(WorldTraceKVCacheConfig(cache=spec, window=WINDOW, options=WRITERS[spec], official_timesteps=True))
    x0s, latents = diffusers_rollout(transformer, padded)
    assert state.events == records[-1]["cache"]["events"]  # e.g. landmark's detector tests, chunk for chunk
    assert deviation(x0s, want_x0) <= 1e-6  # measured 0.0 for every writer (2026-12-02, CPU float32)
    assert max((a - b).abs().max().item() for a, b in zip(latents, want_latents)) <= 1e-6
    assert state.chunks == CHUNKS and state.frame_start is None
    rollout.writer.begin_chunk(CHUNKS * F)  # both writers hold the same memory for the next chunk
    ours = state.memory.begin_chunk()
    assert [(s.kind, s.frames) for s in ours] == [(s.kind, s.frames) for s in rollout.writer.slots()]
    assert torch.equal(state.memory.positions, rollout.writer.positions())
    for layer in range(2):
        mine, theirs = state.memory.read(layer), rollout.writer.read(layer)
        assert torch.equal(mine.keys, theirs[0]) and torch.equal(mine.values, theirs[1])
    if spec not in ("sliding", "full", "yarn"):
        assert any(s.role == "summary" for s in ours), ours  # the summary slots are exercised


def test_plain_diffusers_timesteps_stay_within_3e_5_of_the_backbone(tiny, hooked):
    """Without official_timesteps the only difference is diffusers' float32 timestep sinusoid."""
    dit, transformer, text, padded = tiny
    want_x0, want_latents, _, _ = worldtrace_rollout(dit, "landmark", {}, text)
    hooked(WorldTraceKVCacheConfig(cache="landmark", window=WINDOW))
    x0s, latents = diffusers_rollout(transformer, padded)
    dev = deviation(x0s, want_x0)
    assert 0 < dev <= 3e-5  # measured 2.56e-05 (x0), 1.58e-05 (latents)
    assert max((a - b).abs().max().item() for a, b in zip(latents, want_latents)) <= 3e-5


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["full", "landmark"])
def test_a_rollout_past_1024_latent_frames_equals_the_backbone(spec):
    """345 chunks (1,035 latent frames; 1 token per frame, one denoising step, window 21): ``full`` at actual
    positions reads offsets down to -1,032, past diffusers' 1024-row RoPE table; ``landmark`` reads at slot-rank
    positions inside the window however far the video goes. Both equal worldtrace's backbone."""
    from worldtrace_cli.model.selfforcing.sampler import SelfForcingSchedule

    dit = tiny_dit(text_len=16)
    transformer = wan_transformer_from_original(dit.state_dict(), TINY)
    text = torch.randn(5, 4096, generator=torch.Generator().manual_seed(2))
    padded = torch.cat([text, torch.zeros(11, 4096)])[None]
    one_step, hw, chunks = SelfForcingSchedule(indices=(0,)), (2, 2), 345
    want_x0, _, rollout, _ = worldtrace_rollout(dit, spec, {}, text, chunks, window=21, hw=hw, schedule=one_step)
    state = apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig(cache=spec, window=21,
                                                                            official_timesteps=True))
    x0s, _ = diffusers_rollout(transformer, padded, chunks, hw=hw, schedule=one_step)
    assert state.memory.next_frame == 1035 > transformer.rope.max_seq_len
    assert torch.equal(state.positions, rollout.writer.positions())  # the last chunk read the same offsets
    assert state.positions.min().item() == (-1032 if spec == "full" else -21)
    assert deviation(x0s, want_x0) <= 1e-6  # measured 0.0 (both)


def test_attention_per_slot_equals_the_products_attention_stats(tiny, hooked):
    dit, transformer, text, padded = tiny
    _, _, _, records = worldtrace_rollout(dit, "landmark", {}, text, chunks=5, attention=True)
    state = hooked(WorldTraceKVCacheConfig(cache="landmark", window=WINDOW, attention_stats=True,
                                           official_timesteps=True))
    seen = {}
    diffusers_rollout(transformer, padded, chunks=5, on_chunk=lambda c: seen.__setitem__(c, state.attention.clone()))
    for c, record in enumerate(records):
        want = torch.tensor(record["cache"]["attention"]["slots_by_layer"], dtype=torch.float64)
        assert torch.allclose(seen[c][:, :-1], want, atol=1e-5), c  # the record keeps 5 digits
        assert torch.allclose(seen[c].sum(1), torch.ones(2, dtype=torch.float64))
    rows = state.slot_attention()
    assert rows[-1]["kind"] == "current" and len(rows) == len(state.slots) + 1
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-6  # float32 logits


def test_a_saved_state_continues_bit_identically(tiny, hooked):
    _, transformer, _, padded = tiny
    config = WorldTraceKVCacheConfig(cache="field", window=WINDOW, official_timesteps=True)
    state = hooked(config)
    diffusers_rollout(transformer, padded, chunks=4)
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    straight, _ = diffusers_rollout(transformer, padded, chunks=3, start=4)
    remove_worldtrace_kv_cache(transformer)
    fresh = apply_worldtrace_kv_cache(transformer, config)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    assert fresh.chunks == 4 and fresh.next_frame == 12
    resumed, _ = diffusers_rollout(transformer, padded, chunks=3, start=4)
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    with pytest.raises(InputError, match="settings"):
        remove_worldtrace_kv_cache(transformer)
        apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig(cache="field", window=8)).load_state_dict(
            fresh.state_dict())
    fresh.reset()
    assert fresh.memory is None and fresh.next_frame == 0


@pytest.mark.skipif(not (FIXTURES / "tiny_weights.safetensors").is_file(), reason="shared Self-Forcing fixtures absent")
@pytest.mark.parametrize("official", [True, False])
def test_the_official_fixtures_replay_through_diffusers(official):
    """sf_global, sf_la6_sink3 and longlive_infinity (the variants without a LoRA or prompt switch), run by the
    official code, replayed through diffusers' transformer and the hook: every call's x0 and the latents."""
    from safetensors.torch import load_file

    from worldtrace_cli.jobs.parity_selfforcing import variant_memory

    cfg = json.loads((FIXTURES / "tiny_config.json").read_text())
    weights = {k: v.float() for k, v in load_file(FIXTURES / "tiny_weights.safetensors").items()}
    transformer = wan_transformer_from_original(weights, cfg)
    inputs = load_file(FIXTURES / "tiny_inputs.safetensors")
    padded = torch.cat([inputs["text_context"], torch.zeros(500, 4096)])[None]
    worst = {}
    for name in ("sf_global", "sf_la6_sink3", "longlive_infinity"):
        run = json.loads((FIXTURES / name / "run_config.json").read_text())
        out = load_file(FIXTURES / name / "tiny_outputs.safetensors")
        memory, why = variant_memory(run)
        assert why is None, why
        window = run["local_attn_size"] if run["local_attn_size"] > 0 else run["kv_cache_tokens"] // run["frame_seq_length"]
        options = {k: memory[k] for k in ("sink_frames",) if k in memory}
        apply_worldtrace_kv_cache(transformer, WorldTraceKVCacheConfig(
            cache=memory["cache"], window=window, budget=memory.get("budget"), positions=memory["positions"],
            options=options, official_timesteps=official))
        ts, sig = out["denoising_timesteps"], out["sigmas_float32"]
        dev = 0.0
        with torch.no_grad():
            for c in range(run["num_chunks"]):
                x = inputs["noise"][:, 3 * c:3 * c + 3].permute(0, 2, 1, 3, 4)  # frame-major -> [1, C, F, h, w]
                for s in range(4):
                    flow = transformer(x, ts[s].reshape(1), padded, return_dict=False)[0]
                    x0 = (x.double() - sig[s].double() * flow.double()).float()
                    dev = max(dev, (x0 - out[f"call_c{c}_s{s}_x0"].permute(0, 2, 1, 3, 4)).abs().max().item())
                    if s < 3:
                        x = (1 - sig[s + 1]) * x0 + sig[s + 1] * out["add_noise_draws"][c, s].permute(1, 0, 2, 3)[None]
                with commit_chunk(transformer):
                    transformer(x0, torch.zeros(1), padded, return_dict=False)
                want = out["output_latents"][:, 3 * c:3 * c + 3].permute(0, 2, 1, 3, 4)
                dev = max(dev, (x0 - want).abs().max().item())
        worst[name] = dev
        remove_worldtrace_kv_cache(transformer)
    # measured (CPU float32, x0 / latents): official_timesteps 3.0e-6 / 3.1e-6 / 3.0e-6 (worldtrace's own replay:
    # 2.6e-6 - 2.9e-6); diffusers' float32 sinusoid 2.4e-5 each (the fixtures README's bound: 1e-4)
    assert max(worst.values()) <= (1e-5 if official else 1e-4), worst


# --------------------------------------------------------------------------- the memory as a library


def docs_block(heading: str) -> str:
    text = (ROOT / "docs" / "diffusers.md").read_text()
    section = text.split(f"## {heading}", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_docs_loop_runs_as_written_and_its_saved_memory_reads_the_same():
    scope: dict = {}
    exec(compile(docs_block("Use the memory in your own loop"), "docs/diffusers.md", "exec"), scope)
    memory, again = scope["memory"], scope["again"]
    assert len(scope["outputs"]) == 8 and all(torch.isfinite(o).all() for o in scope["outputs"])
    assert memory.chunks == again.chunks == 8 and again.next_frame == 24
    memory.begin_chunk()
    assert [s.frames for s in memory.slots] == [s.frames for s in again.slots]
    assert any(s.kind == "landmark" for s in again.slots)
    for layer in range(2):
        a, b = memory.read(layer), again.read(layer)
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert torch.equal(a.token_positions, b.token_positions)


def test_the_sliding_memory_is_a_causal_window_at_absolute_positions():
    """KVMemory('sliding') + TemporalRope in a chunk loop equals attention over the last `budget` frames with
    every key and query rotated at its absolute latent frame (the textbook causal window), layer by layer."""
    import torch.nn.functional as F_

    heads, head_dim, tokens, budget = 2, 128, 4, 4
    memory = KVMemory("sliding", layers=1, heads=heads, head_dim=head_dim, tokens_per_frame=tokens, budget=budget,
                      dtype=torch.float64)
    rope = TemporalRope.wan(head_dim, precision=torch.float64)
    gen = torch.Generator().manual_seed(3)
    keys_all, values_all = [], []
    for c in range(5):
        q, k, v = (torch.randn(1, F * tokens, heads, head_dim, generator=gen, dtype=torch.float64) for _ in range(3))
        slots = memory.begin_chunk()
        past = memory.read(0)
        here = torch.arange(F, dtype=torch.float64).repeat_interleave(tokens)
        out = F_.scaled_dot_product_attention(rope.rotate(q, here).transpose(1, 2),
                                              torch.cat([past.rotated(rope), rope.rotate(k, here)], 1).transpose(1, 2),
                                              torch.cat([past.values, v], 1).transpose(1, 2))
        keys_all.append(k)
        values_all.append(v)
        first = max(0, c * F - budget)  # the reference: absolute positions over frames [first, end of chunk)
        ks = torch.cat(keys_all, 1)[:, first * tokens:]
        vs = torch.cat(values_all, 1)[:, first * tokens:]
        absolute = torch.arange(first, (c + 1) * F, dtype=torch.float64).repeat_interleave(tokens)
        ref = F_.scaled_dot_product_attention(rope.rotate(q, here + c * F).transpose(1, 2),
                                              rope.rotate(ks, absolute).transpose(1, 2), vs.transpose(1, 2))
        assert torch.allclose(out, ref, atol=1e-10), c
        assert [s.frames[0] for s in slots] == list(range(first, c * F))
        memory.commit([(k, v)])


def test_the_temporal_rope_is_the_transformers_table_and_goes_past_it(tiny):
    from worldtrace_cli.integrations.diffusers import _temporal_channels

    rope_module = tiny[1].rope
    t = _temporal_channels(rope_module)  # diffusers 0.42 keeps t_dim, 0.35 does not
    assert t == 44 and getattr(rope_module, "t_dim", t) == t
    rope = TemporalRope.from_table(rope_module.freqs_cos, rope_module.freqs_sin, t)
    assert torch.allclose(rope.omega, TemporalRope.wan(128).omega)
    cos, sin = rope.angles(torch.arange(1024.0))
    assert torch.equal(cos, rope_module.freqs_cos[:, :t:2]) and torch.equal(sin, rope_module.freqs_sin[:, :t:2])
    far = rope.angles(torch.tensor([-5000.0, 2048.5]))[0]
    assert far.shape == (2, 22) and torch.isfinite(far).all()
    with pytest.raises(ValueError, match="rope_theta 500"):
        TemporalRope.from_table(rope_module.freqs_cos, rope_module.freqs_sin, t, theta=500.0)


# --------------------------------------------------------------------------- refusals


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message and message
    return message


def test_bad_settings_are_one_line_errors_naming_the_field():
    cases = [(dict(frames_per_chunk=0), ValueError, "frames_per_chunk"), (dict(window=3), ValueError, "window"),
             (dict(cache=""), ValueError, "cache"), (dict(options=[1]), ValueError, "options"),
             (dict(attention_queries=-1), ValueError, "attention_queries"), (dict(rope_theta=1), ValueError, "rope_theta"),
             (dict(cache="nope"), InputError, "unknown writer"), (dict(cache="retrieval"), InputError, "camera pose"),
             (dict(cache="sliding", summary_slots=2), InputError, "--summary-slots"),
             (dict(cache="sink", options={"landmark_threshold": 0.2}), InputError, "--landmark-threshold"),
             (dict(official_timesteps=1), ValueError, "official_timesteps")]
    for kwargs, kind, needle in cases:
        with pytest.raises(kind) as exc:
            WorldTraceKVCacheConfig(**kwargs)
        assert needle in one_line(exc), (kwargs, str(exc.value))
    sizes = dict(layers=2, heads=2, head_dim=128, tokens_per_frame=8)
    for field, value in [("layers", 0), ("heads", 1.5), ("tokens_per_frame", True), ("window", 2)]:
        with pytest.raises(ValueError) as exc:
            KVMemory("sliding", **{**sizes, field: value})
        assert field in one_line(exc)
    memory = KVMemory("sliding", **sizes)
    with pytest.raises(RuntimeError, match="begin_chunk"):
        memory.read(0)
    memory.begin_chunk()
    with pytest.raises(ValueError) as exc:
        memory.read(2)
    assert "layer" in one_line(exc)
    with pytest.raises(ValueError) as exc:
        memory.commit([(torch.zeros(1, 24, 2, 128), torch.zeros(1, 24, 2, 128))])
    assert "layers_kv" in one_line(exc)
    with pytest.raises(ValueError) as exc:
        memory.commit([(torch.zeros(1, 23, 2, 128), torch.zeros(1, 23, 2, 128))] * 2)
    assert "layers_kv[0]" in one_line(exc)
    with pytest.raises(InputError) as exc:
        KVMemory("field", **sizes).load_state_dict(memory.state_dict())
    assert "cache" in one_line(exc)


def test_bad_calls_are_one_line_errors(tiny, hooked):
    _, transformer, _, padded = tiny
    with pytest.raises(ValueError, match="WanTransformer3DModel"):
        apply_worldtrace_kv_cache(torch.nn.Linear(2, 2), WorldTraceKVCacheConfig())
    with pytest.raises(TypeError, match="WorldTraceKVCacheConfig"):
        apply_worldtrace_kv_cache(transformer, {"cache": "sliding"})
    state = hooked(WorldTraceKVCacheConfig(cache="sliding", window=WINDOW))
    t = torch.tensor([1000.0])
    with torch.no_grad():
        with pytest.raises(ValueError) as exc:
            transformer(torch.randn(1, 16, 4, *HW), t, padded, return_dict=False)
        assert "frames_per_chunk" in one_line(exc)
        transformer(noise(0, 0), t, padded, return_dict=False)
        with pytest.raises(ValueError) as exc:
            transformer(torch.randn(1, 16, F, 8, 8), t, padded, return_dict=False)
        assert "tokens per latent frame" in one_line(exc)
        two = transformer(noise(0, 0).expand(2, -1, -1, -1, -1), t.expand(2), padded.expand(2, -1, -1),
                          return_dict=False)[0]  # a batch reads the same past (a CFG pair)
        assert torch.allclose(two[0], two[1])
        with pytest.raises(ValueError) as exc, commit_chunk(transformer):
            transformer(noise(0, 0).expand(2, -1, -1, -1, -1), t.expand(2), padded.expand(2, -1, -1))
        assert "batch 2" in one_line(exc)
        with pytest.raises(RuntimeError) as exc, commit_chunk(transformer):
            pass
        assert "nothing was committed" in one_line(exc)
        assert state.chunks == 0


def test_the_example_runs_on_a_cpu_in_seconds(capsys):
    result = runpy.run_path(str(ROOT / "examples" / "diffusers_chunk_loop.py"), run_name="example")["main"](
        ["--cache", "field", "--chunks", "4"])
    assert result["state"].chunks == 4 and list(result["latents"].shape) == [1, 16, 12, 8, 8]
    assert torch.isfinite(result["latents"]).all()
    assert "field: 4 chunks committed" in capsys.readouterr().out
