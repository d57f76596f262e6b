"""Train the loopworld DiT: the project's own :class:`~worldtrace_cli.model.dit.CausalWanDiT` with its
action module, through the same cache contract as inference, with flow matching.

One training sample is one encoded clip (:mod:`worldtrace_cli.train.dataset`) of 3 chunks. Exactly
as :class:`~worldtrace_cli.engine.rollout.Rollout` does at inference, the chunks before the target chunk
are run as context passes (timestep 0, ``commit=True``) whose canonical K/V go into
MG2's own cache, the ``sliding`` writer with MG2's local window (``local_attn_size`` latent frames
including the current chunk: 3 past frames for a window of 6), and whose action K/V go into the
action caches; the context passes run without gradients, on clean latents (teacher forcing) or,
with probability ``self_context``, on the model's own samples of those chunks (the product's 3-step
sampler: the rollout's own input, so the model learns to continue from its output). The
target chunk is noised, ``x_t = (1 - sigma) x0 + sigma eps``, and the model's flow prediction is
regressed on ``eps - x0`` (MG2 spec §10; :mod:`~worldtrace_cli.model.sampler`). sigma is one of the
sampler's own steps (shift 5.0: 1.0, 0.909, 0.714 for 1000/666/333) with probability
``sampler_sigma_prob``, else drawn from the shifted uniform schedule. The latent frame at which a
loop returns to its first pose gets ``return_weight`` times the loss weight. In a clip taken at a
rollout's start, the target is chunk 0 (the chunk whose first latent frame the start image
conditions) with probability ``start_share`` (default 1/6), else chunk 1 or 2 (1:4).

A step's clips run one at a time (:func:`clip_loss`) or, with ``train dit --batched``, as batches
of the clips that share their latent frames and target chunk (:class:`ClipBatch`,
:func:`grouped_loss`): the same loss, one DiT call per chunk and group (what a GPU needs).
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from ..config import PRESET_ADDED, Preset
from ..errors import InputError
from ..model.dit import CausalWanDiT, init_random_weights
from ..model.speed import tf32_allowed
from ..model.sampler import FlowMatchSchedule
from .common import LoopSettings, prepare_folder, run_loop, save_safetensors_atomic, settings_dict
from .objective import START_SHARE, ClipPool, clip_loss, grouped_loss

DIT_FILE = "dit.safetensors"
DIT_EMA_FILE = "dit-ema.safetensors"  # the weights' moving average, with --ema


# settings.json keys added after DiT folders existed, with the value those older runs were trained with
IMPLIED_BY_OLDER = {**{f"preset.{k}": v for k, v in PRESET_ADDED.items()}, "start_share": START_SHARE,
                    "self_context": 0.0, "batched": False, "context_noise": 0.0}


TRAIN_PRECISIONS = ("float32", "tf32", "bf16")


def forward_precision(precision: str, device: str):
    """The context a training step's forward passes run in: ``bf16`` is ``torch.autocast`` to bfloat16
    on ``device``'s type (matrix products, convolutions and attention in bfloat16; the weights, their
    gradients, the optimiser state and the loss stay float32: mixed precision, no loss scaling needed
    with bfloat16's float32 range); ``float32`` and ``tf32`` run as they are (TF32 is a process setting,
    :func:`~worldtrace_cli.model.speed.tf32_allowed`, around the whole run)."""
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


def build_dit(preset: Preset, seed: int) -> CausalWanDiT:
    """A float32 CPU DiT of the preset's config with seeded random weights (the head scaled by 0.1,
    so the first predictions are near zero)."""
    dit = CausalWanDiT(preset.dit)
    init_random_weights(dit, seed)
    with torch.no_grad():
        dit.head.head.weight.mul_(0.1)
    return dit


def train_dit(folder: Path, data: Path, preset: Preset, s: LoopSettings, batch: int = 4,
              sampler_prob: float = 0.75, return_weight: float = 3.0, progress: bool = True,
              stop=lambda: False, start_share: float = START_SHARE, init: Path | None = None,
              self_context: float = 0.0, device: str = "cpu", batched: bool = False,
              compile_mode: str = "none", precision: str = "float32", context_noise: float = 0.0) -> dict:
    """Train (or continue training) the DiT of ``preset`` on the clips in ``data``; writes
    ``folder/dit.safetensors`` (float32, official parameter names) at every save and at the end,
    and with ``s.ema`` the weights' moving average beside it (``dit-ema.safetensors``).

    Args:
        batch: clips per optimiser step (gradient accumulation over single clips, or with ``batched``
            over groups of clips run together).
        batched: run a step's clips as batches (:func:`grouped_loss`): one DiT call per chunk and
            group of clips sharing their target chunk; the same loss and distributions, another
            random stream. Measured on one CPU thread: 15-20 % less time per clip at 4-16 clips per
            step; on a GPU it is what uses the card's width (batch-1 calls are launch-bound).
        start_share: probability that a rollout-start clip trains chunk 0 (:func:`choose_target`).
        init: start from these DiT weights (a ``dit.safetensors``) instead of random ones.
        self_context: probability that a clip's context chunks are the model's own samples instead of
            the clean latents (:func:`self_generated_chunks`; against exposure bias).
        context_noise: the largest noise level (sigma, 0-1) of the context chunks: each clip's
            context passes run over its context latents noised to sigma ~ U(0, ``context_noise``) at
            timestep 1000 sigma (:func:`~worldtrace_cli.train.objective.context_sigma`; noise
            augmentation against drift, GameNGen section 3.2.1); a rollout then commits its chunks
            with the preset's ``context_noise``. 0: clean context passes, as MG2 trains.
        device: where the DiT trains (``"cpu"``, ``"cuda"``, ``"cuda:1"``); clips move there as they
            are drawn, the noise comes from the same numpy stream on every device, the weights files
            and the moving average stay float32 on the CPU. Not part of the run's settings: a run may
            be continued on another device.
        compile_mode: ``none`` | ``default``: ``torch.compile`` the blocks' pure parts for training
            (:func:`~worldtrace_cli.model.speed.compile_blocks` with symbolic sizes): the same losses,
            less than half the ATen calls per step (what bounds a GPU's steps per second here,
            benchmarks/results/gpu-h200-2026-11-26/), paid for by minutes of compilation at the first
            step. Not part of the run's settings either.
        precision: ``float32`` (IEEE float32 everywhere, the default: CPU and GPU give the same
            losses to rounding) | ``tf32`` (CUDA only: float32 matrix products on TF32 tensor cores,
            :func:`~worldtrace_cli.model.speed.tf32_allowed`; ``float32`` turns TF32 off, cuDNN's
            convolutions included) | ``bf16`` (mixed precision: the forward passes under bfloat16
            autocast, :func:`forward_precision`; float32 weights, gradients, optimiser state and moving
            average). Not part of the run's settings (a run may be continued in another precision);
            recorded in ``result.json``.
    Returns: ``{"step", "steps_this_run", "minutes", "loss", "file", "device", "precision",
    "clips_per_second"`` (clips trained per second of this run's loop: steps x ``batch`` / seconds),
    ``"pool_clips"`` (distinct clips loaded from the data folder at the pool's last re-scan, at most 200
    draws before the end: how fresh the clips were)``}``
    (also written to ``folder/result.json``).
    Raises:
        ValueError: ``compile_mode`` is not ``none`` or ``default``, or ``precision`` is not one of
            :data:`TRAIN_PRECISIONS`.
        InputError: ``precision`` is ``tf32`` and ``device`` is not a CUDA device.
        InputError: the folder holds a run with other settings; CheckpointError: ``init`` is not
            this preset's DiT.
        InputError: ``data`` is not a data folder of ``train encode`` or holds no clips yet (checked
            before the run folder is made).
        Interrupted: stopped by ``stop()`` (state saved; rerun to continue).
    """
    if compile_mode not in ("none", "default"):  # before the folder is made: a refused run leaves nothing
        raise ValueError(f"training compile mode must be none or default, got {compile_mode!r}")
    if precision not in TRAIN_PRECISIONS:
        raise ValueError(f"training precision must be one of {', '.join(TRAIN_PRECISIONS)}, got {precision!r}")
    if precision == "tf32" and torch.device(device).type != "cuda":
        raise InputError(f"--precision tf32 needs a CUDA device (TF32 is a GPU tensor-core format); got --device {device}")
    pool = ClipPool(data)  # before the folder is made too: a data folder without clips leaves nothing
    prepare_folder(folder, settings_dict(s, kind="dit", data=str(data), preset=preset.to_dict(training=True), batch=batch,
                                         sampler_prob=sampler_prob, return_weight=return_weight, start_share=start_share,
                                         self_context=self_context, init=None if init is None else str(init),
                                         batched=batched, context_noise=context_noise),
                   IMPLIED_BY_OLDER)
    torch.manual_seed(s.seed)
    dit = build_dit(preset, s.seed).train()
    if init is not None:
        from ..errors import CheckpointError
        from ..model.weights import read_state_dict

        try:
            dit.load_state_dict(read_state_dict(init), strict=True)
        except RuntimeError as exc:
            raise CheckpointError(f"{init}: not preset {preset.name}'s DiT ({str(exc).splitlines()[0]})") from None
    dit.to(device)
    if compile_mode != "none":
        from ..model.speed import compile_blocks

        compile_blocks(dit, compile_mode, dynamic=True)
    late_cond = pool.late_cond.to(device)
    schedule = FlowMatchSchedule(tuple(preset.denoising_steps), preset.timestep_shift, preset.sampler)

    def step_fn(step: int, rng: np.random.Generator) -> dict:
        with forward_precision(precision, device):  # the backward pass runs outside, in the forward's dtypes
            if batched:
                loss = grouped_loss(dit, [pool.draw(rng).to(device) for _ in range(batch)], late_cond, rng, schedule,
                                    sampler_prob, return_weight, start_share, self_context, context_noise)
                return {"loss": loss, "clips": float(len(pool.clips))}
            losses = [clip_loss(dit, pool.draw(rng).to(device), late_cond, rng, schedule, sampler_prob, return_weight,
                                start_share, self_context, context_noise) for _ in range(batch)]
            return {"loss": torch.stack(losses).mean(), "clips": float(len(pool.clips))}

    def write_weights(average):  # with every saved state, so an interrupted run's weights are current
        save_safetensors_atomic({k: v.cpu() for k, v in dit.state_dict().items()}, folder / DIT_FILE)
        if average is not None:
            save_safetensors_atomic(average, folder / DIT_EMA_FILE)

    with tf32_allowed(precision == "tf32"):
        result = run_loop(folder, dit, step_fn, s, progress=progress, stop=stop, on_save=write_weights)
    seconds = 60 * result["minutes"]
    result.update(file=str(folder / DIT_FILE), device=str(device), precision=precision,
                  clips_per_second=round(result["steps_this_run"] * batch / seconds, 3) if seconds > 0 else None,
                  pool_clips=len(pool.clips))
    (folder / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


__all__ = ["DIT_EMA_FILE", "DIT_FILE", "DIT_FORMATS", "TRAIN_PRECISIONS", "build_dit", "export_bundle", "forward_precision",
           "train_dit"]


DIT_FORMATS = ("float16", "int8")


def export_bundle(dit_weights: Path, vae_weights: Path, output: Path, clip_seed: int = 2,
                  dit_format: str = "float16") -> dict:
    """Write a ``bundled`` preset's weights file: ``dit.*`` (float16: half the size, well within
    the model's own error), ``vae.*`` and ``clip.*`` (the tiny CLIP tower of ``clip_seed``, float32).
    The file's metadata names the DiT and VAE files it came from (parent folder, name, sha256).

    ``dit_format="int8"`` stores the DiT's matrices in int8 with a float32 scale per output row
    (:func:`~worldtrace_cli.model.weights.quantize_int8`; the rest float16): about half float16's
    bytes, for a DiT too large to ship in float16 (the 3x DiT: 17.5 instead of 34.7 MB). Loaders
    turn it back into floats (:func:`~worldtrace_cli.model.checkpoint.split_bundle`).

    Returns ``{"file", "bytes", "parameters": {"dit", "vae", "clip"}, "dit_format"}``.
    Raises:
        CheckpointError: unreadable or mismatching input files.
        ValueError: an unknown ``dit_format``.
    """
    from ..model.checkpoint import read_state_dict
    from ..model.image_encoder import build_clip_tower
    from ..model.weights import file_identity, quantize_int8

    if dit_format not in DIT_FORMATS:
        raise ValueError(f"dit_format {dit_format!r}: expected one of {', '.join(DIT_FORMATS)}")
    dit = read_state_dict(dit_weights)
    vae = read_state_dict(vae_weights)
    clip = build_clip_tower("tiny", None, seed=clip_seed).model.state_dict()
    stored = quantize_int8(dit) if dit_format == "int8" else {k: v.half() for k, v in dit.items()}
    tensors = {f"dit.{k}": v.contiguous() for k, v in stored.items()}
    tensors.update({f"vae.{k}": v.float().contiguous() for k, v in vae.items()})
    tensors.update({f"clip.{k}": v.float().contiguous() for k, v in clip.items() if not k.endswith("position_ids")})
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    meta = {"format": "worldtrace-bundle-1", "clip_seed": str(clip_seed), "dit_format": dit_format}
    for part, path in (("dit", dit_weights), ("vae", vae_weights)):  # name and hash, not this machine's path
        ident = file_identity(path, full_hash=True)
        meta[part] = f"{Path(path).parent.name}/{ident['file']} sha256:{ident['sha256']}"
    save_safetensors_atomic(tensors, output, metadata=meta)
    count = lambda sd: sum(v.numel() for v in sd.values())  # noqa: E731
    return {"file": str(output), "bytes": output.stat().st_size,
            "parameters": {"dit": count(dit), "vae": count(vae), "clip": count(clip)}, "dit_format": dit_format}
