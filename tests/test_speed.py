"""The hot path's speed options change how fast, not what is computed: RoPE tables in float32,
torch.compile of the blocks, and decoding one chunk behind generation."""

import copy
import dataclasses
import shutil

import pytest
import torch

from worldtrace_cli.memory import MemoryConfig, build_writer
from worldtrace_cli.model.dit import CausalWanDiT, init_random_weights
from worldtrace_cli.model.speed import compile_blocks, configure_speed
from worldtrace_cli.model.rope import MainRope
from worldtrace_cli.model.sampler import FlowMatchSchedule
from worldtrace_cli.model.vae import StreamingDecoder, build_wan_vae
from worldtrace_cli.engine.decode import DecodePipeline
from worldtrace_cli.engine.rollout import ChunkOutput, Rollout

from test_rollout import LATENT_HW, ConstantConditioning


def _rope(precision):
    return MainRope(128, precision=precision)


def test_chunk_tables_rotate_like_spatial_then_temporal():
    """One pass over all pairs with the chunk's tables == spatial RoPE, then temporal RoPE at the
    chunk's frame offsets (the axes use disjoint channels), exactly in float64."""
    rope = _rope(torch.float64)
    frames, h, w = 3, 2, 4
    x = torch.randn(1, frames * h * w, 2, 128, dtype=torch.float64)
    cos, sin = rope.chunk_tables(frames, h, w)
    positions = torch.arange(frames, dtype=torch.float64).repeat_interleave(h * w)
    expected = rope.apply_temporal(rope.apply_spatial(x, h, w), positions)
    assert torch.equal(rope.rotate(x, cos, sin), expected)
    # the spatial columns alone make the canonical key: temporal channels untouched
    canon = rope.rotate(x, cos[:, rope.t_ch // 2:], sin[:, rope.t_ch // 2:], start=rope.t_ch)
    assert torch.equal(canon, rope.apply_spatial(x, h, w))
    assert torch.equal(canon[..., :rope.t_ch], x[..., :rope.t_ch])


def test_float32_rope_is_within_one_bf16_rounding_of_float64():
    """float32 tables (rounded once from float64 angles) only move a bf16 key where the float64
    result sits on a rounding boundary: by one bf16 step, on a small fraction of elements."""
    frames, h, w = 3, 6, 8
    x = torch.randn(1, frames * h * w, 4, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    results = {}
    for precision in (torch.float64, torch.float32):
        rope = _rope(precision)
        cos, sin = rope.chunk_tables(frames, h, w, device="cpu")
        assert cos.dtype == precision
        results[precision] = rope.rotate(x, cos, sin)
    a, b = results[torch.float64].float(), results[torch.float32].float()
    diff = (a - b).abs()
    one_step = a.abs().clamp(min=1e-30) * 2.0 ** -7  # bf16 has 8 significant bits
    assert (diff <= one_step + 1e-30).all()
    assert (diff > 0).float().mean() < 0.01


def test_float32_rope_matches_float64_on_float32_keys_and_far_positions():
    """Angles are computed in float64 before rounding, so even 5000 latent frames away the float32
    rotation agrees with the float64 one to float32 accuracy."""
    x = torch.randn(1, 4 * 6, 2, 128)
    pos = torch.tensor([-5000.0, -1.0, 0.5, 3000.0], dtype=torch.float64)
    a = _rope(torch.float64).rotate_slots(x, pos)
    b = _rope(torch.float32).rotate_slots(x, pos)
    assert (a - b).abs().max() < 1e-5


def test_unknown_precision_and_compile_mode_are_refused(dit):
    with pytest.raises(ValueError, match="float64 or float32"):
        MainRope(128, precision=torch.float16)
    with pytest.raises(ValueError, match="RoPE precision"):
        configure_speed(dit, "float16")
    with pytest.raises(ValueError, match="compile mode"):
        compile_blocks(dit, "fastest")


def _rollout(model, writer_name="landmark", device="cpu", chunks=6):
    """A rollout whose actions cover ``chunks`` chunks (12 pixel-frame rows per 3-latent-frame chunk)."""
    gen = torch.Generator().manual_seed(5)
    rows = 12 * chunks - 3
    keyboard = (torch.rand(1, rows, 4, generator=gen) > 0.5).float()
    writer = build_writer(MemoryConfig.of(cache=writer_name), model.cfg.local_attn_size - 3)
    return Rollout(model, writer, ConstantConditioning(), torch.randn(1, 257, 1280, generator=gen), keyboard,
                   torch.zeros(1, rows, 2), FlowMatchSchedule(), 0, torch.device(device), LATENT_HW)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile on CPU needs a C++ compiler")
def test_compiled_blocks_follow_eager_and_share_one_graph_per_part(dit):
    """Three-layer model: a compiled rollout gives the eager latents and cache within float32
    rounding; the graphs do not multiply with the layers (parameters are graph inputs), so a
    30-layer MG2 does not hit torch's recompile limit and fall back to eager."""
    from torch._dynamo.utils import counters

    cfg = dataclasses.replace(dit.cfg, num_layers=3)
    model = CausalWanDiT(cfg).eval()
    init_random_weights(model, seed=4)
    compiled = copy.deepcopy(model)
    torch._dynamo.reset()
    graphs_before = counters["stats"]["unique_graphs"]
    compile_blocks(compiled, "default")
    assert compiled.compile_mode == "default" and not compiled.cudagraphs  # no CUDA graphs in default mode
    eager_run, compiled_run = _rollout(model), _rollout(compiled)
    for _ in range(4):
        a, b = eager_run.step(), compiled_run.step()
        assert (a.latents - b.latents).abs().max() < 1e-4
        assert a.record["cache"]["slots"] == b.record["cache"]["slots"]
    for layer in range(cfg.num_layers):
        (ka, va, _), (kb, vb, _) = eager_run.writer.read(layer), compiled_run.writer.read(layer)
        assert (ka - kb).abs().max() < 1e-4 and (va - vb).abs().max() < 1e-4
    # attention_inputs (denoising, context pass), attention_outputs, feed_forward, and the action
    # module's mouse_part / keyboard_part (first chunk without past, then with): 8 graphs for any
    # number of layers (one graph per layer would give 3 x 8 here)
    assert 5 <= counters["stats"]["unique_graphs"] - graphs_before <= 8
    compile_blocks(compiled, "none")  # back to eager: the very same numbers as the eager model
    assert all("attention_inputs" not in b.__dict__ and (b.action_model is None or "mouse_part" not in
                                                         b.action_model.__dict__) for b in compiled.blocks)
    assert torch.equal(_rollout(model).step().latents, _rollout(compiled).step().latents)


@pytest.fixture(scope="module")
def tiny_vae():
    return build_wan_vae("tiny", seed=2)


def _outputs(count, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [ChunkOutput(torch.randn(1, 16, 3, 2, 3, generator=gen), None, {"chunk": c, "timings_s": {}})
            for c in range(count)]


def test_overlapped_decode_returns_every_chunk_once_in_order_with_the_same_frames(tiny_vae):
    sync = DecodePipeline(StreamingDecoder(tiny_vae), "cpu", overlap=False)
    lagged_decoder = StreamingDecoder(tiny_vae)
    lagged = DecodePipeline(lagged_decoder, "cpu", overlap=True)
    expected, got = [], []
    for a, b in zip(_outputs(4), _outputs(4)):
        done = sync.submit(a)
        assert [d.record["chunk"] for d in done] == [a.record["chunk"]]
        expected += done
        ready = lagged.submit(b)
        assert [d.record["chunk"] for d in ready] == ([] if b.record["chunk"] == 0 else [b.record["chunk"] - 1])
        got += ready
    got += lagged.flush()
    assert lagged.flush() == []
    lagged.close()
    assert [d.record["chunk"] for d in got] == [0, 1, 2, 3]
    for e, g in zip(expected, got):
        assert torch.equal(e.frames, g.frames) and g.frames.dtype == torch.uint8
        assert g.record["timings_s"]["decode"] > 0 and "decode_wait" in g.record["timings_s"]
    assert [f.shape[0] for f in (d.frames for d in got)] == [9, 12, 12, 12]
    # after a flush the decoder's state covers every submitted chunk (what resume states save)
    assert lagged_decoder.frames_decoded == sync.decoder.frames_decoded == 45


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_side_stream_decode_gives_the_synchronous_frames(tiny_vae):
    vae = copy.deepcopy(tiny_vae).cuda()
    sync = DecodePipeline(StreamingDecoder(vae), "cuda", overlap=False)
    side = DecodePipeline(StreamingDecoder(vae), "cuda", overlap=True)
    assert side._stream is not None
    expected, got = [], []
    for a, b in zip(_outputs(5), _outputs(5)):
        expected += sync.submit(ChunkOutput(a.latents.cuda(), None, a.record))
        got += side.submit(ChunkOutput(b.latents.cuda(), None, b.record))
    got += side.flush()
    assert [d.record["chunk"] for d in got] == list(range(5))
    for e, g in zip(expected, got):
        assert g.frames.device.type == "cpu" and torch.equal(e.frames, g.frames)
        assert g.record["timings_s"]["decode"] > 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_compiled_blocks_on_cuda_follow_eager(dit, mode):
    """reduce-overhead and max-autotune run the blocks under CUDA graphs: the cache must still hold
    each chunk's own keys (cloned out of the graph pool), so later chunks match eager too."""
    model = copy.deepcopy(dit).cuda()
    compiled = copy.deepcopy(model)
    torch._dynamo.reset()
    compile_blocks(compiled, mode)
    assert compiled.cudagraphs == (mode != "default")

    eager_run, compiled_run = _rollout(model, device="cuda"), _rollout(compiled, device="cuda")
    for _ in range(5):
        a, b = eager_run.step(), compiled_run.step()
        assert (a.latents - b.latents).abs().max() < 1e-3
    compile_blocks(compiled, "none")


@pytest.mark.gpu
@needs_cuda
def test_bf16_attention_over_the_cache_buffer_runs_on_the_flash_kernel(dit):
    """SDPA over the [past slots | current chunk] buffer views must be flash-eligible in bf16
    (last dim contiguous, head dim 128): forcing the flash backend must not raise."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = copy.deepcopy(dit).cuda().to(torch.bfloat16)
    run = _rollout(model, "field", device="cuda")
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        for _ in range(3):
            assert torch.isfinite(run.step().latents).all()


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "lingbot-tiny"])
def test_a_failing_torch_compile_is_a_one_line_error(tmp_path, preset):
    """No working C++ compiler (a fresh Inductor cache, so nothing compiled earlier is reused):
    `generate --compile` stops at chunk 0 with one line naming --compile and exit code 5, on both
    backbones (the one chunk loop's DiT call: LingBot's rollout had no such translation before)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parent.parent
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    cmd = [sys.executable, "-m", "worldtrace_cli", "generate", str(root / "trajectories" / "aba.yaml"), "--preset",
           preset, "--image", str(root / "assets" / "images" / "mg2_universal_0000.png"), "--chunks", "2",
           "--compile", "default", "-o", str(tmp_path / "run"), "--no-progress"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("worldtrace: error:")]
    assert result.returncode == 5 and len(errors) == 1, result.stderr
    assert "chunk 0: --compile default failed" in errors[0] and "Traceback" not in result.stderr


def test_fp8_weight_storage_keeps_loopworld_close_and_refuses_compile(tmp_path):
    """--weights-dtype fp8 (issue 45 part 3): the DiT's Linear weights live in float8 e4m3 between
    calls (diffusers' layerwise casting), computed in the run's dtype; on loopworld the frames change
    (the storage is lossy) but GT-PSNR stays within 0.5 dB of full precision (measured 0.035 dB on
    ABA 16 chunks); with --compile it is refused before anything runs."""
    import json
    from pathlib import Path

    from conftest import invoke, one_line_error, skip_without_ffmpeg

    skip_without_ffmpeg()
    aba = Path(__file__).parent.parent / "trajectories" / "aba.yaml"
    psnr, shas = {}, {}
    for dtype in ("auto", "fp8"):
        res = invoke("generate", aba, "--chunks", 6, "--weights-dtype", dtype, "-o", tmp_path / dtype, "--no-progress")
        assert res.exit_code == 0, res.output
        summary = json.loads((tmp_path / dtype / "summary.json").read_text())
        psnr[dtype] = summary["metrics"]["gt"]["psnr"]
        shas[dtype] = [json.loads(line)["frames_sha256"] for line in (tmp_path / dtype / "chunks.jsonl").read_text().splitlines()]
        assert summary["config"]["weights_dtype"] == dtype
    assert shas["auto"] != shas["fp8"] and abs(psnr["auto"] - psnr["fp8"]) < 0.5, psnr
    line = one_line_error(invoke("generate", aba, "--weights-dtype", "fp8", "--compile", "default", "-o", tmp_path / "c"))
    assert "not measured under torch.compile" in line and not (tmp_path / "c").exists()


def test_store_weights_puts_the_linear_layers_in_float8(dit):
    from worldtrace_cli.model.speed import store_weights

    model = copy.deepcopy(dit)
    assert store_weights(model, "auto", torch.float32) == 0
    stored = store_weights(model, "fp8", torch.float32)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert stored >= linear and model.patch_embedding.weight.dtype == torch.float32  # diffusers skips patch_embed
