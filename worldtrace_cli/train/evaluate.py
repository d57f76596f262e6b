"""Does the trained DiT read its cache? The look-away-and-back test of loopworld-measurements.md.

On held-out loop clips (the pose of the cache's oldest slot is reached again at the target chunk's
last latent frame), the target chunk is sampled with the product's sampler (3 steps, fixed noise)
under three caches that differ only in that oldest slot:

- ``full``: the cache as the rollout wrote it (the first visit is in slot 0);
- ``removed``: slot 0 dropped (two slots left, at their own positions);
- ``wrong``: slot 0's K/V replaced by the same slot of a clip of another world (same position).

The score is the latent MSE of the return frame against the true latent. A model that reads its
cache is better with ``full`` than ``removed`` (the memory helps) and worse with ``wrong`` (the
memory is used even when it misleads); the decision rule of the measurements note calls a gap
(``removed - full``) above ~0.1 latent MSE a clear memory effect.

The drift test (:func:`rollout_drift`) asks the other question a world model must answer: does a
rollout stay on the world when it reads its *own* output? On held-out random walks of several
chunks from a rollout's start, each chunk's latent MSE against the truth is taken twice: in a free
rollout (every chunk sampled after the model's own earlier chunks, as ``generate`` runs) and with
teacher forcing (the same chunk sampled after the clean true chunks). Free error growing far above
teacher-forced error is exposure bias (what ``train dit --self-context`` trains against).

The action test (:func:`action_effect`) asks whether the model follows the keyboard and mouse at
all: on the same walks, the flow-matching loss of chunks 1..n-1 (clean context, fixed noise) with
the walk's own actions and with the actions of another walk. A model that moves the camera as told
has a clearly lower loss with its own actions (``gap`` > 0); a model whose loss does not care
predicts the average of all motions, which is a blur.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..model.dit import LayerPast
from ..model.sampler import FlowMatchSchedule
from .dataset import (LATE_CONDITIONING_FILE, ClipMix, EncodedClip, make_clip, make_encoder, read_shard,
                      shard_metadata, store_late_conditioning, write_shard)
from ..engine.rollout import read_past
from .objective import context_state, sample_x0, target_chunk_inputs

HELDOUT_FILE = "heldout.safetensors"
ROLLOUT_FILE = "heldout-rollouts-{chunks}.safetensors"
HELDOUT_SEED = 10_000_019  # a data stream the training shards (seeds [seed, i]) never use


def _encoded_once(path: Path, count: int, vae_weights, clip_seed: int, height: int, width: int, make,
                  world: str = "procedural") -> list[EncodedClip]:
    """The first ``count`` clips stored in ``path``; when it holds fewer, or was encoded with another
    VAE file (the header's ``vae``: the sha256 of the whole VAE file; files cached before 2026-11-26
    have none and are encoded again) or in another world style (the header's ``world``; none =
    ``procedural``), ``make(vae, tower)`` encodes them (a
    list of :class:`EncodedClip`) and they are stored first. Always the stored (float16-rounded)
    clips, so a score does not depend on whether the file existed."""
    from ..model.checkpoint import file_identity

    vae_id = file_identity(vae_weights, full_hash=True)["sha256"]
    meta = shard_metadata(path) if path.exists() else {}
    if meta.get("vae") == vae_id and meta.get("world", "procedural") == world:
        clips = read_shard(path)
        if len(clips) >= count:
            return clips[:count]
    vae, tower = make_encoder(vae_weights, clip_seed, height, width)
    write_shard(path, make(vae, tower), metadata={"vae": vae_id, "world": world})
    return read_shard(path)[:count]


def late_conditioning_of(data: Path, vae_weights, height: int = 96, width: int = 176) -> torch.Tensor:
    """The late conditioning latents [1, 16, 1, h, w] float32 of ``data`` (:func:`store_late_conditioning`:
    computed with the VAE ``vae_weights`` and stored first when the folder has none, e.g. one that
    only caches held-out clips). A folder that has one keeps it whatever ``vae_weights`` is: a training
    data folder's is the one its DiT was trained with (made by the data's VAE); unlike the held-out
    clips it is not encoded again for another VAE file, so that no evaluation rewrites training data."""
    from safetensors.torch import load_file

    path = Path(data) / LATE_CONDITIONING_FILE
    if not path.exists():
        store_late_conditioning(data, make_encoder(vae_weights, 2, height, width)[0])
    return load_file(str(path))["latents"]


def data_world(data: Path) -> str:
    """The world style a data folder's clips were rendered in (its ``data.json``; ``procedural`` for
    a folder written before styles existed, or without one): held-out clips are of the same style."""
    info = Path(data) / "data.json"
    mix = json.loads(info.read_text()).get("mix", {}) if info.exists() else {}
    return mix.get("world", "procedural")


def heldout_clips(data: Path, vae_weights, count: int, mix: ClipMix = ClipMix(late=1.0, loop=1.0),
                  clip_seed: int = 2, height: int = 96, width: int = 176) -> list[EncodedClip]:
    """``count`` held-out loop clips, encoded once and kept in ``data/heldout.safetensors``."""
    world = data_world(data)

    def make(vae, tower):
        rng = np.random.default_rng(HELDOUT_SEED)
        return [make_clip(rng, vae, tower, late=rng.random() < mix.late, loop=True, max_angle_deg=mix.max_angle_deg,
                          world=world) for _ in range(count)]

    return _encoded_once(Path(data) / HELDOUT_FILE, count, vae_weights, clip_seed, height, width, make, world)


def heldout_rollout_clips(data: Path, vae_weights, count: int, chunks: int = 8, clip_seed: int = 2,
                          height: int = 96, width: int = 176) -> list[EncodedClip]:
    """``count`` held-out random walks of ``chunks`` chunks from a rollout's start (latents
    [16, 3 chunks, h, w]), encoded once and kept in ``data/heldout-rollouts-<chunks>.safetensors``."""
    world = data_world(data)

    def make(vae, tower):
        rng = np.random.default_rng([HELDOUT_SEED, chunks])
        return [make_clip(rng, vae, tower, late=False, loop=False, chunks=chunks, world=world) for _ in range(count)]

    return _encoded_once(Path(data) / ROLLOUT_FILE.format(chunks=chunks), count, vae_weights, clip_seed, height,
                         width, make, world)


@torch.no_grad()
def rollout_drift(dit, clips: list[EncodedClip], late_cond, schedule: FlowMatchSchedule, keep: int = 0) -> dict:
    """Per-chunk latent MSE of free vs teacher-forced rollouts (module docstring).

    Args:
        clips: rollout-start clips of n chunks (:func:`heldout_rollout_clips`).
        keep: also return the latents of the first ``keep`` clips (for :func:`drift_pictures`).
    Returns:
        ``{"clips": k, "chunks": n, "free": [n], "teacher": [n], "free_mean", "teacher_mean"}``:
        means over clips of each chunk's latent MSE (all 3 latent frames) against the true latents;
        the ``*_mean`` values average chunks 1..n-1 (chunk 0 has no context in either). With
        ``keep``, ``"latents"``: per kept clip ``(truth, teacher, free)``, float32 [1, 16, 3 n, h, w] each.
    """
    dit.eval()
    n = clips[0].latents.shape[1] // 3
    free, teacher = np.zeros((len(clips), n)), np.zeros((len(clips), n))
    kept = []
    for i, clip in enumerate(clips):
        chunks = {"free": [None] * n, "teacher": [None] * n}

        def score(c, x0, kind):
            chunks[kind][c] = x0.float()
            (free if kind == "free" else teacher)[i, c] = float((x0 - clip.latents[None, :, 3 * c:3 * c + 3]).pow(2).mean())

        context_state(dit, clip, late_cond, n, generated=n, schedule=schedule, rng=np.random.default_rng([i, 1]),
                      observe=lambda c, x0: score(c, x0, "free"))
        for c in range(n):
            score(c, sample_chunk(dit, clip, late_cond, c, schedule, seed=i), "teacher")
        if i < keep:
            kept.append((clip.latents[None].float(), torch.cat(chunks["teacher"], 2), torch.cat(chunks["free"], 2)))
    out = {"clips": len(clips), "chunks": n, "free": free.mean(0).round(4).tolist(),
           "teacher": teacher.mean(0).round(4).tolist(), "free_mean": float(free[:, 1:].mean()),
           "teacher_mean": float(teacher[:, 1:].mean())}
    if keep:
        out["latents"] = kept
    return out


def drift_pictures(vae, kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """A labelled sheet of :func:`rollout_drift`'s kept latents: per walk the truth (through the
    codec), the teacher-forced and the free rollout, each chunk's last pixel frame decoded with the
    product's streaming decoder. Returns a PIL image."""
    from ..model.vae import StreamingDecoder
    from ..outputs.sheet import frame_sheet

    rows, labels = [], []
    for w, triple in enumerate(kept):
        for name, z in zip(("truth", "teacher-forced", "free"), triple):
            decoder = StreamingDecoder(vae)
            frames = [decoder.decode(z[:, :, c:c + 3])[-1].numpy() for c in range(0, z.shape[2], 3)]
            rows.append(np.stack(frames))
            labels.append(f"walk {w} {name}")
    return frame_sheet(rows, labels, [f"chunk {c}" for c in range(len(rows[0]))])


@torch.no_grad()
def action_effect(dit, clips: list[EncodedClip], late_cond, sigmas=(1.0, 0.714)) -> dict:
    """Flow-matching loss with a walk's own actions vs another walk's (module docstring).

    Args:
        clips: rollout-start walks of n >= 2 chunks (:func:`heldout_rollout_clips`); walk i borrows
            the keyboard and mouse rows of walk i + 1 (same absolute rows: both start at frame 0).
        sigmas: noise levels at which the loss is taken (each chunk, each sigma, fixed noise).
    Returns:
        ``{"clips": k, "own": loss, "other": loss, "gap": other - own}``: MSE between the predicted
        and the true flow ``eps - x0``, mean over chunks 1..n-1, sigmas and clips (float).
    Raises:
        ValueError: fewer than 2 clips (nothing to borrow from).
    """
    from dataclasses import replace

    from ..model.sampler import NUM_TRAIN_TIMESTEPS, add_noise

    if len(clips) < 2:
        raise ValueError("the action test needs at least 2 walks")
    dit.eval()
    n = clips[0].latents.shape[1] // 3
    own, other = [], []
    for i, clip in enumerate(clips):
        donor = clips[(i + 1) % len(clips)]
        swapped = replace(clip, keyboard=donor.keyboard, mouse=donor.mouse, rows_start=donor.rows_start)
        for c in range(1, n):
            x0 = clip.latents[None, :, 3 * c:3 * c + 3].float()
            for j, sigma in enumerate(sigmas):
                eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1000 * i + 10 * c + j))
                xt, t = add_noise(x0, eps, sigma), torch.full((1, 3), sigma * NUM_TRAIN_TIMESTEPS)
                for scores, variant in ((own, clip), (other, swapped)):
                    state, writer, rows = context_state(dit, variant, late_cond, c)
                    chunk, cond = target_chunk_inputs(dit, variant, late_cond, c, state, writer, rows)
                    scores.append(float((dit(xt, t, cond, chunk).float() - (eps - x0)).pow(2).mean()))
    return {"clips": len(clips), "own": float(np.mean(own)), "other": float(np.mean(other)),
            "gap": float(np.mean(other) - np.mean(own))}


@torch.no_grad()
def sample_chunk(dit, clip: EncodedClip, late_cond, target: int, schedule: FlowMatchSchedule, seed: int,
                 past_edit=None) -> torch.Tensor:
    """The product's sampler on the clip's chunk ``target`` after clean context: x0 [1, 16, 3, h, w]."""
    state, writer, rows = context_state(dit, clip, late_cond, target)
    chunk, cond = target_chunk_inputs(dit, clip, late_cond, target, state, writer, rows, past_edit)
    gen = torch.Generator().manual_seed(seed)
    return sample_x0(dit, (1, 16, 3, *clip.latents.shape[-2:]), cond, chunk, schedule,
                     lambda shape: torch.randn(shape, generator=gen))


def _replace_slot0(donor: list[LayerPast], tokens: int):
    def edit(past: list[LayerPast]) -> list[LayerPast]:
        return [LayerPast(torch.cat([d.k[:, :tokens], p.k[:, tokens:]], 1), torch.cat([d.v[:, :tokens], p.v[:, tokens:]], 1),
                          p.positions) for p, d in zip(past, donor)]
    return edit


def _drop_slot0(tokens: int):
    def edit(past: list[LayerPast]) -> list[LayerPast]:
        return [LayerPast(p.k[:, tokens:], p.v[:, tokens:], p.positions[1:]) for p in past]
    return edit


@torch.no_grad()
def memory_effect(dit, clips: list[EncodedClip], late_cond, schedule: FlowMatchSchedule) -> dict:
    """Return-frame latent MSE under the full / removed / wrong caches (module docstring).

    Args:
        clips: loop clips (``return_latent`` 8: the last latent of chunk 2).
    Returns:
        ``{"clips": n, "full": mse, "removed": mse, "wrong": mse, "gap_removed": removed - full,
        "gap_wrong": wrong - full}`` (means over clips; MSE over the return latent frame).
    """
    dit.eval()
    tokens = (clips[0].latents.shape[-2] // 2) * (clips[0].latents.shape[-1] // 2)
    scores = {"full": [], "removed": [], "wrong": []}
    for i, clip in enumerate(clips):
        donor_clip = clips[(i + 1) % len(clips)]
        _, donor_writer, _ = context_state(dit, donor_clip, late_cond, 2)
        donor_writer.begin_chunk(clip.frame_start + 6)
        donor = read_past(donor_writer, dit.cfg.num_layers)
        truth = clip.latents[:, clip.return_latent]
        for name, edit in (("full", None), ("removed", _drop_slot0(tokens)), ("wrong", _replace_slot0(donor, tokens))):
            x0 = sample_chunk(dit, clip, late_cond, 2, schedule, seed=i, past_edit=edit)
            scores[name].append(float((x0[0, :, clip.return_latent % 3] - truth).pow(2).mean()))
    out = {"clips": len(clips), **{k: float(np.mean(v)) for k, v in scores.items()}}
    out["gap_removed"] = out["removed"] - out["full"]
    out["gap_wrong"] = out["wrong"] - out["full"]
    return out


__all__ = ["HELDOUT_FILE", "ROLLOUT_FILE", "action_effect", "drift_pictures", "heldout_clips", "heldout_rollout_clips", "memory_effect", "rollout_drift",
           "sample_chunk"]
