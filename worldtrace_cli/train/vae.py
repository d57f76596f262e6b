"""Train the loopworld codec: diffusers' ``AutoencoderKLWan`` (config ``loopworld``) on rendered clips.

Why train it: a random-weight VAE's latents do not separate views (loopworld-measurements.md: the
return view correlates 0.73 with the first visit, a different view 0.75), so memory cannot be
measured through it. Each step encodes and decodes a batch of 9-frame clips (1 + 4 x 2 pixel frames,
so both the causal first frame and a regular 4-frame group are trained) of random walks in random
worlds, cropped to a random latent-aligned window (the networks are convolutional, so crops train
the same weights 4x cheaper); some steps use single frames instead, which are nine times
cheaper and teach the spatial codec (two steps in five; the others train the 4-frame groups), with loss ``L1 + 0.2 (1 - SSIM)`` on the posterior mean plus a little noise (:data:`LATENT_NOISE`).

At the end the latent normalisation is folded into the weights (:func:`fold_normalisation`): the
product normalises every VAE's latents with Wan 2.1's fixed per-channel mean/std
(:data:`~worldtrace_cli.model.vae.WAN_LATENT_MEAN`), so the trained encoder's output is mapped
affinely so that the normalised latents of rendered clips have zero mean and unit std per channel,
and the decoder's first 1x1x1 convolution gets the inverse map. Encode/decode results are
unchanged except for that scale; the DiT then sees unit-variance latents like MG2's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..model.vae import WAN_LATENT_MEAN, WAN_LATENT_STD, build_wan_vae
from .common import LoopSettings, prepare_folder, run_loop, save_safetensors_atomic, settings_dict
from .data import random_start_pose, render_clip, walk_actions

VAE_FILE = "vae.safetensors"
CLIP_FRAMES = 9          # 1 + 4 x 2 pixel frames -> 3 latent frames
CROP = (48, 88)          # training crop in pixels (multiples of 8)
LATENT_NOISE = 0.05      # std of the noise added to the codes, relative to their std
CLIP_STEP_SHARE = 0.6    # share of steps on clips (the rest on single frames)
IMAGE_BATCH = 8          # frames per single-frame step
VAE_WORLDS = 4096        # training draws its worlds from this many seeds (cached, so rendering is cheap)


def rendered_batch(rng: np.random.Generator, batch: int, frames: int, height: int, width: int,
                   crop: tuple[int, int] | None = None) -> torch.Tensor:
    """``batch`` random-walk clips of ``frames`` pixel frames in random worlds (of :data:`VAE_WORLDS`), as float32
    [B, 3, T, h, w] in [-1, 1] (cropped at a random multiple-of-8 offset when ``crop`` is given)."""
    out = []
    for _ in range(batch):
        keyboard, mouse = walk_actions(rng, frames)
        clip = render_clip(int(rng.integers(VAE_WORLDS)), keyboard, mouse, height, width, random_start_pose(rng))
        x = torch.from_numpy(clip.frames).permute(3, 0, 1, 2).float().div(127.5).sub(1.0)
        if crop is not None:
            y0 = 8 * int(rng.integers(0, (height - crop[0]) // 8 + 1))
            x0 = 8 * int(rng.integers(0, (width - crop[1]) // 8 + 1))
            x = x[:, :, y0:y0 + crop[0], x0:x0 + crop[1]]
        out.append(x)
    return torch.stack(out)


@torch.no_grad()
def fold_normalisation(vae, latents_mu: torch.Tensor) -> dict:
    """Fold a per-channel affine map into ``quant_conv`` (mu half) and ``post_quant_conv`` so that
    ``(mu' - WAN_MEAN) / WAN_STD`` of the encoder equals ``(mu - m) / s`` for the measured data
    statistics m, s of ``latents_mu`` [B, 16, T, h, w] (raw posterior means); decoding is unchanged.

    Returns the measured ``{"mean": [16], "std": [16]}`` (of the raw latents).
    """
    z = latents_mu.transpose(0, 1).flatten(1).double()
    m, s = z.mean(1), z.std(1).clamp_min(1e-6)
    wm = torch.tensor(WAN_LATENT_MEAN, dtype=torch.float64)
    ws = torch.tensor(WAN_LATENT_STD, dtype=torch.float64)
    a, b = ws / s, wm - ws * m / s            # mu' = a * mu + b
    zc = len(WAN_LATENT_MEAN)
    q = vae.quant_conv
    wq = q.weight.double()
    wq[:zc] *= a.view(-1, 1, 1, 1, 1)
    bq = q.bias.double()
    bq[:zc] = a * bq[:zc] + b
    q.weight.copy_(wq.to(q.weight.dtype))
    q.bias.copy_(bq.to(q.bias.dtype))
    p = vae.post_quant_conv               # input channel c reads (mu' - b) / a
    wp = p.weight.double()                # [out, in, 1, 1, 1]
    p.bias.copy_((p.bias.double() - (wp[:, :, 0, 0, 0] * (b / a)).sum(1)).to(p.bias.dtype))
    p.weight.copy_((wp / a.view(1, -1, 1, 1, 1)).to(p.weight.dtype))
    return {"mean": m.tolist(), "std": s.tolist()}


def init_for_training(vae) -> None:
    """Variance-preserving initialisation of a Wan VAE before training (in place).

    Why: with PyTorch's default convolution init each stride-2 convolution shrinks the signal's
    variance about threefold while the biases add constants, so at the narrow loopworld width the
    colour of an image had all but vanished from the latents (measured: the spread of latent values
    across solid colours fell 9x through the encoder) and training learnt greyscale shapes for over
    a thousand steps. Here every convolution is drawn from N(0, 2 / fan_in) (He, for the SiLU
    nonlinearities) with zero bias, and the last convolution of every residual branch and every
    attention projection start at zero, so each block starts as the identity and the signal
    reaches the latent intact (colour after 200 steps instead of never in 1000).
    """
    import math

    from diffusers.models.autoencoders.autoencoder_kl_wan import WanAttentionBlock, WanResidualBlock

    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, (torch.nn.Conv3d, torch.nn.Conv2d)):
                m.weight.normal_(0.0, math.sqrt(2.0 / m.weight[0].numel()))
                if m.bias is not None:
                    m.bias.zero_()
        for m in vae.modules():
            if isinstance(m, WanResidualBlock):
                m.conv2.weight.zero_()
            elif isinstance(m, WanAttentionBlock):
                m.proj.weight.zero_()


def train_vae(folder: Path, s: LoopSettings, batch: int = 4, height: int = 96, width: int = 176,
              progress: bool = True, stop=lambda: False, clip_frames: int = CLIP_FRAMES,
              init: Path | None = None, decoder_only: bool = False) -> dict:
    """Train (or continue training) the loopworld VAE in ``folder``; writes ``folder/vae.safetensors``.

    Args:
        folder: training folder (train_state.pt, loss.jsonl, settings.json, vae.safetensors).
        s: loop settings (steps, minutes, lr, seed, threads).
        batch: clips per step; height, width: render size in pixels (multiples of 8, >= the crop).
        clip_frames: pixel frames per clip (1 + 4k). The causal caches reach back many latent frames,
            so a codec trained on 9-frame clips drifts on long videos (measured: a static scene's
            latents changed by more than their own scale after 5 latent frames, and decoded frames
            fell from 21 to 11 dB PSNR by frame 30); a second stage on 33-frame clips fixes that.
        init: start from these weights (a ``vae.safetensors`` of an earlier stage) instead of the
            variance-preserving initialisation.
        decoder_only: train only the decoder (``decoder`` and ``post_quant_conv``) of ``init``; the
            encoder runs without gradients and the normalisation is not folded again, so its latents
            stay bit-identical: clips already encoded and a DiT trained on them stay valid, and only
            the pictures made from latents change.
    Returns:
        ``{"step", "minutes", "loss", "psnr_db" (held-out full-frame reconstruction), "latent_stats"
        (the folded normalisation; None with ``decoder_only``), "file"}``.
    Raises:
        InputError: the folder holds a run with other settings, or ``decoder_only`` without ``init``.
        Interrupted: stopped by ``stop()`` (state saved; rerun to continue).
    """
    from pytorch_msssim import ssim

    from ..errors import InputError
    if decoder_only and init is None:
        raise InputError("--decoder-only trains the decoder of an existing VAE: give it with --init")
    if clip_frames < 5 or clip_frames % 4 != 1:
        raise ValueError(f"clip_frames must be 1 + 4k with k >= 1, got {clip_frames}")
    prepare_folder(folder, settings_dict(s, kind="vae", batch=batch, height=height, width=width,
                                         crop=list(CROP), clip_frames=clip_frames,
                                         init=None if init is None else str(init),
                                         **({"decoder_only": True} if decoder_only else {})))
    torch.manual_seed(s.seed)
    if init is None:
        vae = build_wan_vae("loopworld", None, seed=s.seed)
        init_for_training(vae)
    else:
        vae = build_wan_vae("loopworld", init)
    vae.requires_grad_(True).train()
    if decoder_only:
        vae.requires_grad_(False)
        vae.decoder.requires_grad_(True)
        vae.post_quant_conv.requires_grad_(True)
    gen = torch.Generator().manual_seed(s.seed)

    def step_fn(step: int, rng: np.random.Generator) -> dict:
        # single frames teach the spatial codec cheaply (a frame costs a ninth of a clip); clips teach
        # the 4-frame groups that every latent frame after the first is made of
        if rng.random() < CLIP_STEP_SHARE:
            x = rendered_batch(rng, batch, clip_frames, height, width, CROP)
        else:
            x = rendered_batch(rng, IMAGE_BATCH, 1, height, width, CROP)
        with torch.set_grad_enabled(not decoder_only):
            mu = vae.encode(x).latent_dist.mode()
        # deterministic codes (a posterior sample with the initial unit variance drowns them early
        # on); a little noise relative to their own scale keeps the decoder robust to the DiT's errors
        z = mu + LATENT_NOISE * mu.detach().std() * torch.randn(mu.shape, generator=gen)
        y = vae.decode(z).sample
        l1 = (y - x).abs().mean()
        b, c, t, h, w = x.shape
        flat = lambda v: ((v.transpose(1, 2).reshape(b * t, c, h, w) + 1) / 2).clamp(0, 1)  # noqa: E731
        dssim = 1 - ssim(flat(y), flat(x), data_range=1.0)
        return {"loss": l1 + 0.2 * dssim, "l1": l1.detach(), "dssim": dssim.detach()}

    result = run_loop(folder, vae, step_fn, s, progress=progress, stop=stop)
    vae.eval().requires_grad_(False)
    rng = np.random.default_rng([s.seed, 2])  # held out: a stream the training never draws from
    with torch.no_grad():
        x = rendered_batch(rng, 8, 33, height, width)
        mu = vae.encode(x).latent_dist.mode()
        stats = None if decoder_only else fold_normalisation(vae, mu)
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
        mse = ((y - x) / 2).pow(2).mean().item()
    save_safetensors_atomic(vae.state_dict(), folder / VAE_FILE)
    result.update(psnr_db=round(10 * np.log10(1 / mse), 3), latent_stats=stats, file=str(folder / VAE_FILE))
    (folder / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


__all__ = ["VAE_FILE", "fold_normalisation", "init_for_training", "rendered_batch", "train_vae"]
