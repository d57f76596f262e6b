"""Training the embedded world: clips, the codec's normalisation fold, the DiT trainer (loss falls,
resume), the memory test and the bundle export, on small settings of the same code paths."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from worldtrace_cli.config import load_preset
from worldtrace_cli.errors import InputError
from worldtrace_cli.model.sampler import FlowMatchSchedule
from worldtrace_cli.train.common import LoopSettings, learning_rate
from worldtrace_cli.train.data import loop_actions, walk_actions
from worldtrace_cli.trajectory import chunk_rows
from worldtrace_cli.world.motion import frame_poses


@pytest.fixture(scope="module")
def vae_file(tmp_path_factory, one_thread):
    """A loopworld VAE trained for 2 steps (weights barely moved: the tests need its file, not its skill)."""
    from worldtrace_cli.train.vae import train_vae

    folder = tmp_path_factory.mktemp("vae")
    result = train_vae(folder, LoopSettings(steps=2, warmup=1, log_every=1, save_every=1), height=48, width=96,
                       progress=False)
    return folder / "vae.safetensors", result


@pytest.fixture(scope="module")
def data(tmp_path_factory, vae_file):
    from worldtrace_cli.train.dataset import ClipMix, encode_clips

    folder = tmp_path_factory.mktemp("data")
    encode_clips(folder, vae_file[0], shards=2, mix=ClipMix(late=0.5, loop=1.0), height=48, width=96,
                 progress=False, shard_clips=2)
    return folder


def test_loop_clips_return_exactly():
    rng = np.random.default_rng(0)
    for rows, start, end in ((33, 9, 32), (45, 21, 44)):
        for _ in range(20):
            keyboard, mouse, ret = loop_actions(rng, rows, start, end)
            poses = frame_poses("universal", torch.tensor(keyboard), torch.tensor(mouse))
            assert ret == end and torch.allclose(poses[end], poses[start], atol=1e-9)
            assert (poses[start + 1:end, 2] - poses[start, 2]).abs().max() >= 29.0  # it looked away
    assert chunk_rows(1)[0] == 9 and chunk_rows(2)[1] - 1 == 32  # early clips: P opens chunk 1, returns at the end
    keyboard, mouse = walk_actions(rng, 50)
    assert keyboard.shape == (50, 4) and mouse.shape == (50, 2) and not (keyboard[:, 0] * keyboard[:, 1]).any()
    with pytest.raises(ValueError):
        loop_actions(rng, 33, 20, 25)


def test_learning_rate_schedule():
    s = LoopSettings(steps=100, warmup=10, lr=1.0)
    assert learning_rate(0, s) == pytest.approx(0.1) and learning_rate(9, s) == pytest.approx(1.0)
    assert learning_rate(100, s) == pytest.approx(0.1) and 0.1 < learning_rate(50, s) < 1.0


def test_vae_file_and_normalisation_fold(vae_file):
    from worldtrace_cli.model.vae import StreamingDecoder, build_wan_vae, encode_conditioning_latents
    from worldtrace_cli.train.vae import fold_normalisation, rendered_batch

    path, result = vae_file
    assert path.is_file() and result["step"] == 2 and np.isfinite(result["psnr_db"])
    vae = build_wan_vae("loopworld", path)
    x = rendered_batch(np.random.default_rng(1), 2, 5, 48, 96)
    with torch.no_grad():
        mu = vae.encode(x).latent_dist.mode()
        before = vae.decode(mu).sample
        stats = fold_normalisation(vae, mu)
        mu2 = vae.encode(x).latent_dist.mode()
        after = vae.decode(mu2).sample
    from worldtrace_cli.model.vae import _norm_stats

    mean, std = _norm_stats("cpu")
    z = ((mu2 - mean) / std).transpose(0, 1).flatten(1)
    assert torch.allclose(z.mean(1), torch.zeros(16), atol=1e-4)     # normalised latents: zero mean ...
    assert torch.allclose(z.std(1), torch.ones(16), atol=1e-4)       # ... and unit std per channel
    assert torch.allclose(before, after, atol=1e-4)                  # decoding unchanged
    assert len(stats["mean"]) == 16
    # the product's own decode path reads the file too
    decoder = StreamingDecoder(vae)
    assert decoder.decode(((mu2 - mean) / std)[:1])[0].shape == (48, 96, 3)
    image = encode_conditioning_latents(vae, x[:1, :, 0], 3)
    assert image.shape == (1, 16, 3, 6, 12)


def test_encoded_clips(data, vae_file):
    from worldtrace_cli.train.dataset import LATE_START, ClipMix, encode_clips, read_shard, shard_paths

    clips = [c for p in shard_paths(data) for c in read_shard(p)]
    assert len(clips) == 4 and (data / "late_conditioning.safetensors").is_file()
    for c in clips:
        assert c.latents.shape == (16, 9, 6, 12) and c.return_latent == 8
        assert c.frame_start in (0, LATE_START) and c.clip_tokens.shape == (257, 64)
        kb, ms = c.action_rows()
        assert kb.shape[1] >= 4 * (c.frame_start + 8)  # every row the clip's latent frames read
        assert (c.image_latents is None) == (c.frame_start == LATE_START)
        # the stored rows are aligned with the latents: the loop's first pose (first pixel frame of the
        # clip's second chunk, absolute 4(a+3)-3) comes back at its last pixel frame (absolute 4(a+8))
        poses = frame_poses("universal", c.keyboard, c.mouse)
        first, last = 4 * (c.frame_start + 3) - 3 - c.rows_start, 4 * (c.frame_start + 8) - c.rows_start
        assert torch.allclose(poses[first], poses[last], atol=1e-9)
        assert (poses[first:last, 2] - poses[first, 2]).abs().max() >= 29.0
    with pytest.raises(InputError, match="other settings"):
        encode_clips(data, vae_file[0], 2, mix=ClipMix(late=0.1), height=48, width=96, progress=False, shard_clips=2)


def test_encode_binds_a_folder_only_once_it_holds_shards(tmp_path, vae_file):
    """A VAE file that fails to load leaves nothing behind, no folder and no data.json (a rerun with the
    right file is not refused as "other settings"); a data.json without shards takes the new settings."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    from worldtrace_cli.errors import CheckpointError
    from worldtrace_cli.train.dataset import LATE_CONDITIONING_FILE, ClipMix, encode_clips, shard_paths

    data = tmp_path / "data"
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="cannot read weights"):
        encode_clips(data, bad, 1, mix=ClipMix(late=0.5, loop=1.0), height=48, width=96, progress=False,
                     shard_clips=1)
    assert not data.exists()  # nothing made: no empty folder left behind
    data.mkdir()
    (data / "data.json").write_text(json.dumps({"seed": 99}))  # left by an older run that wrote no shard
    # ... with that run's late conditioning (another VAE or frame size): made anew for the new settings
    save_file({"latents": torch.zeros(1, 16, 1, 2, 2)}, str(data / LATE_CONDITIONING_FILE))
    encode_clips(data, vae_file[0], 1, mix=ClipMix(late=0.5, loop=1.0), height=48, width=96, progress=False,
                 shard_clips=1)
    assert len(shard_paths(data)) == 1 and json.loads((data / "data.json").read_text())["seed"] == 0
    assert load_file(str(data / LATE_CONDITIONING_FILE))["latents"].shape[-2:] == (48 // 8, 96 // 8)


def test_vae_decoder_only_keeps_the_latents(tmp_path, vae_file, one_thread):
    """--decoder-only: the encoder (and quant_conv) of --init come out bit-identical, the decoder
    trained; without --init it is refused."""
    from safetensors.torch import load_file

    from worldtrace_cli.train.vae import train_vae

    settings = LoopSettings(steps=2, warmup=1, log_every=1, save_every=1, lr=1e-2)
    result = train_vae(tmp_path / "dec", settings, height=48, width=96, progress=False, init=vae_file[0],
                       decoder_only=True)
    before, after = load_file(vae_file[0]), load_file(result["file"])
    assert before.keys() == after.keys() and result["latent_stats"] is None
    encoder = [k for k in before if k.startswith(("encoder.", "quant_conv."))]
    decoder = [k for k in before if k.startswith(("decoder.", "post_quant_conv."))]
    assert encoder and decoder and len(encoder) + len(decoder) == len(before)
    assert all(torch.equal(before[k], after[k]) for k in encoder)
    assert sum(not torch.equal(before[k], after[k]) for k in decoder) > len(decoder) // 2
    with pytest.raises(InputError, match="--init"):
        train_vae(tmp_path / "bad", settings, height=48, width=96, progress=False, decoder_only=True)


def test_loops_that_return_anywhere(data, vae_file):
    """--vary-return: a loop comes back at a random latent frame from 5 on, to a pose of an earlier
    chunk (after looking away), and walks on; a data folder written before the option continues."""
    from worldtrace_cli.train.dataset import ClipMix, encode_clips, make_clip, make_encoder

    vae, tower = make_encoder(vae_file[0], 2, 48, 96)
    rng = np.random.default_rng(3)
    returns = set()
    for i in range(8):
        c = make_clip(rng, vae, tower, late=i % 2 == 1, loop=True, vary_return=True)
        j = c.return_latent
        assert 5 <= j <= 8 and c.latents.shape[1] == 9
        returns.add(j)
        poses = frame_poses("universal", c.keyboard, c.mouse)
        last = 4 * (c.frame_start + j) - c.rows_start              # the return latent's last pixel frame
        first_of_chunk = 4 * (c.frame_start + 3 * (j // 3)) - 3 - c.rows_start
        earlier = [k for k in range(first_of_chunk) if torch.allclose(poses[k], poses[last], atol=1e-9)
                   and (poses[k:last, 2] - poses[k, 2]).abs().max() >= 29.0]
        assert earlier, f"clip {i}: the return pose is not a pose of an earlier chunk"
    assert len(returns) >= 3   # the place of the return varies
    info = data / "data.json"
    settings = json.loads(info.read_text())
    del settings["mix"]["vary_return"]
    info.write_text(json.dumps(settings))
    encode_clips(data, vae_file[0], shards=2, mix=ClipMix(late=0.5, loop=1.0), height=48, width=96,
                 progress=False, shard_clips=2)
    assert json.loads(info.read_text())["mix"]["vary_return"] is False


def _tiny_preset():
    return load_preset("tiny")  # the DiT of the golden fixtures: 2 layers, fast


def test_dit_training_lowers_the_loss_and_resumes(tmp_path, data, one_thread):
    from safetensors.torch import load_file

    from worldtrace_cli.train.dit import build_dit, train_dit
    from worldtrace_cli.train.objective import ClipPool, clip_loss

    preset, pool = _tiny_preset(), ClipPool(data)
    schedule = FlowMatchSchedule()

    def fixed_loss(dit):
        with torch.no_grad():
            return float(np.mean([clip_loss(dit, clip, pool.late_cond, np.random.default_rng(i), schedule, 1.0, 1.0)
                                  for i, clip in enumerate(pool.clips)]))

    before = fixed_loss(build_dit(preset, 0))
    folder = tmp_path / "dit"
    s = LoopSettings(steps=24, warmup=2, lr=2e-3, log_every=4, save_every=8)
    train_dit(folder, data, preset, s, batch=2, progress=False)
    dit = build_dit(preset, 0)
    dit.load_state_dict(load_file(str(folder / "dit.safetensors")))
    assert fixed_loss(dit) < 0.9 * before
    log = [json.loads(line) for line in (folder / "loss.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [4, 8, 12, 16, 20, 24]
    # a longer budget continues from the saved step; other settings are refused
    from dataclasses import replace

    result = train_dit(folder, data, preset, replace(s, steps=28), batch=2, progress=False)
    log = [json.loads(line) for line in (folder / "loss.jsonl").read_text().splitlines()]
    assert result["step"] == 28 and [r["step"] for r in log][-2:] == [24, 28]
    with pytest.raises(InputError, match="other settings"):
        train_dit(folder, data, preset, s, batch=3, progress=False)
    # a folder written before presets had an `architecture` key and before `start_share` and
    # `self_context` and `ema` existed is the same run (mg2, the default share, clean context, no average implied); a nested difference is named by its dotted key
    settings = json.loads((folder / "settings.json").read_text())
    del settings["preset"]["architecture"], settings["start_share"], settings["self_context"], settings["ema"]
    del settings["batched"], settings["context_noise"]
    (folder / "settings.json").write_text(json.dumps(settings))
    assert train_dit(folder, data, preset, replace(s, steps=28), batch=2, progress=False)["step"] == 28
    settings["preset"]["dit"]["dim"] += 1
    (folder / "settings.json").write_text(json.dumps(settings))
    with pytest.raises(InputError, match=r"other settings \(preset.dit.dim\)"):
        train_dit(folder, data, preset, replace(s, steps=28), batch=2, progress=False)


def test_batched_clips_give_each_clips_own_loss(data, one_thread):
    """A ClipBatch runs B clips through the context passes (their own caches and action rows) and the
    target chunk in one DiT call per chunk: every clip's loss is the loss it has alone, on every target
    chunk, early and late clips alike; clips at other latent frames are not stacked."""
    from worldtrace_cli.train.dit import build_dit
    from worldtrace_cli.train.objective import ClipBatch, ClipPool, context_state, target_losses

    preset, pool = _tiny_preset(), ClipPool(data)
    dit = build_dit(preset, 3)
    groups = {}
    for c in pool.clips:
        groups.setdefault(c.frame_start, []).append(c)
    largest = max(groups.values(), key=len)
    assert len(largest) >= 2 and len(groups) == 2  # the fixture holds early and late clips
    gen = torch.Generator().manual_seed(0)
    for target in (0, 1, 2):
        batch = ClipBatch.of(largest)
        eps = torch.randn(len(batch), *largest[0].latents[:, :3].shape, generator=gen)
        sigmas = [0.3 + 0.2 * i for i in range(len(batch))]
        together = target_losses(dit, batch, pool.late_cond, target, *context_state(dit, batch, pool.late_cond, target),
                                 sigmas, eps, 3.0)
        alone = torch.cat([target_losses(dit, ClipBatch.of(c), pool.late_cond, target,
                                         *context_state(dit, c, pool.late_cond, target), [sigmas[i]], eps[i:i + 1], 3.0)
                           for i, c in enumerate(largest)])
        assert together.shape == (len(batch),) and torch.allclose(together, alone, rtol=1e-5, atol=1e-6)
        assert together.std() > 0  # different clips, different losses
    with pytest.raises(ValueError, match="same latent frames"):
        ClipBatch.of([groups[0][0], groups[max(groups)][0]])


def test_batched_training_lowers_the_loss(tmp_path, data, one_thread):
    """`train dit --batched`: the grouped steps (with self-generated context on half the clips) lower
    the loss as the clip-at-a-time steps do; the setting is part of the run (a folder trained one way
    is not continued the other way)."""
    from safetensors.torch import load_file

    from worldtrace_cli.train.dit import build_dit, train_dit
    from worldtrace_cli.train.objective import ClipPool, clip_loss

    preset, pool = _tiny_preset(), ClipPool(data)

    def fixed_loss(dit):
        with torch.no_grad():
            return float(np.mean([clip_loss(dit, clip, pool.late_cond, np.random.default_rng(i), FlowMatchSchedule(),
                                            1.0, 1.0) for i, clip in enumerate(pool.clips)]))

    before = fixed_loss(build_dit(preset, 0))
    folder = tmp_path / "batched"
    s = LoopSettings(steps=24, warmup=2, lr=2e-3, log_every=4, save_every=8)
    result = train_dit(folder, data, preset, s, batch=4, progress=False, batched=True, self_context=0.5,
                       context_noise=0.3)  # batches whose clips read their context at their own noise levels
    settings = json.loads((folder / "settings.json").read_text())
    assert result["step"] == 24 and settings["batched"] is True and settings["context_noise"] == 0.3
    dit = build_dit(preset, 0)
    dit.load_state_dict(load_file(str(folder / "dit.safetensors")))
    assert fixed_loss(dit) < 0.9 * before
    with pytest.raises(InputError, match=r"other settings \(batched\)"):
        train_dit(folder, data, preset, s, batch=4, progress=False, self_context=0.5, context_noise=0.3)
    with pytest.raises(InputError, match=r"other settings \(context_noise\)"):
        train_dit(folder, data, preset, s, batch=4, progress=False, batched=True, self_context=0.5, context_noise=0.1)


def test_dit_training_device_option(tmp_path, data):
    """`train dit --device cuda` without a CUDA device is a one-line error, not a traceback."""
    from click.testing import CliRunner

    from worldtrace_cli.cli import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU test below covers --device cuda")
    r = CliRunner().invoke(main, ["train", "dit", "--data", str(data), "-o", str(tmp_path / "d"), "--preset", "tiny",
                                  "--steps", "1", "--device", "cuda", "--no-progress"])
    assert r.exit_code != 0 and "no CUDA device" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["train", "dit", "--data", str(data), "-o", str(tmp_path / "t"), "--preset", "tiny",
                                  "--steps", "1", "--precision", "tf32", "--no-progress"])
    assert r.exit_code == 2 and "--precision tf32 needs a CUDA device" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "t").exists()


def test_a_run_shorter_than_its_log_window_reports_its_loss(tmp_path, data):
    """`train dit` stopped (--minutes) before its first --log-every window: the closing line gives the
    mean loss of the steps it ran, as a number (it once said "loss None"), its clips per second and
    the pool's size; result.json counts this run's steps apart from a continued run's."""
    import re

    from click.testing import CliRunner

    from worldtrace_cli.cli import main

    r = CliRunner().invoke(main, ["train", "dit", "--data", str(data), "-o", str(tmp_path / "d"), "--preset", "tiny",
                                  "--steps", "50", "--minutes", "0.003", "--log-every", "25", "--batch", "2",
                                  "--no-progress"])
    assert r.exit_code == 0, r.output
    m = re.search(r"DiT step ([1-9]\d*) \(\d+\.\d min this run, (\d+\.\d) clips/s, 4 clips in the pool\), "
                  r"loss (\d+\.\d{4}) ->", r.output)
    assert m and float(m.group(3)) > 0, r.output
    result = json.loads((tmp_path / "d" / "result.json").read_text())
    assert result["steps_this_run"] == result["step"] == int(m.group(1)) and result["pool_clips"] == 4
    assert result["clips_per_second"] == pytest.approx(2 * result["step"] / (60 * result["minutes"]), rel=1e-2)
    r = CliRunner().invoke(main, ["train", "dit", "--data", str(data), "-o", str(tmp_path / "d"), "--preset", "tiny",
                                  "--steps", "50", "--minutes", "0.003", "--log-every", "25", "--batch", "2",
                                  "--no-progress"])
    again = json.loads((tmp_path / "d" / "result.json").read_text())  # continued: only this run's steps count
    assert r.exit_code == 0 and again["step"] == result["step"] + again["steps_this_run"] > result["step"], r.output


@pytest.mark.gpu
def test_dit_training_on_cuda_matches_cpu(tmp_path, data):
    """The trainer on CUDA: the same numpy noise stream and clips give the CPU's first losses (float32,
    TF32 off) and a CPU-loadable weights file; the moving average stays on the CPU."""
    from safetensors.torch import load_file

    from worldtrace_cli.train.dit import train_dit

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    s = LoopSettings(steps=2, warmup=1, lr=1e-3, log_every=1, save_every=2, ema=0.9)
    losses = {}
    for device in ("cpu", "cuda"):
        r = train_dit(tmp_path / device, data, _tiny_preset(), s, batch=2, progress=False, device=device,
                      self_context=0.5)   # the model's own samples as context too (the sampler on the device)
        assert r["device"] == device
        losses[device] = [json.loads(line)["loss"] for line in (tmp_path / device / "loss.jsonl").read_text().splitlines()]
        weights = load_file(str(tmp_path / device / "dit.safetensors"))
        assert all(v.device.type == "cpu" and torch.isfinite(v).all() for v in weights.values())
    assert losses["cuda"][0] == pytest.approx(losses["cpu"][0], rel=1e-3)
    for device in ("cpu", "cuda"):  # the batched path (what a GPU run uses) too
        train_dit(tmp_path / f"b-{device}", data, _tiny_preset(), s, batch=4, progress=False, device=device,
                  batched=True, self_context=0.5)
        losses[device] = [json.loads(line)["loss"] for line in (tmp_path / f"b-{device}" / "loss.jsonl").read_text().splitlines()]
    assert losses["cuda"][0] == pytest.approx(losses["cpu"][0], rel=1e-3)


@pytest.mark.gpu
def test_clips_encoded_on_cuda_match_the_cpu(tmp_path, vae_file):
    """`train encode --device cuda`: the same clips (rendered on the CPU) as on the CPU, to float
    tolerance, written as CPU tensors."""
    from worldtrace_cli.train.dataset import ClipMix, encode_clips, read_shard, shard_paths

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    clips = {}
    for name, device, workers in (("cpu", "cpu", 0), ("cuda", "cuda", 0), ("cuda-workers", "cuda", 2)):
        encode_clips(tmp_path / name, vae_file[0], shards=1, mix=ClipMix(late=0.5, loop=1.0), height=48, width=96,
                     progress=False, shard_clips=4, device=device, workers=workers)
        clips[name] = read_shard(shard_paths(tmp_path / name)[0])
    for name in ("cuda", "cuda-workers"):  # --workers: a shard per VAE call on the GPU (train encode --workers)
        for a, b in zip(clips["cpu"], clips[name]):
            assert a.world_seed == b.world_seed and b.latents.device.type == "cpu"
            assert torch.allclose(a.latents, b.latents, atol=2e-2)
            assert torch.allclose(a.clip_tokens, b.clip_tokens, atol=2e-2)


def test_target_chunk_shares():
    """choose_target: the shipped draws at the default share; --start-share moves chunk 0's share of
    rollout-start clips, never of late clips (which hold no chunk 0)."""
    from worldtrace_cli.train.objective import START_SHARE, choose_target

    old, new = np.random.default_rng(5), np.random.default_rng(5)
    assert [choose_target(new, True) for _ in range(20)] == [int(old.choice([0, 1, 2, 2, 2, 2])) for _ in range(20)]

    def share(early, start_share):
        rng = np.random.default_rng(0)
        return np.mean([choose_target(rng, early, start_share) == 0 for _ in range(3000)])

    assert abs(share(True, START_SHARE) - 1 / 6) < 0.03 and abs(share(True, 0.5) - 0.5) < 0.03
    assert share(True, 1.0) == 1.0 and share(True, 0.0) == 0.0 and share(False, 1.0) == 0.0


def test_self_generated_context(data, one_thread):
    """--self-context: the last ``generated`` context chunks are the model's own samples (the product's
    sampler), committed like any chunk at the same positions, drawn from the trainer's stream; at 0
    no random draw is taken (older runs keep their streams)."""
    from worldtrace_cli.train.dit import build_dit
    from worldtrace_cli.train.objective import ClipPool, clip_loss, context_state, self_generated_chunks

    dit, pool = build_dit(_tiny_preset(), 0).eval(), ClipPool(data)
    schedule = FlowMatchSchedule()
    clip = pool.clips[0]

    def cache(generated, seed=0):
        _, writer, _ = context_state(dit, clip, pool.late_cond, 2, generated=generated, schedule=schedule,
                                     rng=np.random.default_rng(seed))
        writer.begin_chunk(clip.frame_start + 6)
        return writer.read(0)  # (k, v, positions) of layer 0: the 3 latent frames of chunk 1

    k_clean, _, pos_clean = cache(0)
    k_gen, _, pos_gen = cache(1)
    assert torch.equal(pos_clean, pos_gen) and k_clean.shape == k_gen.shape
    assert not torch.allclose(k_clean, k_gen, atol=1e-3)
    assert torch.equal(cache(1, seed=3)[0], cache(1, seed=3)[0])  # the trainer's stream decides the draws
    assert not torch.equal(cache(1, seed=3)[0], cache(1, seed=4)[0])
    # how many: all context chunks of a rollout-start clip, all but chunk 0 of a late one; none at 0
    rng = np.random.default_rng(0)
    assert [self_generated_chunks(rng, True, t, 1.0) for t in (0, 1, 2)] == [0, 1, 2]
    assert [self_generated_chunks(rng, False, t, 1.0) for t in (1, 2)] == [0, 1]
    state = np.random.default_rng(1)
    before = state.bit_generator.state
    assert self_generated_chunks(state, True, 2, 0.0) == 0 and state.bit_generator.state == before


def test_context_noise(data, one_thread):
    """--context-noise: each clip's context passes read its latents noised to its own sigma (the noise
    from the trainer's stream) at timestep 1000 sigma; sigma 0 is the clean pass and takes no draw."""
    from worldtrace_cli.model.sampler import add_noise
    from worldtrace_cli.train.dit import build_dit
    from worldtrace_cli.train.objective import ClipBatch, ClipPool, context_sigma, context_state

    from dataclasses import replace

    dit, pool = build_dit(_tiny_preset(), 0).eval(), ClipPool(data)
    batch = ClipBatch.of(pool.clips[:1])

    def cache(sigmas, latents=None, seed=0):
        b = batch if latents is None else ClipBatch.of([replace(batch.clips[0], latents=latents[0])])
        seen = []
        rng = np.random.default_rng(seed)
        _, writer, _ = context_state(dit, b, pool.late_cond, 2, rng=rng, context_sigmas=sigmas,
                                     observe=lambda c, x0: seen.append(x0.clone()))
        writer.begin_chunk(b.frame_start + 6)
        return writer.read(0)[0], seen, rng

    k_clean, seen_clean, rng = cache(None)
    k_zero, _, rng_zero = cache([0.0])
    assert torch.equal(k_clean, k_zero) and rng_zero.bit_generator.state == rng.bit_generator.state
    k_noisy, seen, _ = cache([0.3])
    z = batch.latents  # chunk 0's context pass takes the stream's first draw
    eps = torch.from_numpy(np.random.default_rng(0).standard_normal(tuple(seen[0].shape)).astype(np.float32))
    assert torch.allclose(seen[0], add_noise(z[:, :, :3], eps, 0.3), atol=1e-6)
    assert not torch.allclose(k_noisy, k_clean, atol=1e-3)
    # the level reaches the DiT as the timestep: the same noised latents read at timestep 0 commit other keys
    noised = z.clone()
    noised[:, :, :6] = torch.cat(seen, dim=2)
    k_t0, _, _ = cache(None, latents=noised)
    assert not torch.allclose(k_noisy, k_t0, atol=1e-4)
    assert torch.equal(cache([0.3], seed=5)[0], cache([0.3], seed=5)[0])
    # the draw: U(0, max), none at 0 (older runs keep their streams)
    rng = np.random.default_rng(1)
    levels = [context_sigma(rng, 0.5) for _ in range(500)]
    assert 0 <= min(levels) < 0.05 and 0.45 < max(levels) < 0.5
    before = rng.bit_generator.state
    assert context_sigma(rng, 0.0) == 0.0 and rng.bit_generator.state == before


def _other_encoder(vae_path, dest):
    """A copy of the VAE file whose encoder's weights are scaled by 1.1: other latents."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(vae_path))
    save_file({k: v * 1.1 if k.startswith("encoder.") and v.is_floating_point() else v for k, v in weights.items()},
              str(dest))
    return dest


def test_drift_test_free_vs_teacher_forced(data, vae_file, one_thread, tmp_path_factory):
    """The drift test: a free rollout reads the model's own chunks, a teacher-forced one the true
    chunks; the observe hook sees exactly what is committed; held-out walks are encoded once."""
    from worldtrace_cli.train.dit import build_dit
    from worldtrace_cli.train.objective import ClipPool, context_state
    from worldtrace_cli.train.evaluate import ROLLOUT_FILE, heldout_rollout_clips, rollout_drift

    walks = heldout_rollout_clips(data, vae_file[0], 2, chunks=3, height=48, width=96)
    assert len(walks) == 2 and walks[0].latents.shape[:2] == (16, 9) and walks[0].frame_start == 0
    assert walks[0].return_latent == -1 and walks[0].image_latents.shape[1] == 9
    again = heldout_rollout_clips(data, vae_file[0], 1, chunks=3, height=48, width=96)  # read back, not re-encoded
    assert (data / ROLLOUT_FILE.format(chunks=3)).exists() and torch.equal(again[0].latents, walks[0].latents)
    other = _other_encoder(vae_file[0], tmp_path_factory.mktemp("other-vae") / "vae.safetensors")
    moved = heldout_rollout_clips(data, other, 1, chunks=3, height=48, width=96)  # another VAE: encoded again
    assert not torch.equal(moved[0].latents, walks[0].latents)
    assert torch.equal(moved[0].keyboard, walks[0].keyboard)  # the same held-out walk, other latents
    back = heldout_rollout_clips(data, vae_file[0], 1, chunks=3, height=48, width=96)
    assert torch.equal(back[0].latents, walks[0].latents)  # and back to the first VAE's latents

    dit, late_cond, schedule = build_dit(_tiny_preset(), 0).eval(), ClipPool(data).late_cond, FlowMatchSchedule()
    seen = {}
    context_state(dit, walks[0], late_cond, 3, observe=lambda c, x0: seen.__setitem__(c, x0))
    assert all(torch.equal(seen[c], walks[0].latents[None, :, 3 * c:3 * c + 3]) for c in range(3))  # clean context
    out = rollout_drift(dit, walks, late_cond, schedule)
    assert out["clips"] == 2 and out["chunks"] == 3 and len(out["free"]) == len(out["teacher"]) == 3
    assert all(v > 0 for v in out["free"] + out["teacher"])
    assert out["free"][1:] != out["teacher"][1:]  # the free rollout read other context than the truth
    assert out["free_mean"] == pytest.approx(np.mean(out["free"][1:]), abs=1e-3)
    kept = rollout_drift(dit, walks, late_cond, schedule, keep=1)
    assert kept.pop("latents") and kept == out  # seeded; keeping latents changes no score
    one = rollout_drift(dit, walks[:1], late_cond, schedule, keep=1)
    truth, teacher, free = one["latents"][0]
    assert torch.equal(truth, walks[0].latents[None].float()) and teacher.shape == free.shape == truth.shape
    for c in range(3):  # the kept latents are the scored ones
        for kind, z in (("free", free), ("teacher", teacher)):
            mse = float((z[:, :, 3 * c:3 * c + 3] - truth[:, :, 3 * c:3 * c + 3]).pow(2).mean())
            assert one[kind][c] == pytest.approx(mse, abs=1e-4)
    # the action test: borrowing identical actions changes nothing; another walk's actions change the loss
    from worldtrace_cli.train.evaluate import action_effect

    same = action_effect(dit, [walks[0], walks[0]], late_cond, sigmas=(1.0,))
    assert same["gap"] == 0.0 and same["own"] > 0
    mixed = action_effect(dit, walks, late_cond, sigmas=(1.0,))
    assert mixed["clips"] == 2 and mixed["gap"] != 0.0 and mixed["gap"] == pytest.approx(mixed["other"] - mixed["own"])
    with pytest.raises(ValueError, match="at least 2"):
        action_effect(dit, walks[:1], late_cond)
    from worldtrace_cli.model.vae import build_wan_vae
    from worldtrace_cli.train.evaluate import drift_pictures

    sheet = drift_pictures(build_wan_vae("loopworld", vae_file[0]), [(truth, teacher, free)])
    assert sheet.size[1] == 14 + 3 * 48 and sheet.size[0] > 3 * 96  # 3 rows of 48 px, 3 chunk columns + labels


def test_dit_training_starts_from_init_weights(tmp_path, data, one_thread):
    """--init warm-starts a run (a new folder, e.g. with another --start-share) from earlier weights;
    a file of another model is a one-line CheckpointError."""
    from safetensors.torch import load_file, save_file

    from worldtrace_cli.errors import CheckpointError
    from worldtrace_cli.train.dit import build_dit, train_dit

    preset = _tiny_preset()
    start = build_dit(preset, 7)
    save_file({k: v.contiguous() for k, v in start.state_dict().items()}, str(tmp_path / "start.safetensors"))
    s = LoopSettings(steps=1, warmup=1, lr=1e-9, log_every=1, save_every=1)
    train_dit(tmp_path / "a", data, preset, s, batch=1, progress=False, start_share=1.0,
              init=tmp_path / "start.safetensors", self_context=1.0)
    got = load_file(str(tmp_path / "a" / "dit.safetensors"))
    assert all(torch.allclose(got[k], v, atol=1e-6) for k, v in start.state_dict().items())  # lr 1e-9: barely moved
    settings = json.loads((tmp_path / "a" / "settings.json").read_text())
    assert settings["start_share"] == 1.0 and settings["self_context"] == 1.0
    save_file({"patch_embedding.weight": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(CheckpointError, match="other.safetensors: not preset"):
        train_dit(tmp_path / "b", data, preset, s, batch=1, progress=False, init=tmp_path / "other.safetensors")


def test_weight_average(tmp_path, data, one_thread):
    """--ema: the moving average follows Polyak's rule with its warm-up, is saved with the state and
    continued on resume, and is written beside the weights; folders made before it existed continue."""
    from safetensors.torch import load_file

    from worldtrace_cli.train.common import WeightAverage
    from worldtrace_cli.train.dit import DIT_EMA_FILE, DIT_FILE, train_dit

    lin = torch.nn.Linear(2, 2)
    start = lin.weight.detach().clone()
    avg = WeightAverage(lin, 0.99)
    with torch.no_grad():
        lin.weight.add_(1.0)
    avg.update(lin)  # d_0 = min(0.99, 1/10)
    assert torch.allclose(avg.params["weight"], 0.1 * start + 0.9 * (start + 1.0))
    again = WeightAverage(lin, 0.99)
    again.load_state_dict(avg.state_dict())
    assert again.updates == 1 and torch.equal(again.params["weight"], avg.params["weight"])
    with pytest.raises(ValueError, match="decay"):
        WeightAverage(lin, 1.0)

    preset, folder = _tiny_preset(), tmp_path / "ema"
    s = LoopSettings(steps=2, warmup=1, lr=1e-3, log_every=1, save_every=1, ema=0.9)
    train_dit(folder, data, preset, s, batch=1, progress=False)
    raw, ema = load_file(str(folder / DIT_FILE)), load_file(str(folder / DIT_EMA_FILE))
    assert raw.keys() == ema.keys() and any(not torch.equal(raw[k], ema[k]) for k in raw)
    state = torch.load(folder / "train_state.pt", weights_only=True)
    assert int(state["ema"]["updates"]) == 2
    from dataclasses import replace

    train_dit(folder, data, preset, replace(s, steps=3), batch=1, progress=False)
    assert int(torch.load(folder / "train_state.pt", weights_only=True)["ema"]["updates"]) == 3
    with pytest.raises(InputError, match=r"other settings \(ema\)"):
        train_dit(folder, data, preset, replace(s, steps=3, ema=0.5), batch=1, progress=False)


def test_memory_test_and_bundle(tmp_path, data, vae_file, one_thread):
    from safetensors.torch import save_file

    from worldtrace_cli.model.checkpoint import load_world_model
    from worldtrace_cli.train.dataset import read_shard, shard_paths
    from worldtrace_cli.train.dit import build_dit, export_bundle
    from worldtrace_cli.train.objective import ClipPool
    from worldtrace_cli.train.evaluate import memory_effect

    preset = _tiny_preset()
    dit = build_dit(preset, 0)
    pool = ClipPool(data)
    clips = [c for p in shard_paths(data) for c in read_shard(p)][:2]
    out = memory_effect(dit, clips, pool.late_cond, FlowMatchSchedule())
    assert out["clips"] == 2 and all(np.isfinite(out[k]) for k in ("full", "removed", "wrong"))
    assert out["gap_removed"] == pytest.approx(out["removed"] - out["full"])
    # a bundle of the trained parts loads through the preset loader like the shipped one
    save_file({k: v.contiguous() for k, v in dit.state_dict().items()}, str(tmp_path / "dit.safetensors"))
    info = export_bundle(tmp_path / "dit.safetensors", vae_file[0], tmp_path / "bundle.safetensors")
    assert info["parameters"]["dit"] == sum(p.numel() for p in dit.parameters())
    from dataclasses import replace

    bundled = replace(preset, weights="bundled", bundle=str(tmp_path / "bundle.safetensors"), vae="loopworld",
                      height=48, width=96)
    world = load_world_model(bundled, None, False, 0, torch.device("cpu"), torch.float32)
    for k, v in dit.state_dict().items():
        assert torch.allclose(world.dit.state_dict()[k], v.half().float()), k
    assert world.files[0]["role"] == "bundle"
    from safetensors import safe_open

    with safe_open(str(tmp_path / "bundle.safetensors"), "pt") as fh:  # sources by name and hash, no machine path
        meta = fh.metadata()
    assert meta["dit"].startswith(f"{tmp_path.name}/dit.safetensors sha256:") and str(tmp_path) not in meta["vae"]


def test_an_int8_bundle_loads_back_to_the_dit_within_half_a_step(tmp_path, vae_file, one_thread):
    """`train export --dit-format int8`: the DiT's matrices in int8 with a scale per output row, the
    rest float16; the preset loader reads it back as floats within half a quantisation step of the
    trained weights, and the file is smaller than the float16 bundle. A bundle missing a scale is
    refused in one line naming the tensor."""
    from dataclasses import replace

    from click.testing import CliRunner
    from safetensors.torch import load_file, save_file

    from worldtrace_cli.cli import main
    from worldtrace_cli.errors import CheckpointError
    from worldtrace_cli.model.checkpoint import load_world_model
    from worldtrace_cli.model.weights import INT8_SCALE_SUFFIX
    from worldtrace_cli.train.dit import build_dit

    preset = _tiny_preset()
    dit = build_dit(preset, 0)
    save_file({k: v.contiguous() for k, v in dit.state_dict().items()}, str(tmp_path / "dit.safetensors"))
    sizes = {}
    for fmt in ("float16", "int8"):
        r = CliRunner().invoke(main, ["train", "export", "--dit", str(tmp_path / "dit.safetensors"), "--vae",
                                      str(vae_file[0]), "--dit-format", fmt, "-o", str(tmp_path / f"{fmt}.safetensors")])
        assert r.exit_code == 0 and f"DiT in {fmt}" in r.output, r.output
        sizes[fmt] = (tmp_path / f"{fmt}.safetensors").stat().st_size
    stored = load_file(str(tmp_path / "int8.safetensors"))
    quantized = [k for k, v in stored.items() if v.dtype == torch.int8]
    assert quantized and all(k + INT8_SCALE_SUFFIX in stored for k in quantized)
    assert sizes["int8"] < 0.75 * sizes["float16"], sizes
    bundled = replace(preset, weights="bundled", bundle=str(tmp_path / "int8.safetensors"), vae="loopworld",
                      height=48, width=96)
    world = load_world_model(bundled, None, False, 0, torch.device("cpu"), torch.float32)
    for k, v in dit.state_dict().items():
        got = world.dit.state_dict()[k]
        if f"dit.{k}" in quantized:
            step = stored[f"dit.{k}{INT8_SCALE_SUFFIX}"].reshape(-1, *([1] * (v.ndim - 1)))
            assert torch.all((got - v).abs() <= step / 2 + 1e-7), k
            assert not torch.equal(got, v.half().float()), k  # really stored as int8
        else:
            assert torch.equal(got, v.half().float()), k
    del stored[quantized[0] + INT8_SCALE_SUFFIX]
    save_file(stored, str(tmp_path / "broken.safetensors"))
    with pytest.raises(CheckpointError, match=f"int8 tensor '{quantized[0]}' has no"):
        load_world_model(replace(bundled, bundle=str(tmp_path / "broken.safetensors")), None, False, 0,
                         torch.device("cpu"), torch.float32)


def test_int8_storage_keeps_zero_rows_and_refuses_stray_scales():
    """quantize_int8 / dequantize_int8 on their own: an all-zero row (a grown block's zeroed output)
    comes back zero, small tensors stay float16, and a scale without its tensor or of the wrong
    length is refused naming the key."""
    from worldtrace_cli.errors import CheckpointError
    from worldtrace_cli.model.weights import INT8_SCALE_SUFFIX, dequantize_int8, quantize_int8

    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=g)
    w[3] = 0
    sd = {"w": w, "bias": torch.randn(64, generator=g), "small": torch.randn(8, 8, generator=g)}
    q = quantize_int8(sd)
    assert q["w"].dtype == torch.int8 and q["bias"].dtype == q["small"].dtype == torch.float16
    back = dequantize_int8(q, "mem")
    assert set(back) == set(sd) and torch.equal(back["w"][3], torch.zeros(128))
    assert (back["w"] - w).abs().max() <= w.abs().max() / 254 + 1e-7
    assert dequantize_int8(sd, "mem") is sd  # no int8 inside: untouched
    with pytest.raises(CheckpointError, match="scales no tensor"):
        dequantize_int8({"x" + INT8_SCALE_SUFFIX: torch.ones(2)}, "mem")
    with pytest.raises(CheckpointError, match="not one float per row"):
        dequantize_int8({"w": q["w"], "w" + INT8_SCALE_SUFFIX: torch.ones(3)}, "mem")


def test_eval_of_a_bare_weights_folder(tmp_path, vae_file, one_thread):
    """`train eval` of a folder holding only dit.safetensors (weights trained elsewhere, e.g. on a GPU):
    without --preset a one-line error; with it the tests run, the held-out clips and the late
    conditioning (computed from --vae) cached in the folder."""
    from click.testing import CliRunner
    from safetensors.torch import save_file

    from worldtrace_cli.cli import main
    from worldtrace_cli.train.dit import build_dit

    folder = tmp_path / "weights"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in build_dit(_tiny_preset(), 0).state_dict().items()},
              str(folder / "dit.safetensors"))
    args = ["train", "eval", str(folder), "--vae", str(vae_file[0]), "--clips", "2", "--rollouts", "2",
            "--rollout-chunks", "2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code != 0 and "pass --preset" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, args + ["--preset", "tiny"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(folder / "eval.json")  # one scriptable line; the results in the file
    out = json.loads((folder / "eval.json").read_text())
    assert out["clips"] == 2 and np.isfinite(out["full"]) and len(out["drift"]["free"]) == 2
    assert (folder / "late_conditioning.safetensors").is_file() and (folder / "heldout.safetensors").is_file()


@pytest.mark.gpu
@pytest.mark.slow
def test_compiled_training_on_cuda_gives_the_eager_losses(tmp_path, data):
    """`train dit --compile default --batched` on CUDA: the blocks' pure parts compiled with symbolic
    batch sizes (a step's groups change size every step) train to the eager losses. (On the CPU the
    same comparison passed once, 2026-11-26, but compiling took 7.7 minutes: too slow for CI.)"""
    from worldtrace_cli.train.dit import train_dit

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    s = LoopSettings(steps=3, warmup=1, lr=1e-3, log_every=1, save_every=3)
    losses = {}
    for mode in ("none", "default"):
        train_dit(tmp_path / mode, data, _tiny_preset(), s, batch=4, progress=False, batched=True, device="cuda",
                  compile_mode=mode)
        losses[mode] = [json.loads(line)["loss"] for line in (tmp_path / mode / "loss.jsonl").read_text().splitlines()]
    assert len(losses["default"]) == 3
    assert losses["default"] == pytest.approx(losses["none"], rel=1e-4)


def test_training_refuses_a_compile_mode_with_cuda_graphs(tmp_path, data):
    from worldtrace_cli.train.dit import train_dit

    s = LoopSettings(steps=1, warmup=1, lr=1e-3, log_every=1, save_every=1)
    with pytest.raises(ValueError, match="none or default"):
        train_dit(tmp_path / "x", data, _tiny_preset(), s, batch=1, progress=False, compile_mode="reduce-overhead")
    assert not (tmp_path / "x").exists()


def test_mixed_precision_training_follows_float32(tmp_path, data, one_thread):
    """`train dit --precision bf16`: the forward passes run under bfloat16 autocast (the losses move by
    bfloat16 rounding, not more), the weights file and its moving average stay float32; the precision is
    not a run setting (a float32 run continues in bf16) and is recorded in result.json. `--precision
    tf32` is refused on a CPU before a folder is made, and TF32 flags are restored after a run."""
    from dataclasses import replace

    from safetensors.torch import load_file

    from worldtrace_cli.train.dit import train_dit

    s = LoopSettings(steps=3, warmup=1, lr=1e-3, log_every=1, save_every=3, ema=0.9)
    losses = {}
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # (False, True): PyTorch's defaults
    for precision in ("float32", "bf16"):
        r = train_dit(tmp_path / precision, data, _tiny_preset(), s, batch=4, progress=False, batched=True,
                      precision=precision)
        assert r["precision"] == precision and r["step"] == 3
        losses[precision] = [json.loads(line)["loss"] for line in (tmp_path / precision / "loss.jsonl").read_text().splitlines()]
        for name in ("dit.safetensors", "dit-ema.safetensors"):
            assert {v.dtype for v in load_file(str(tmp_path / precision / name)).values()} == {torch.float32}
    # the same draws: the first losses differ by bfloat16 rounding only (autocast is on: not identical)
    assert losses["bf16"][0] != losses["float32"][0]
    assert losses["bf16"][0] == pytest.approx(losses["float32"][0], rel=5e-2)
    assert train_dit(tmp_path / "float32", data, _tiny_preset(), replace(s, steps=4), batch=4, progress=False,
                     batched=True, precision="bf16")["step"] == 4
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved  # runs restore them
    with pytest.raises(InputError, match="tf32 needs a CUDA device"):
        train_dit(tmp_path / "t", data, _tiny_preset(), s, batch=1, progress=False, precision="tf32")
    assert not (tmp_path / "t").exists()
    with pytest.raises(ValueError, match="precision must be one of"):
        train_dit(tmp_path / "t", data, _tiny_preset(), s, batch=1, progress=False, precision="fp8")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved


def test_tf32_setting_is_scoped():
    """tf32_allowed sets both CUDA TF32 switches inside its block and restores them after, errors included."""
    from worldtrace_cli.model.speed import tf32_allowed

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    for allowed in (True, False):
        with pytest.raises(RuntimeError):
            with tf32_allowed(allowed):
                assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (allowed, allowed)
                raise RuntimeError("inside")
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved


@pytest.mark.gpu
def test_faster_training_precisions_on_cuda_follow_float32(tmp_path, data):
    """On CUDA, `--precision tf32` and `bf16` give the float32 first losses to their rounding (the
    same clips and numpy noise), and their weights files load as float32."""
    from safetensors.torch import load_file

    from worldtrace_cli.train.dit import train_dit

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    s = LoopSettings(steps=2, warmup=1, lr=1e-3, log_every=1, save_every=2)
    losses = {}
    for precision in ("float32", "tf32", "bf16"):
        r = train_dit(tmp_path / precision, data, _tiny_preset(), s, batch=4, progress=False, batched=True,
                      device="cuda", precision=precision)
        assert r["precision"] == precision
        losses[precision] = [json.loads(line)["loss"] for line in (tmp_path / precision / "loss.jsonl").read_text().splitlines()]
        assert {v.dtype for v in load_file(str(tmp_path / precision / "dit.safetensors")).values()} == {torch.float32}
    assert losses["tf32"][0] == pytest.approx(losses["float32"][0], rel=1e-2)
    assert losses["bf16"][0] == pytest.approx(losses["float32"][0], rel=5e-2)


def test_training_refuses_a_folder_that_train_encode_did_not_make(tmp_path, data):
    """A missing folder, one without the late-conditioning latents, one without shards: one line
    each (InputError, exit 2 from the CLI), before the run folder is made."""
    import shutil

    from click.testing import CliRunner

    from worldtrace_cli.cli import main
    from worldtrace_cli.errors import InputError
    from worldtrace_cli.train.dit import train_dit

    s = LoopSettings(steps=1, warmup=1, lr=1e-3, log_every=1, save_every=1)
    no_shards = tmp_path / "no-shards"
    no_shards.mkdir()
    shutil.copy(data / "late_conditioning.safetensors", no_shards)
    (tmp_path / "empty").mkdir()
    for folder, message in [(tmp_path / "nosuch", "no such folder"),
                            (tmp_path / "empty", "no late_conditioning.safetensors"),
                            (no_shards, "no encoded clips yet")]:
        with pytest.raises(InputError, match=message):
            train_dit(tmp_path / "x", folder, _tiny_preset(), s, batch=1, progress=False)
        assert not (tmp_path / "x").exists()
    result = CliRunner().invoke(main, ["train", "dit", "--data", str(tmp_path / "empty"), "-o", str(tmp_path / "x")])
    assert result.exit_code == 2 and "not a data folder of worldtrace train encode" in result.output
    assert not (tmp_path / "x").exists()


def test_loss_curves_compares_runs_at_equal_steps(tmp_path, capsys):
    """benchmarks/loss_curves.py: each run's loss at every --every-th step is the mean of the last
    --window logged values there; a step one run never logged is blank; the PNG is written; a bad
    argument or a missing log is a one-line exit."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import loss_curves

    logs = {}
    for name, losses in (("a", [4.0, 2.0, 1.0, 3.0]), ("b", [5.0, 1.0])):
        logs[name] = tmp_path / f"{name}.jsonl"
        logs[name].write_text("".join(json.dumps({"step": 10 * (i + 1), "loss": v, "seconds": 60.0 * (i + 1)}) + "\n"
                                      for i, v in enumerate(losses)))
    png = tmp_path / "c.png"
    loss_curves.main([f"a={logs['a']}", f"b={logs['b']}", "--every", "20", "--window", "2", "-o", str(png)])
    out = capsys.readouterr().out
    assert "| 20 | 3.000 | 3.000 |" in out and "| 40 | 2.000 |  |" in out and "| minutes | 4.0 | 2.0 |" in out
    assert png.stat().st_size > 1000
    with pytest.raises(SystemExit, match="expected LABEL=PATH"):
        loss_curves.main([str(logs["a"])])
    with pytest.raises(SystemExit, match="no such loss log"):
        loss_curves.main([f"x={tmp_path / 'none.jsonl'}"])


def test_identification_curve_orders_checkpoints_and_refuses_other_truths(tmp_path, capsys):
    """benchmarks/identification_curve.py (issue 47's curve): checkpoints are listed by clips seen
    (8k parsed), each mode's numbers as judged, the baseline under them, the codec and control once;
    a checkpoint judged on other worlds or another world style (its codec row differs), a missing
    file and a malformed argument are one-line exits; the PNG is written."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import identification_curve as ic

    def result(name, free, tf, codec=23.13, worlds=(40, 41)):
        rows = {"free": free, "teacher-forced": tf, "codec": (codec, 1.0, 1.0), "control": (15.5, 0.5, 0.45)}
        summary = {m: {"chunks": 16, "gt_psnr": v[0], "gt_detail": 0.5, "identified": v[1],
                       "identified_structure": v[2]} for m, v in rows.items()}
        (tmp_path / name).mkdir()
        (tmp_path / name / "where-it-fails.json").write_text(json.dumps(
            {"preset": name, "trajectory": "look_around", "worlds": list(worlds), "decoys": list(range(100, 116)),
             "seed": 0, "summary": summary, "per_world": {}}))
        return tmp_path / name

    late, early = result("late", (15.0, 0.5, 0.25), (16.0, 0.75, 0.5)), result("early", (14.0, 0.125, 0.0625), (15.0, 0.25, 0.125))
    shipped = result("shipped", (14.7, 0.29, 0.12), (16.2, 0.64, 0.56))
    png = tmp_path / "curve.png"
    ic.main([f"8k={late}", f"400={early}", "--baseline", f"shipped={shipped}", "-o", str(png)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:7] == ["| 400 | free | 14.00 | 0.50 | 12 % | 6 % |", "| 400 | teacher-forced | 15.00 | 0.50 | 25 % | 12 % |",
                          "| 8,000 | free | 15.00 | 0.50 | 50 % | 25 % |", "| 8,000 | teacher-forced | 16.00 | 0.50 | 75 % | 50 % |",
                          "| shipped | free | 14.70 | 0.50 | 29 % | 12 % |"]
    assert lines[-2:] == ["| (no DiT) | codec | 23.13 | 0.50 | 100 % | 100 % |", "| (no DiT) | control | 15.50 | 0.50 | 50 % | 45 % |"]
    assert png.stat().st_size > 5000
    with pytest.raises(SystemExit, match="another codec row"):
        ic.main([f"1={late}", f"2={result('city', (15.0, 0.5, 0.25), (16.0, 0.75, 0.5), codec=20.16)}"])
    with pytest.raises(SystemExit, match="another worlds"):
        ic.main([f"1={late}", f"2={result('other', (15.0, 0.5, 0.25), (16.0, 0.75, 0.5), worlds=(0, 1))}"])
    with pytest.raises(SystemExit, match="expected CLIPS=PATH"):
        ic.main([f"many={late}"])
    with pytest.raises(SystemExit, match="no such where_it_fails result"):
        ic.main([f"1={tmp_path / 'none'}"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a where_it_fails.py result"):
        ic.main([f"1={tmp_path / 'bad.json'}"])


def test_gpu_weights_split_into_parts_that_come_back_and_join(tmp_path):
    """benchmarks/gpu/weights.py: a float16 copy over --max-mib is written as parts of whole tensors,
    each within the limit; joined (in any order) they equal the float16 copy; integer tensors keep
    their dtype; missing output folders are made; an incomplete set or a tensor over the limit is a
    one-line exit."""
    import sys
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks" / "gpu"))
    import weights

    src = tmp_path / "dit.safetensors"
    tensors = {f"blocks.{i}.w": torch.randn(256, 256) for i in range(6)} | {"step": torch.tensor([7])}
    save_file(tensors, str(src))
    small = weights.half(src, tmp_path / "new" / "one.safetensors", max_mib=1.0)  # its folder is made
    assert [p.name for p in small] == ["one.safetensors"] and small[0].is_file()
    parts = weights.half(src, tmp_path / "dit-fp16.safetensors", max_mib=0.3)  # 128 KiB per tensor: 2 per part
    assert [p.name for p in parts] == [f"dit-fp16-part{i}-of-3.safetensors" for i in range(1, 4)]
    assert all(p.stat().st_size <= 0.3 * 2**20 + 4096 for p in parts)
    weights.join(list(reversed(parts)), tmp_path / "out" / "joined.safetensors")
    joined = load_file(str(tmp_path / "out" / "joined.safetensors"))
    assert joined.keys() == tensors.keys() and joined["step"].dtype == torch.int64
    assert all(torch.equal(joined[k], tensors[k].half()) for k in tensors if k != "step")
    with pytest.raises(SystemExit, match="not one complete set"):
        weights.join(parts[:2], tmp_path / "x.safetensors")
    with pytest.raises(SystemExit, match="over --max-mib"):
        weights.half(src, tmp_path / "y.safetensors", max_mib=0.1)


def test_log_every_step_and_step_times(tmp_path, data, one_thread):
    """`train dit --log-every 1` writes one loss-log line per step with its clock; a continued run may
    log at another cadence (same run, not 'other settings'); benchmarks/gpu/step_times.py turns the
    log into the first step's seconds and the seconds per step after it; a broken line is a one-line
    exit naming file:line."""
    import json
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from worldtrace_cli.cli import main

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks" / "gpu"))
    import step_times

    out = tmp_path / "d"
    args = ["train", "dit", "--data", str(data), "-o", str(out), "--preset", "tiny", "--batch", "1", "--no-progress"]
    r = CliRunner().invoke(main, args + ["--steps", "3", "--log-every", "1"])
    assert r.exit_code == 0, r.output
    log = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3] and log[0]["seconds"] < log[1]["seconds"] < log[2]["seconds"]
    r = CliRunner().invoke(main, args + ["--steps", "5", "--log-every", "2"])  # continued, logged every 2 steps
    assert r.exit_code == 0, r.output
    assert [json.loads(line)["step"] for line in (out / "loss.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert "| loss | 5 |" in step_times.table([out / "loss.jsonl"])
    (tmp_path / "hand.jsonl").write_text("\n".join(json.dumps({"step": a, "seconds": t}) for a, t in
                                                   [(1, 5.0), (2, 6.0), (3, 7.5), (4, 2.0), (6, 4.0)]))
    summary = step_times.summarise(step_times.read_log(tmp_path / "hand.jsonl"))  # clock restarts at step 4
    assert summary == {"steps": 6, "first_s": 5.0, "mean_s": 4.5 / 4, "median_s": 1.0}
    (tmp_path / "bad.jsonl").write_text('{"step": 1, "seconds": 0.5}\n{"loss": 2}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:2: not a loss-log line"):
        step_times.read_log(tmp_path / "bad.jsonl")


def _deeper(preset, layers: int, action_blocks):
    from dataclasses import replace

    return replace(preset, name=f"{preset.name}-d{layers}",
                   dit=replace(preset.dit, num_layers=layers,
                               action_config=replace(preset.dit.action_config, blocks=tuple(action_blocks))))


def test_grown_dit_computes_what_it_grew_from_and_then_learns(tmp_path, data, one_thread):
    """`train grow`: a 2-block DiT grown to 5 blocks (old blocks at 0 and 2, new blocks copying the one
    before them with zeroed residual outputs; one new block with an action module its source lacks) gives
    the same training losses on the same draws, through the cache and action module; one backward pass
    reaches the new blocks' zeroed projections; `train dit --init` takes the file."""
    from safetensors.torch import load_file, save_file

    from worldtrace_cli.model.dit import CausalWanDiT
    from worldtrace_cli.train.dit import build_dit, train_dit
    from worldtrace_cli.train.objective import ClipPool, clip_loss
    from worldtrace_cli.train.grow import block_sources, grow_dit

    assert block_sources(2, 5) == [(0, False), (0, True), (1, False), (1, True), (1, True)]
    assert block_sources(4, 8) == [(0, False), (0, True), (1, False), (1, True), (2, False), (2, True), (3, False), (3, True)]
    small = _deeper(load_preset("tiny"), 2, [0])            # action module on block 0 only
    big = _deeper(small, 5, [0, 1, 2, 3])     # block 2 (old block 1) gains one; block 3 copies old 1 and gains one
    src = build_dit(small, 3)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(tmp_path / "small.safetensors"))
    r = grow_dit(small, big, tmp_path / "grown.safetensors", tmp_path / "small.safetensors", seed=1)
    assert [is_new for _, is_new in r["blocks"]] == [False, True, False, True, True]
    grown = CausalWanDiT(big.dit)
    grown.load_state_dict(load_file(str(tmp_path / "grown.safetensors")))
    assert torch.equal(grown.blocks[2].self_attn.q.weight, src.blocks[1].self_attn.q.weight)
    assert grown.blocks[1].self_attn.o.weight.abs().sum() == 0 and grown.blocks[1].self_attn.q.weight.abs().sum() > 0

    pool, schedule = ClipPool(data), FlowMatchSchedule()
    for i, clip in enumerate(pool.clips[:4]):
        with torch.no_grad():
            a = clip_loss(src, clip, pool.late_cond, np.random.default_rng(i), schedule, 1.0, 1.0)
            b = clip_loss(grown, clip, pool.late_cond, np.random.default_rng(i), schedule, 1.0, 1.0)
        assert float(b) == pytest.approx(float(a), rel=1e-5, abs=1e-7)
    clip_loss(grown, pool.clips[0], pool.late_cond, np.random.default_rng(0), schedule, 1.0, 1.0).backward()
    for block in (1, 3, 4):
        assert grown.blocks[block].self_attn.o.weight.grad.abs().sum() > 0
        assert grown.blocks[block].ffn[2].weight.grad.abs().sum() > 0
    s = LoopSettings(steps=2, warmup=1, lr=1e-3, log_every=1, save_every=2)
    assert train_dit(tmp_path / "run", data, big, s, batch=2, progress=False, init=tmp_path / "grown.safetensors")["step"] == 2
    from worldtrace_cli.errors import CheckpointError  # a DiT of another preset than --from: one line, nothing written

    with pytest.raises(CheckpointError, match="preset tiny-d2's DiT.*does not match"):
        grow_dit(small, big, tmp_path / "again.safetensors", tmp_path / "grown.safetensors")
    assert not (tmp_path / "again.safetensors").exists()


def test_growth_refuses_what_is_not_adding_blocks(tmp_path):
    from dataclasses import replace

    from worldtrace_cli.train.dit import build_dit
    from worldtrace_cli.train.grow import grow_state_dict

    small = _deeper(load_preset("tiny"), 2, [0, 1])
    state = build_dit(small, 0).state_dict()
    cases = [(replace(small, dit=replace(small.dit, ffn_dim=small.dit.ffn_dim * 2)), "differ in ffn_dim"),
             (_deeper(small, 1, [0]), "only adds blocks: 2 -> 1"),
             (_deeper(small, 3, [0]), "drop old block 1's action module")]
    for big, message in cases:
        with pytest.raises(InputError, match=message):
            grow_state_dict(state, small.dit, big.dit, build_dit(big, 0).state_dict())


def test_towers_clips_are_rendered_in_the_towers_world(tmp_path, vae_file):
    """train encode --world towers (issue 47): the data folder records the style, and a clip's frames
    are the towers world's (not the city's of the same seed)."""
    from worldtrace_cli.train.dataset import ClipMix, encode_clips, make_clip, make_encoder
    from worldtrace_cli.train.evaluate import data_world

    folder = tmp_path / "towers"
    encode_clips(folder, vae_file[0], shards=1, mix=ClipMix(late=0.0, loop=1.0, world="towers"), height=48, width=96,
                 progress=False, shard_clips=1)
    assert json.loads((folder / "data.json").read_text())["mix"]["world"] == "towers"
    assert data_world(folder) == "towers"
    vae, tower = make_encoder(vae_file[0], 2, 48, 96)
    city, towers = (make_clip(np.random.default_rng(5), vae, tower, late=False, loop=True, world=w)
                    for w in ("procedural", "towers"))
    assert city.world_seed == towers.world_seed and not torch.equal(city.latents, towers.latents)


def _same_clips(a, b, atol=0.0):
    """Two lists of EncodedClip hold the same clips (tensors equal to ``atol``, metadata equal)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.frame_start, x.rows_start, x.return_latent, x.world_seed) == \
               (y.frame_start, y.rows_start, y.return_latent, y.world_seed)
        assert torch.equal(x.keyboard, y.keyboard) and torch.equal(x.mouse, y.mouse)
        assert (x.image_latents is None) == (y.image_latents is None)
        pairs = [(x.latents, y.latents), (x.clip_tokens, y.clip_tokens)]
        pairs += [(x.image_latents, y.image_latents)] if x.image_latents is not None else []
        for s, t in pairs:
            assert s.shape == t.shape and (s - t).abs().max().item() <= atol


def test_render_workers_write_the_clips_of_the_serial_path(tmp_path, vae_file, data):
    """train encode --workers: shards rendered in worker processes and encoded here hold the clips that
    rendering and encoding clip by clip writes (bit for bit on the CPU, where a VAE call takes one
    clip), and a rerun with another worker count continues from the shards there."""
    from worldtrace_cli.train.dataset import ClipMix, encode_clips, read_shard, shard_paths

    folder = tmp_path / "workers"
    kw = dict(mix=ClipMix(late=0.5, loop=1.0), height=48, width=96, progress=False, shard_clips=2)
    encode_clips(folder, vae_file[0], shards=1, workers=2, **kw)
    assert len(shard_paths(folder)) == 1
    encode_clips(folder, vae_file[0], shards=2, workers=1, **kw)
    serial, parallel = shard_paths(data), shard_paths(folder)
    assert [p.name for p in serial] == [p.name for p in parallel]
    for s, p in zip(serial, parallel):
        _same_clips(read_shard(s), read_shard(p))
    kinds = {c.frame_start for p in parallel for c in read_shard(p)}
    assert kinds == {0, 30}, kinds  # both an early and a late clip went through the workers


def test_batched_encoding_is_clip_by_clip_encoding(vae_file):
    """encode_rendered with several clips per VAE call (what a GPU encoder does) gives the clip-by-clip
    latents, conditioning latents and CLIP tokens up to float rounding, in the order given."""
    from worldtrace_cli.train.dataset import encode_rendered, make_encoder
    from worldtrace_cli.train.rendering import render_clip_frames

    vae, tower = make_encoder(vae_file[0], 2, 48, 96)
    rng = np.random.default_rng(3)
    rendered = [render_clip_frames(rng, late, loop, 48, 96) for late, loop in
                ((False, True), (True, True), (False, False), (True, False), (False, True))]
    one = encode_rendered(vae, tower, rendered, max_batch=1)
    _same_clips(one, encode_rendered(vae, tower, rendered, max_batch=4), atol=1e-4)
    assert [c.frame_start for c in one] == [0, 30, 0, 30, 0] and one[1].image_latents is None
    assert one[0].latents.shape[1] == 9 and one[1].latents.shape[1] == 9


def test_stopping_render_workers_keeps_the_finished_shards(tmp_path, vae_file):
    """A stop while workers render (Ctrl-C: train encode's stop flag) raises Interrupted naming the shards
    kept, leaves only whole shards, and leaves no worker process behind."""
    import multiprocessing

    from worldtrace_cli.errors import Interrupted
    from worldtrace_cli.train.dataset import ClipMix, encode_clips, shard_paths

    folder = tmp_path / "stopped"
    with pytest.raises(Interrupted, match="stopped with 1 shards"):
        encode_clips(folder, vae_file[0], shards=6, mix=ClipMix(late=0.5, loop=1.0), height=48, width=96,
                     progress=False, shard_clips=2, workers=2, stop=lambda: len(shard_paths(folder)) >= 1)
    assert [p.name for p in folder.iterdir() if p.name.startswith("clips-")] == ["clips-00000.safetensors"]
    assert not multiprocessing.active_children()


def _children_of(pid: int) -> list[int]:
    """PIDs of the live (not zombie) DataLoader workers (named ``pt_data_worker``) whose parent is
    ``pid`` (Linux /proc)."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().split(" (", 1)[1].rsplit(")", 1)
            fields = rest.split()
            if name == "pt_data_worker" and fields[0] != "Z" and int(fields[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_train_encode_workers_end_with_their_process(tmp_path, vae_file):
    """`train encode --workers`, tried as a user would stop it: Ctrl-C (to the terminal's process group)
    ends it with the one-line stop message and exit 130, no traceback from a worker; killed outright,
    its workers end within seconds instead of waiting on their queue for ever."""
    import os
    import signal
    import subprocess
    import sys
    import time

    procs = []

    def start(out):
        proc = subprocess.Popen([sys.executable, "-m", "worldtrace_cli", "train", "encode", "--vae", str(vae_file[0]),
                                 "-o", str(out), "--shards", "50", "--workers", "1", "--no-progress"],
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
        procs.append(proc)
        deadline = time.time() + 120
        while time.time() < deadline and not _children_of(proc.pid):
            time.sleep(0.2)
        workers = _children_of(proc.pid)
        assert workers, "no render worker started"
        time.sleep(2)
        return proc, workers

    try:
        proc, _ = start(tmp_path / "a")
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "worldtrace: stopped: encoding stopped with" in err, err[-2000:]
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]

        proc, workers = start(tmp_path / "b")
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.time() + 20
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.2)
        alive = [w for w in workers if _alive(w)]
        assert not alive, f"render workers {alive} outlived their killed process"
    finally:
        for proc in procs:  # a failed check leaves no process group behind
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_clip_draws_are_those_of_the_data_folders_already_made():
    """The draws of a shard (late?, loop?, world, start pose, actions, return) are pinned to what
    `train encode` drew before rendering and encoding were split (2026-11-28, checked against the
    old make_clip): data folders made before and after hold the same kinds of clips, and a folder
    continued across the change goes on with the same stream. Only numpy's PCG64 draws and IEEE
    arithmetic (no rendering, no VAE), so no machine's float libraries change the digest; a numpy
    that changed Generator's streams would (and would change every data folder's clips too)."""
    import hashlib

    from worldtrace_cli.train.rendering import render_shard_clips

    digest = hashlib.sha256()
    for r in render_shard_clips(0, 0, 6, 48, 96, 0.5, 0.5, 90.0, True, "towers"):
        digest.update(np.array([r.world_seed, r.return_latent, r.rows_start, r.frame_start], np.int64).tobytes())
        digest.update(np.asarray(r.keyboard, np.float32).tobytes())
        digest.update(np.asarray(r.mouse, np.float32).tobytes())
    assert digest.hexdigest() == "89b01266817b0ad9fe9cfed0784819dc95afce574f52b86ddc66181d35fbad1b"
