"""Wan 2.1 VAE wrapper: shipped configs, seeded init, original-format weights, conditioning
encode (spec §12.2) and streaming decode (spec §14), on the narrow ``tiny`` config."""

import json
import re

import pytest
from conftest import check_seeded_random_init
import torch
from safetensors.torch import save_file

from worldtrace_cli.errors import CheckpointError
from worldtrace_cli.model.vae import (CONDITIONING_ENCODE_LATENT_FRAMES, WAN_LATENT_MEAN, WAN_LATENT_STD,
                                      StreamingDecoder, build_wan_vae, encode_conditioning_latents,
                                      vae_config_dir)

MEAN = torch.tensor(WAN_LATENT_MEAN).view(1, 16, 1, 1, 1)
STD = torch.tensor(WAN_LATENT_STD).view(1, 16, 1, 1, 1)


pytestmark = pytest.mark.usefixtures("one_thread")


# diffusers resnet parameter names -> original Wan names (inside a residual block)
_RES = {"norm1.gamma": "residual.0.gamma", "conv1.weight": "residual.2.weight", "conv1.bias": "residual.2.bias",
        "norm2.gamma": "residual.3.gamma", "conv2.weight": "residual.6.weight", "conv2.bias": "residual.6.bias",
        "conv_shortcut.weight": "shortcut.weight", "conv_shortcut.bias": "shortcut.bias"}


def to_original_key(key: str) -> str:
    """diffusers AutoencoderKLWan name -> name in Wan2.1_VAE.pth (num_res_blocks 2: 4 modules per up level)."""
    if m := re.fullmatch(r"(post_)?quant_conv\.(\w+)", key):
        return f"conv{2 if m.group(1) else 1}.{m.group(2)}"
    if m := re.fullmatch(r"(encoder|decoder)\.conv_in\.(\w+)", key):
        return f"{m.group(1)}.conv1.{m.group(2)}"
    if m := re.fullmatch(r"(encoder|decoder)\.norm_out\.gamma", key):
        return f"{m.group(1)}.head.0.gamma"
    if m := re.fullmatch(r"(encoder|decoder)\.conv_out\.(\w+)", key):
        return f"{m.group(1)}.head.2.{m.group(2)}"
    if m := re.fullmatch(r"(encoder|decoder)\.mid_block\.resnets\.(\d)\.(.+)", key):
        return f"{m.group(1)}.middle.{2 * int(m.group(2))}.{_RES[m.group(3)]}"
    if m := re.fullmatch(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)", key):
        return f"{m.group(1)}.middle.1.{m.group(2)}"
    if m := re.fullmatch(r"encoder\.down_blocks\.(\d+)\.(.+)", key):
        return f"encoder.downsamples.{m.group(1)}.{_RES.get(m.group(2), m.group(2))}"
    if m := re.fullmatch(r"decoder\.up_blocks\.(\d)\.resnets\.(\d)\.(.+)", key):
        return f"decoder.upsamples.{4 * int(m.group(1)) + int(m.group(2))}.{_RES[m.group(3)]}"
    if m := re.fullmatch(r"decoder\.up_blocks\.(\d)\.upsamplers\.0\.(.+)", key):
        return f"decoder.upsamples.{4 * int(m.group(1)) + 3}.{m.group(2)}"
    raise AssertionError(f"unmapped key {key}")


def original_state_dict(vae) -> dict:
    return {to_original_key(k): v.clone() for k, v in vae.state_dict().items()}


@pytest.fixture(scope="module")
def tiny_vae():
    return build_wan_vae("tiny", seed=0)


def test_shipped_configs_match_wan21():
    for variant, base_dim in (("wan2.1", 96), ("tiny", 8)):
        cfg = json.loads((vae_config_dir(variant) / "config.json").read_text())
        assert cfg["_class_name"] == "AutoencoderKLWan"
        arch = (cfg["base_dim"], cfg["z_dim"], cfg["dim_mult"], cfg["num_res_blocks"])
        assert arch == (base_dim, 16, [1, 2, 4, 4], 2)
        assert cfg["temperal_downsample"] == [False, True, True] and cfg["is_residual"] is False
        assert tuple(cfg["latents_mean"]) == WAN_LATENT_MEAN and tuple(cfg["latents_std"]) == WAN_LATENT_STD
    with pytest.raises(ValueError, match="unknown VAE variant"):
        vae_config_dir("wan2.2")


def test_real_config_has_the_194_original_tensors():
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        vae = AutoencoderKLWan.from_config(AutoencoderKLWan.load_config(str(vae_config_dir("wan2.1"))))
    names = {to_original_key(k) for k in vae.state_dict()}
    assert len(names) == 194
    assert sum(v.numel() for v in vae.state_dict().values()) == 126_892_531
    # spot checks of the official layout (spec §14: decoder weights = 'decoder.' + 'conv2')
    assert {"conv2.weight", "decoder.upsamples.3.resample.1.weight", "decoder.upsamples.4.shortcut.weight",
            "decoder.middle.1.to_qkv.weight", "encoder.downsamples.5.time_conv.weight"} <= names
    assert sum(1 for k in names if "decoder." in k or "conv2" in k) == 108


def test_random_init_is_seeded_and_leaves_global_rng_alone():
    check_seeded_random_init(lambda seed: build_wan_vae("tiny", seed=seed))


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_original_format_weights_round_trip(tmp_path, suffix):
    src = build_wan_vae("tiny", seed=3)
    sd = original_state_dict(src)
    path = tmp_path / f"Wan2.1_VAE{suffix}"
    if suffix == ".pth":
        torch.save(sd, path)
    else:
        save_file(sd, str(path))
    state = torch.get_rng_state()
    loaded = build_wan_vae("tiny", path)
    assert torch.equal(torch.get_rng_state(), state)
    ref, got = src.state_dict(), loaded.state_dict()
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())


def test_bf16_weights_load_into_fp32_exactly(tmp_path):
    sd = {k: v.bfloat16() for k, v in original_state_dict(build_wan_vae("tiny", seed=4)).items()}
    save_file(sd, str(tmp_path / "vae.safetensors"))
    loaded = build_wan_vae("tiny", tmp_path / "vae.safetensors")
    back = original_state_dict(loaded)
    assert all(back[k].dtype == torch.float32 and torch.equal(back[k], sd[k].float()) for k in sd)


def _one_line_error(fn, *needles):
    with pytest.raises(CheckpointError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg and all(n in msg for n in needles), msg
    return msg


def test_bad_weight_files_raise_checkpoint_errors(tmp_path):
    missing = tmp_path / "nope.pth"
    _one_line_error(lambda: build_wan_vae("tiny", missing), str(missing), "not found")

    sd = original_state_dict(build_wan_vae("tiny", seed=0))
    good = tmp_path / "good.pth"
    torch.save(sd, good)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    _one_line_error(lambda: build_wan_vae("tiny", truncated), str(truncated), "cannot read")

    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00\x01not a safetensors file" * 10)
    _one_line_error(lambda: build_wan_vae("tiny", garbage), str(garbage))

    lacking = tmp_path / "lacking.safetensors"
    save_file({k: v for k, v in sd.items() if k != "conv2.weight"}, str(lacking))
    _one_line_error(lambda: build_wan_vae("tiny", lacking), str(lacking), "missing", "post_quant_conv.weight")

    extra = tmp_path / "extra.safetensors"
    save_file({**sd, "decoder.extra.weight": torch.zeros(2)}, str(extra))
    _one_line_error(lambda: build_wan_vae("tiny", extra), "unexpected", "decoder.extra.weight")

    # tiny weights into the real-width config: every conv has the wrong shape
    _one_line_error(lambda: build_wan_vae("wan2.1", good), str(good), "wrong shape")


def test_streaming_decode_equals_whole_video_decode(tiny_vae):
    torch.manual_seed(0)
    z = torch.randn(1, 16, 9, 4, 6)
    dec = StreamingDecoder(tiny_vae)
    chunks = [dec.decode_float(z[:, :, :3])]
    # a diffusers decode between chunks (it clears the VAE's own cache) must not disturb ours
    whole = tiny_vae.decode(z * STD + MEAN).sample
    chunks += [dec.decode_float(z[:, :, 3:6]), dec.decode_float(z[:, :, 6:9])]
    assert [c.shape[2] for c in chunks] == [9, 12, 12]
    assert dec.frames_decoded == 33 == whole.shape[2]
    got = torch.cat(chunks, dim=2)
    assert got.shape == (1, 3, 33, 32, 48)
    assert (got - whole).abs().max().item() <= 1e-4
    assert got.abs().max() <= 1.0 and got.std() > 0.01  # clamped, not degenerate

    # diffusers' own decode per chunk restarts every time: the bug the class exists for
    naive = [tiny_vae.decode(z[:, :, i:i + 3] * STD + MEAN).sample.shape[2] for i in (0, 3, 6)]
    assert naive == [9, 9, 9]

    dec.reset()
    assert dec.frames_decoded == 0
    again = dec.decode_float(z[:, :, :3])
    assert again.shape[2] == 9 and torch.equal(again, chunks[0])


def test_decode_to_uint8_truncates_like_mg2(tiny_vae):
    torch.manual_seed(1)
    z = torch.randn(1, 16, 5, 2, 3)
    floats, ints = StreamingDecoder(tiny_vae), StreamingDecoder(tiny_vae)
    for part in (z[:, :, :3], z[:, :, 3:]):
        x = floats.decode_float(part)[0]
        frames = ints.decode(part)
        # MG2: ((x + 1) * 127.5).clip(0, 255).astype(np.uint8), i.e. truncation
        expected = ((x + 1) * 127.5).to(torch.uint8).permute(1, 2, 3, 0)
        assert frames.dtype == torch.uint8 and frames.device.type == "cpu"
        assert frames.shape == (x.shape[1], 16, 24, 3) and torch.equal(frames, expected)
    assert ints.frames_decoded == 9 + 8
    assert StreamingDecoder(tiny_vae).decode(z[:, :, :3].to(torch.bfloat16)).shape == (9, 16, 24, 3)


def test_streaming_decoder_in_another_dtype_keeps_the_vae(tiny_vae):
    torch.manual_seed(2)
    z = torch.randn(1, 16, 4, 2, 3)
    ref = StreamingDecoder(tiny_vae).decode_float(z)
    dec64 = StreamingDecoder(tiny_vae, dtype=torch.float64)
    out = dec64.decode_float(z)
    assert out.dtype == torch.float64 and (out - ref.double()).abs().max() <= 1e-4
    assert all(p.dtype == torch.float32 for p in tiny_vae.parameters())


def test_mkldnn_conv_path_matches_pytorch_default():
    torch.manual_seed(3)
    z = torch.randn(1, 16, 3, 4, 6)
    fast = StreamingDecoder(build_wan_vae("tiny", seed=7)).decode_float(z)
    plain = StreamingDecoder(build_wan_vae("tiny", seed=7, cpu_mkldnn=False)).decode_float(z)
    assert (fast - plain).abs().max() <= 1e-4


def test_the_cpu_rms_norm_is_diffusers_norm_to_float_rounding():
    """The VAE's RMS norms take a sum of squares on the CPU (F.normalize's strided reduction was a third of a
    tiny run): every norm is switched, and each gives diffusers' own result in float32 and bfloat16."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    from worldtrace_cli.model.vae import _CpuRMSNorm

    vae = build_wan_vae("tiny", seed=7)
    assert any(type(m) is _CpuRMSNorm for m in vae.modules())
    assert not any(type(m) is WanRMS_norm for m in vae.modules())
    torch.manual_seed(5)
    for channel_first, shape in ((True, (1, 8, 3, 12, 22)), (False, (1, 40, 8))):
        norm = WanRMS_norm(shape[1 if channel_first else -1], channel_first=channel_first, images=False)
        torch.nn.init.normal_(norm.gamma)
        x = torch.randn(*shape) * 3
        x[..., 0] = 0  # an all-zero vector: the eps floor, not a division by zero
        for dtype in (torch.float32, torch.bfloat16):
            ref = norm.to(dtype)(x.to(dtype))
            norm.__class__ = _CpuRMSNorm
            ours = norm(x.to(dtype))
            norm.__class__ = WanRMS_norm
            assert ours.dtype == ref.dtype and torch.isfinite(ours).all()
            assert (ours.float() - ref.float()).abs().max() <= (1e-5 if dtype == torch.float32 else 2e-2), dtype


def test_conditioning_latents_are_constant_after_the_receptive_field(tiny_vae):
    torch.manual_seed(4)
    image = torch.rand(1, 3, 16, 16) * 2 - 1
    video = torch.zeros(1, 3, 1 + 4 * 39, 16, 16)
    video[:, :, 0] = image
    with torch.no_grad():
        mu = tiny_vae.encode(video).latent_dist.mode()
    full = (mu - MEAN) / STD  # [1, 16, 40, 2, 2]: MG2 encodes the whole horizon
    # The image's influence ends at latent 29 (the encoder's causal receptive field; checked in
    # float64 too): from there every latent is bit-identical, so 31 encoded latents are exact.
    first_constant = 29
    assert all(torch.equal(full[:, :, f], full[:, :, first_constant]) for f in range(first_constant, 40))
    assert not torch.equal(full[:, :, 20], full[:, :, first_constant])
    assert CONDITIONING_ENCODE_LATENT_FRAMES > first_constant

    ours = encode_conditioning_latents(tiny_vae, image, 40)
    assert ours.dtype == torch.float32 and ours.shape == (1, 16, CONDITIONING_ENCODE_LATENT_FRAMES, 2, 2)
    assert torch.allclose(ours, full[:, :, :CONDITIONING_ENCODE_LATENT_FRAMES], atol=1e-6, rtol=0)
    short = encode_conditioning_latents(tiny_vae, image, 5)
    assert short.shape[2] == 5 and torch.allclose(short, full[:, :, :5], atol=1e-6, rtol=0)


def test_encode_rejects_bad_shapes(tiny_vae):
    with pytest.raises(ValueError, match="multiples of 8"):
        encode_conditioning_latents(tiny_vae, torch.zeros(1, 3, 20, 16), 3)
    with pytest.raises(ValueError, match=">= 1"):
        encode_conditioning_latents(tiny_vae, torch.zeros(1, 3, 16, 16), 0)
    with pytest.raises(ValueError, match=r"\[1, 16, F, h, w\]"):
        StreamingDecoder(tiny_vae).decode(torch.zeros(1, 4, 3, 2, 2))
