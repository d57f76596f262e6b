"""The chunk loop on a tiny random DiT: any horizon, determinism, actions reach the model."""

from pathlib import Path

import pytest
import torch

from worldtrace_cli.memory import MemoryConfig, build_writer
from worldtrace_cli.model.sampler import FlowMatchSchedule
from worldtrace_cli.engine.rollout import Rollout
from worldtrace_cli.outputs.records import expand_slot_records

FIXTURES = Path(__file__).parent / "data" / "fixtures"
LATENT_HW = (4, 8)  # 2 x 4 = 8 tokens per latent frame


class ConstantConditioning:
    """Image-latent channels fixed per frame, mask at frame 0 (the shape ConditioningLatents serves)."""

    def __init__(self, seed=0):
        self.latent = torch.randn(1, 16, 1, *LATENT_HW, generator=torch.Generator().manual_seed(seed))

    def cond_concat(self, start, count):
        mask = torch.zeros(1, 4, count, *LATENT_HW)
        if start == 0:
            mask[:, :, 0] = 1
        return torch.cat([mask, self.latent.expand(-1, -1, count, -1, -1)], dim=1)


def make_rollout(dit, chunks, seed=0, keyboard=None, cache="sliding", schedule=FlowMatchSchedule(), noise=None,
                 on_step=None, context_noise=0, **options):
    rows = 12 * chunks - 3
    gen = torch.Generator().manual_seed(11)
    if keyboard is None:
        keyboard = (torch.rand(1, rows, 4, generator=gen) > 0.5).float()
    mouse = torch.zeros(1, rows, 2)
    ctx = torch.randn(1, 257, 1280, generator=gen)
    writer = build_writer(MemoryConfig.of(cache=cache, **options), dit.cfg.local_attn_size - 3)
    return Rollout(dit, writer, ConstantConditioning(), ctx, keyboard, mouse, schedule, seed,
                   torch.device("cpu"), LATENT_HW, noise=noise, on_step=on_step, context_noise=context_noise)


def test_400_chunks_past_mg2_rope_table(dit):
    """1200 latent frames: MG2's own 1024-row RoPE table would crash at frame 1024 (spec §6.1).

    Chunks 2..397 are committed straight into the writer (random canonical K/V: the cache contract,
    not the DiT, carries the horizon); the DiT runs the first two and the last two chunks, reading
    and rotating slots at latent frames 1191..1199."""
    rollout = make_rollout(dit, 400)
    g = rollout.geometry
    gen = torch.Generator().manual_seed(3)
    kv_bytes = set()
    for c in range(400):
        if 2 <= c < 398:
            rollout.writer.begin_chunk(3 * c)
            shape = (1, 3 * g.tokens_per_frame, g.heads, g.head_dim)
            rollout.writer.commit([(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
                                   for _ in range(g.num_layers)], [3 * c, 3 * c + 1, 3 * c + 2])
            rollout.chunk += 1
            continue
        out = rollout.step()
        assert torch.isfinite(out.latents).all(), c
        slots = out.record["cache"]["slots"]
        if c:  # one run of verbatim frames: a record's size does not grow with the horizon
            n = min(3, 3 * c)
            assert slots == [{"role": "recent", "kind": "past", "count": n, "frames": [[3 * c - n, 3 * c - 1]],
                              "offset": [-n, -1], "virtual_position": [3 * c - n, 3 * c - 1], "max_offset": 2 + n,
                              "tokens": 8, "bytes": slots[0]["bytes"]}]
            kv_bytes.add(out.record["cache"]["kv_bytes"])
    assert rollout.chunk == 400 and out.record["latent_frames"] == [1197, 1200]
    assert len(kv_bytes) == 1  # bounded: the sliding cache never grows


def test_same_seed_same_video_other_seed_differs(dit):
    a = [make_rollout(dit, 3, seed=5).step().latents for _ in range(1)]
    r1, r2, r3 = make_rollout(dit, 3, seed=5), make_rollout(dit, 3, seed=5), make_rollout(dit, 3, seed=6)
    for _ in range(3):
        x1, x2, x3 = r1.step().latents, r2.step().latents, r3.step().latents
        assert torch.equal(x1, x2)
        assert not torch.allclose(x1, x3)
    assert torch.equal(a[0], make_rollout(dit, 3, seed=5).step().latents)


def test_the_euler_sampler_draws_only_the_initial_noise(dit):
    """``euler`` (a preset's ``sampler``): each chunk depends on its initial noise only; MG2's
    ``renoise`` also on the fresh noise of every later step. Same initial noise, other later draws."""
    def noise(later_scale):
        def draw(chunk, i, shape):
            gen = torch.Generator().manual_seed(100 * chunk + i)
            return torch.randn(shape, generator=gen) * (1.0 if i == 0 else later_scale)
        return draw

    for sampler, same in (("euler", True), ("renoise", False)):
        schedule = FlowMatchSchedule((1000, 750, 500, 250), 2.0, sampler)
        a, b = (make_rollout(dit, 2, schedule=schedule, noise=noise(k)) for k in (1.0, -1.0))
        for _ in range(2):
            xa, xb = a.step().latents, b.step().latents
            assert torch.isfinite(xa).all() and torch.equal(xa, xb) == same, sampler


def test_context_noise_noises_the_context_pass_only(dit):
    """A preset's ``context_noise`` (timestep t): each chunk's context pass reads its latents noised
    to sigma t / 1000 with the chunk's draw after its denoising draws, at timestep t. The chunk itself
    is the clean rollout's; what later chunks read changes; the same seed gives the same video."""
    def hooked(context_noise, eps_is_x0=False):
        calls, last = [], {}

        def noise(chunk, i, shape):
            calls.append((chunk, i))
            if eps_is_x0 and i == 3:  # the context draw: the chunk's own latents, so the pass reads x0 itself
                return last["x0"].clone()
            return torch.randn(shape, generator=torch.Generator().manual_seed(100 * chunk + i))

        rollout = make_rollout(dit, 3, noise=noise, context_noise=context_noise,
                               on_step=lambda c, s, x0: last.update(x0=x0))
        return [rollout.step().latents for _ in range(3)], calls

    clean, clean_calls = hooked(0)
    noisy, calls = hooked(300)
    assert clean_calls == [(c, i) for c in range(3) for i in range(3)]
    assert calls == [(c, i) for c in range(3) for i in range(4)]  # one more draw per chunk, after the steps
    assert torch.equal(clean[0], noisy[0])
    assert not torch.allclose(clean[1], noisy[1], atol=1e-4) and not torch.allclose(clean[2], noisy[2], atol=1e-4)
    assert all(torch.equal(a, b) for a, b in zip(noisy, hooked(300)[0]))
    # with the chunk's own latents as the draw the pass reads x0 unchanged: only the timestep differs
    same_input, _ = hooked(300, eps_is_x0=True)
    assert torch.equal(same_input[0], clean[0]) and not torch.allclose(same_input[1], clean[1], atol=1e-4)


def test_actions_change_the_video_only_from_where_they_are_read(dit):
    """Row r is first read by latent frame f with 4f-12 <= r <= 4f-1 (spec §8): changing rows of
    chunk 2 leaves chunks 0-1 bit-identical and changes chunk 2 onward."""
    rows = 12 * 4 - 3
    kb = torch.zeros(1, rows, 4)
    kb2 = kb.clone()
    kb2[0, 21:33, 0] = 1  # rows owned by chunk 2 ([21, 33)); first read by frame 6 (rows 12..23)
    ra, rb = make_rollout(dit, 4, keyboard=kb), make_rollout(dit, 4, keyboard=kb2)
    outs = [(ra.step().latents, rb.step().latents) for _ in range(4)]
    assert torch.equal(*outs[0]) and torch.equal(*outs[1])
    assert not torch.allclose(*outs[2]) and not torch.allclose(*outs[3])


def test_a_chunk_past_the_given_actions_is_a_clear_error(dit):
    """Actions for 2 chunks (21 pixel-frame rows): chunk 2 reads rows up to 4*8-1 = 31. The bound is
    checked on the host (on a GPU the gather would be a device-side assert that poisons the process,
    the failure of the first GPU session's compiled-blocks test)."""
    rollout = make_rollout(dit, 2)
    rollout.step(), rollout.step()
    with pytest.raises(ValueError, match=r"latent frames 6\.\.8 read keyboard action rows up to 31, but only 21"):
        rollout.step()


def test_budget_zero_attends_to_the_current_chunk_only(dit):
    rollout = make_rollout(dit, 2)
    rollout.writer.budget = 0
    rollout.writer.reset(rollout.geometry)
    rollout.step()
    out = rollout.step()
    assert out.record["cache"]["slots"] == [] and out.record["cache"]["kv_bytes"] == 0


def test_bf16_model_follows_the_fp32_model(dit):
    """The GPU dtype: every norm computes in float32 (affine LayerNorm included), RoPE in float64;
    a bf16 copy of the model stays finite and close to the float32 rollout."""
    import copy

    half = copy.deepcopy(dit).to(torch.bfloat16)
    ref, low = make_rollout(dit, 3), make_rollout(half, 3)
    for _ in range(3):
        a, b = ref.step().latents, low.step().latents
        assert b.dtype == torch.float32 and torch.isfinite(b).all()
        assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.95


def test_records_state_each_slots_role_and_largest_offset_against_the_trained_one(dit):
    """WorldTrace's 6 past slots (landmark's every slot filled: the paper's padding) + 3 current frames read
    at offsets up to 8 (MG2 trained to 5); MG2's own sliding cache stays within 5. Roles separate summary
    slots from recent ones."""
    for cache, roles, largest, options in (("landmark", ["summary"] * 4 + ["recent"] * 2, 8, {"landmark_padding": "repeat"}),
                                           ("sliding", ["recent"] * 3, 5, {})):
        rollout = make_rollout(dit, 3, cache=cache, **options)
        for _ in range(3):
            rec = rollout.step().record["cache"]
        assert [s["role"] for s in expand_slot_records(rec["slots"])] == roles
        assert rec["trained_offset"] == dit.cfg.local_attn_size - 1 == 5 and rec["slot_count"] == len(roles)
        assert rec["max_offset"] == largest == max(s["max_offset"] for s in rec["slots"])
        assert all(s["max_offset"] == 2 - s["offset"][0] for s in rec["slots"])
