"""Wan 2.1 causal video VAE (diffusers ``AutoencoderKLWan``): build/load, conditioning encode,
streaming decode.

References: MG2 spec (``docs/reference/mg2-architecture.md``) §12.2 (conditioning video) and §14 (VAE);
ecosystem notes, section "Wan 2.1 VAE". The streaming decoder drives diffusers internals
(``decoder(x, feat_cache=..., feat_idx=...)``, ``post_quant_conv``) that are stable in the pinned
range diffusers 0.35-0.42; ``tests/test_vae.py`` keeps chunked == whole-video decode as a
regression test.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d, WanRMS_norm

from .weights import check_state_dict, read_state_dict

WAN_LATENT_MEAN: tuple[float, ...] = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)
WAN_LATENT_STD: tuple[float, ...] = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)
# The conditioning video (image + blank frames) encodes to bit-identical latents once the encoder's
# finite causal receptive field no longer reaches the image: from latent 29 on for this
# architecture (tiny config, same depth as the real one, fp32 and fp64; the ecosystem notes saw the
# real VAE constant from 30 on). So 31 encoded latents followed by repeats of the last one equal
# MG2's full-length encode exactly.
CONDITIONING_ENCODE_LATENT_FRAMES = 31

_CONFIG_DIRS = {"wan2.1": "wan2.1_vae", "tiny": "wan2.1_vae_tiny", "loopworld": "wan2.1_vae_loopworld"}


def vae_config_dir(variant: str) -> Path:
    """Folder of the shipped diffusers ``config.json`` for ``variant`` ("wan2.1", "tiny" or "loopworld").

    Raises:
        ValueError: unknown variant.
    """
    if variant not in _CONFIG_DIRS:
        raise ValueError(f"unknown VAE variant {variant!r} (expected one of {', '.join(_CONFIG_DIRS)})")
    return Path(__file__).parent / "configs" / _CONFIG_DIRS[variant]


class _MkldnnCausalConv3d(WanCausalConv3d):
    """WanCausalConv3d that runs fp32 CPU convolutions through oneDNN.

    PyTorch's backend heuristic (tuned for 4-D inputs) sends batch-1 5-D inputs with
    N*C*T*H <= 20480 to ``slow_conv3d``, which is 3-10x slower here: that covers most layers of
    the narrow tiny VAE and the low-resolution layers of the real one. Results agree with
    ``F.conv3d`` to float rounding (tested). Other devices/dtypes use the normal path.
    """

    def _conv_forward(self, input, weight, bias):
        if input.device.type == "cpu" and input.dtype == torch.float32 and weight.dtype == torch.float32:
            return torch.ops.aten.mkldnn_convolution(
                input.contiguous(), weight, bias, list(self.padding), list(self.stride),
                list(self.dilation), self.groups)
        return super()._conv_forward(input, weight, bias)


class _CpuRMSNorm(WanRMS_norm):
    """WanRMS_norm whose CPU calls take the root of a sum of squares instead of ``F.normalize``.

    ``F.normalize`` over the channel dim of a ``[B, C, T, H, W]`` activation goes through
    ``linalg_vector_norm``'s strided CPU reduction, 3-20x slower than ``x.pow(2).sum(1)`` at the VAE's
    shapes (torch 2.13, one thread; a third of a tiny run's time was this norm). The same formula
    as diffusers': ``x / max(||x||_2, 1e-12) * sqrt(C) * gamma + bias``, the norm in float32 for
    half-precision inputs; results agree to float rounding (tested). Other devices use diffusers' own.
    """

    def forward(self, x) -> torch.Tensor:
        if x.device.type != "cpu":
            return super().forward(x)
        dim = 1 if self.channel_first else -1
        xf = x.float() if x.dtype != torch.float64 else x
        norm = xf.pow(2).sum(dim, keepdim=True).sqrt().clamp_min(1e-12)
        return (xf / norm).to(x.dtype) * self.scale * self.gamma + self.bias


def use_cpu_fast_paths(vae: torch.nn.Module) -> torch.nn.Module:
    """Switch ``vae``'s CPU fast paths on (in place): every causal 3-D convolution to oneDNN
    (:class:`_MkldnnCausalConv3d`) and every RMS norm to a sum of squares (:class:`_CpuRMSNorm`).

    Only CPU calls change (the convolutions: fp32 ones); weights, state-dict names and other devices
    are untouched. Returns ``vae``. The convolutions stay as they are when PyTorch has no oneDNN.
    """
    for module in vae.modules():
        if type(module) is WanCausalConv3d and torch.backends.mkldnn.is_available():
            module.__class__ = _MkldnnCausalConv3d
        elif type(module) is WanRMS_norm:
            module.__class__ = _CpuRMSNorm
    return vae


def build_wan_vae(variant: str = "wan2.1", weights: str | Path | dict | None = None, *, seed: int = 0,
                  device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                  cpu_mkldnn: bool = True) -> AutoencoderKLWan:
    """Build the Wan 2.1 VAE from the shipped config, with seeded random or official weights.

    Args:
        variant: "wan2.1" (base_dim 96, 127M parameters, spec §14), "tiny" (same architecture
            and 8x spatial / 4x temporal compression, z_dim 16, base_dim 8, for CPU smoke runs) or
            "loopworld" (tiny with one residual block per stage: the trained embedded world's codec).
        weights: ``None`` for seeded random init (the global torch RNG state is restored
            afterwards), the original-format ``Wan2.1_VAE.pth`` (read with ``weights_only=True``) /
            a ``.safetensors`` with the same 194 keys (mapped with diffusers' own single-file
            converter), or a state dict already in diffusers' names (a file, or a dict of tensors,
            e.g. the ``loopworld`` bundle's ``vae.*`` part). Loaded strictly, offline.
        seed: seed of the random init.
        device, dtype: where the returned model lives.
        cpu_mkldnn: route fp32 CPU 3-D convolutions through oneDNN and the RMS norms through a sum
            of squares (see :func:`use_cpu_fast_paths`); no effect on GPU.

    Returns:
        ``AutoencoderKLWan`` in eval mode with ``requires_grad`` False.

    Raises:
        ValueError: unknown variant.
        CheckpointError: weights file missing, unreadable/truncated, or with missing, unexpected,
            wrongly shaped or non-float tensors (one line naming the file).
    """
    config = AutoencoderKLWan.load_config(str(vae_config_dir(variant)))
    if weights is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            vae = AutoencoderKLWan.from_config(config)
    else:
        # Not from_single_file: it treats a missing path as a Hub id (network), and it ignores
        # missing/unexpected keys instead of failing.
        sd = weights if isinstance(weights, dict) else read_state_dict(weights)
        with torch.device("meta"):
            vae = AutoencoderKLWan.from_config(config)
        if not set(vae.state_dict()) <= set(sd):  # original Wan names
            sd = convert_wan_vae_to_diffusers(sd)
        check_state_dict(vae, sd, "VAE state dict" if isinstance(weights, dict) else str(weights))
        vae.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True, assign=True)
        if any(t.is_meta for t in (*vae.parameters(), *vae.buffers())):
            raise RuntimeError("AutoencoderKLWan kept meta tensors after loading (diffusers changed?)")
    if cpu_mkldnn:
        use_cpu_fast_paths(vae)
    # nn.Module.to: diffusers' ModelMixin.to warns about fp32-pinned modules even when there are none.
    return torch.nn.Module.to(vae, device=device, dtype=dtype).eval().requires_grad_(False)


def _norm_stats(device, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    mean = torch.tensor(WAN_LATENT_MEAN, device=device, dtype=dtype).view(1, -1, 1, 1, 1)
    std = torch.tensor(WAN_LATENT_STD, device=device, dtype=dtype).view(1, -1, 1, 1, 1)
    return mean, std


def _vae_param(vae: torch.nn.Module) -> torch.Tensor:
    return next(vae.parameters())


@torch.no_grad()
def encode_video(vae: AutoencoderKLWan, video: torch.Tensor) -> torch.Tensor:
    """The normalised latents of a video: the posterior's mean (its mode; no sampling), normalised per
    channel, ``(mu - mean) / std`` with Wan 2.1's statistics (MG2 spec §14).

    Args:
        video: ``[B, 3, 1 + 4 k, H, W]`` float in [-1, 1] on the VAE's device and in its dtype.
    Returns:
        float32 ``[B, 16, 1 + k, H/8, W/8]`` on the VAE's device.
    """
    mu = vae.encode(video).latent_dist.mode()
    mean, std = _norm_stats(mu.device)
    return (mu.float() - mean) / std


def encode_conditioning_latents(vae: AutoencoderKLWan, image: torch.Tensor, num_latent_frames: int) -> torch.Tensor:
    """Encode MG2's conditioning video: the image followed by blank (all-zero = mid-grey) frames.

    Spec §12.2: the video has ``1 + 4*(K-1)`` frames with ``K = min(num_latent_frames,
    CONDITIONING_ENCODE_LATENT_FRAMES)``; its posterior mean (no sampling) is normalised per
    channel, ``(mu - mean) / std`` (§14). Latent frames >= K equal frame K-1 exactly, so callers
    repeat it (:class:`worldtrace_cli.model.conditioning.ConditioningLatents`).

    Args:
        vae: a Wan 2.1 ``AutoencoderKLWan`` (any device/dtype; the video is built in its dtype).
        image: ``[B, 3, H, W]`` float in [-1, 1], H and W multiples of 8 (already cropped/resized);
            B > 1 encodes B conditioning videos in one call (training clips, ``train encode --workers``).
        num_latent_frames: latent frames of the rollout (>= 1).

    Returns:
        float32 ``[B, 16, K, H/8, W/8]`` on the VAE's device.

    Raises:
        ValueError: wrong image shape or ``num_latent_frames < 1``.
    """
    if image.ndim != 4 or image.shape[1] != 3 or image.shape[2] % 8 or image.shape[3] % 8:
        raise ValueError(f"conditioning image must be [B, 3, H, W] with H, W multiples of 8, got {list(image.shape)}")
    if num_latent_frames < 1:
        raise ValueError(f"num_latent_frames must be >= 1, got {num_latent_frames}")
    k = min(num_latent_frames, CONDITIONING_ENCODE_LATENT_FRAMES)
    p = _vae_param(vae)
    video = torch.zeros(image.shape[0], 3, 1 + 4 * (k - 1), *image.shape[2:], device=p.device, dtype=p.dtype)
    video[:, :, 0] = image.to(device=p.device, dtype=p.dtype)
    return encode_video(vae, video)


class StreamingDecoder:
    """Chunk-by-chunk Wan 2.1 decoder that keeps the causal feature cache across chunks (§14).

    diffusers' ``vae.decode()`` clears its cache on every call, so decoding chunks separately
    with it gives 9/9/9 frames and wrong frames at chunk starts. This class owns its own cache
    (one entry per causal conv of the decoder; at most 2 frames of features each), so memory is
    constant in video length and interleaved ``vae.encode``/``vae.decode`` calls do not disturb
    it. Latent frames go through the decoder one at a time, exactly like ``decode()`` does, so
    the output equals a whole-video ``decode()`` up to float rounding.

    Args:
        vae: a Wan 2.1 (``is_residual=False``) ``AutoencoderKLWan``.
        dtype: dtype to decode in; ``None`` = the VAE's dtype. A different dtype decodes with a
            private converted copy of ``post_quant_conv`` and ``decoder`` (MG2 decodes in fp16
            while encoding in bf16), leaving ``vae`` unchanged.

    Raises:
        ValueError: a Wan 2.2-style residual VAE (its upsamplers need per-chunk state we do
            not model).
    """

    def __init__(self, vae: AutoencoderKLWan, dtype: torch.dtype | None = None):
        if getattr(vae.config, "is_residual", False) or getattr(vae.config, "patch_size", None) is not None:
            raise ValueError("StreamingDecoder supports the Wan 2.1 VAE only (is_residual=False, no patch_size)")
        p = _vae_param(vae)
        self.device = p.device
        self.dtype = dtype or p.dtype
        self._post_quant_conv, self._decoder = vae.post_quant_conv, vae.decoder
        if self.dtype != p.dtype:
            self._post_quant_conv = copy.deepcopy(vae.post_quant_conv).to(self.dtype)
            self._decoder = copy.deepcopy(vae.decoder).to(self.dtype)
        self._num_convs = sum(isinstance(m, WanCausalConv3d) for m in self._decoder.modules())
        self._mean, self._std = _norm_stats(self.device)
        self.reset()

    def reset(self) -> None:
        """Forget all decoded frames: the next chunk is decoded as the start of a new video."""
        self._cache: list = [None] * self._num_convs
        self._frames = 0

    def state(self) -> dict:
        """The causal feature cache (per decoder conv: a tensor of at most 2 frames of features, None,
        or diffusers' ``"Rep"`` marker) and the frame count, for resume states."""
        return {"cache": list(self._cache), "frames": self._frames}

    def load_state(self, state: dict) -> None:
        """Restore :meth:`state`. Raises ValueError when it belongs to a different decoder layout."""
        if len(state["cache"]) != self._num_convs:
            raise ValueError(f"decoder state has {len(state['cache'])} cache entries, expected {self._num_convs}")
        self._cache, self._frames = list(state["cache"]), int(state["frames"])

    @property
    def frames_decoded(self) -> int:
        """Pixel frames produced since the last :meth:`reset`."""
        return self._frames

    @torch.no_grad()
    def decode_float(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode the next chunk of normalised latents to float pixels.

        Args:
            latents: normalised ``[1, 16, F, h, w]``, any float dtype/device; they are
                un-normalised in float32 (``z * std + mean``, §14) then cast to the decode dtype.

        Returns:
            ``[1, 3, T, 8h, 8w]`` in the decode dtype on the VAE's device, clamped to [-1, 1], with
            ``T = 1 + 4(F-1)`` for the first chunk after :meth:`reset` and ``T = 4F`` afterwards
            (MG2 chunks of 3 latents: 9 then 12 frames).

        Raises:
            ValueError: latents not ``[1, 16, F, h, w]`` with F >= 1.
        """
        if latents.ndim != 5 or latents.shape[:2] != (1, 16) or latents.shape[2] < 1:
            raise ValueError(f"latents must be [1, 16, F, h, w] with F >= 1, got {list(latents.shape)}")
        z = latents.to(device=self.device, dtype=torch.float32) * self._std + self._mean
        x = self._post_quant_conv(z.to(self.dtype))
        frames = []
        for i in range(x.shape[2]):
            # decoder() walks the cache with this counter; it must restart at 0 for each frame.
            frames.append(self._decoder(x[:, :, i:i + 1], feat_cache=self._cache, feat_idx=[0]))
        out = torch.cat(frames, dim=2).clamp_(-1.0, 1.0)
        self._frames += out.shape[2]
        return out

    def decode_pixels(self, latents: torch.Tensor) -> torch.Tensor:
        """Decode the next chunk to video frames as MG2 writes them, left on the VAE's device.

        Pixels: clamp to [-1, 1], then ``(x + 1) * 127.5`` computed in float32 and truncated to
        uint8 (MG2 ``inference.py``: ``((x + 1) * 127.5).clip(0, 255).astype(np.uint8)``).

        Args:
            latents: normalised ``[1, 16, F, h, w]`` (see :meth:`decode_float`).

        Returns:
            uint8 ``[T, 8h, 8w, 3]`` contiguous, on the VAE's device (T as in :meth:`decode_float`).
        """
        x = self.decode_float(latents)[0].float()
        pixels = ((x + 1.0) * 127.5).clamp_(0, 255).to(torch.uint8)
        return pixels.permute(1, 2, 3, 0).contiguous()

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """:meth:`decode_pixels` moved to the CPU: uint8 ``[T, 8h, 8w, 3]``."""
        return self.decode_pixels(latents).cpu()


__all__ = [
    "WAN_LATENT_MEAN", "WAN_LATENT_STD", "CONDITIONING_ENCODE_LATENT_FRAMES", "StreamingDecoder",
    "build_wan_vae", "encode_conditioning_latents", "encode_video", "use_cpu_fast_paths", "vae_config_dir",
]
