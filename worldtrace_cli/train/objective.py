"""The training objective of the loopworld DiT: one clip's context passes through the cache contract
and its target chunk's flow-matching loss (the module docstring of :mod:`worldtrace_cli.train.dit`
says how a sample is built).

Clips run one at a time (:func:`clip_loss`) or grouped by their latent frames and target chunk
(:class:`ClipBatch`, :func:`grouped_loss`): the same loss, one DiT call per chunk and group.
:func:`context_state` and :func:`sample_x0` are also what the look-away-and-back evaluation
(:mod:`worldtrace_cli.train.evaluate`) runs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from ..memory import CacheGeometry, MemoryConfig, build_writer
from ..model.conditioning import MASK_CHANNELS, ConditioningLatents
from ..model.dit import CausalWanDiT, ChunkInputs
from ..engine.rollout import read_past
from ..model.sampler import NUM_TRAIN_TIMESTEPS, FlowMatchSchedule, add_noise, flow_to_x0, next_x
from .dataset import LATE_CONDITIONING_FILE, EncodedClip, read_shard, shard_paths


class ClipPool:
    """The clips of a data folder in memory, re-scanned for new shards every ``rescan`` draws (so
    training can start while ``train encode`` still writes).

    Raises:
        InputError (one line): ``folder`` is missing, is not a data folder of ``worldtrace train
            encode`` (no ``late_conditioning.safetensors``) or holds no clips yet.
    """

    def __init__(self, folder: Path, rescan: int = 200):
        from safetensors.torch import load_file

        self.folder, self.rescan = Path(folder), rescan
        self.clips: list[EncodedClip] = []
        self._loaded: set[Path] = set()
        self._draws = 0
        if not self.folder.is_dir():
            raise InputError(f"--data {folder}: no such folder (make it with worldtrace train encode --vae VAE "
                             f"-o {folder})")
        if not (self.folder / LATE_CONDITIONING_FILE).is_file():
            raise InputError(f"--data {folder}: not a data folder of worldtrace train encode "
                             f"(no {LATE_CONDITIONING_FILE})")
        self.late_cond = load_file(str(self.folder / LATE_CONDITIONING_FILE))["latents"]
        self.refresh()

    def refresh(self) -> None:
        """Load shards not loaded yet. Raises InputError when the folder holds no clips."""
        for path in shard_paths(self.folder):
            if path not in self._loaded:
                self.clips += read_shard(path)
                self._loaded.add(path)
        if not self.clips:
            raise InputError(f"--data {self.folder}: no encoded clips yet "
                             f"(run worldtrace train encode --vae VAE -o {self.folder})")

    def draw(self, rng: np.random.Generator) -> EncodedClip:
        """A uniformly drawn clip (re-scanning for new shards every ``rescan`` draws)."""
        self._draws += 1
        if self._draws % self.rescan == 0:
            self.refresh()
        return self.clips[int(rng.integers(len(self.clips)))]


@dataclass
class ClipBatch:
    """B encoded clips whose chunks sit at the same absolute latent frames (one ``frame_start``),
    stacked for one batched DiT call per chunk (``train dit --batched``; B = 1 for one clip).

    Attributes:
        clips: the :class:`EncodedClip` s, in batch order.
        latents: float32 [B, 16, 9, h, w].
        keyboard, mouse: float32 [B, R, 4] / [B, R, 2] action rows by absolute row index
            (:meth:`EncodedClip.action_rows`, zero-padded to the longest clip's R).
        clip_tokens: float32 [B, 257, clip_dim].
    Raises (:meth:`of`): ValueError for no clips, clips at different latent frames or of other sizes.
    """

    clips: list[EncodedClip]
    latents: torch.Tensor
    keyboard: torch.Tensor
    mouse: torch.Tensor
    clip_tokens: torch.Tensor

    @classmethod
    def of(cls, clips) -> "ClipBatch":
        """Stack ``clips`` (one :class:`EncodedClip` or a sequence of them, all on one device)."""
        if isinstance(clips, ClipBatch):
            return clips
        clips = [clips] if isinstance(clips, EncodedClip) else list(clips)
        if not clips:
            raise ValueError("a clip batch needs at least one clip")
        if len({c.frame_start for c in clips}) > 1 or len({tuple(c.latents.shape) for c in clips}) > 1:
            raise ValueError("a clip batch stacks clips at the same latent frames and of the same size")
        rows = [c.action_rows() for c in clips]
        r = max(kb.shape[1] for kb, _ in rows)
        pad = lambda t: torch.cat([t, t.new_zeros(1, r - t.shape[1], t.shape[2])], dim=1)  # noqa: E731
        return cls(clips, torch.stack([c.latents for c in clips]), torch.cat([pad(kb) for kb, _ in rows]),
                   torch.cat([pad(ms) for _, ms in rows]), torch.stack([c.clip_tokens for c in clips]))

    @property
    def frame_start(self) -> int:
        """Absolute latent frame of the clips' first latent frame (0: a rollout's start)."""
        return self.clips[0].frame_start

    def __len__(self) -> int:
        return len(self.clips)


def cond_concat(clip, late_cond: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """``cond_concat`` [B, 20, count, h, w] of absolute latent frames start..start+count-1 of a clip
    (B = 1) or a :class:`ClipBatch`: :meth:`ConditioningLatents.cond_concat` for early clips; the
    mask (zero past frame 0) and the constant late conditioning ``late_cond`` [1, 16, 1, h, w] otherwise."""
    clips = clip.clips if isinstance(clip, ClipBatch) else [clip]
    if clips[0].image_latents is not None:
        return torch.cat([ConditioningLatents(c.image_latents[None]).cond_concat(start, count) for c in clips])
    lat = late_cond.expand(len(clips), -1, count, -1, -1)
    return torch.cat([lat.new_zeros(len(clips), MASK_CHANNELS, *lat.shape[2:]), lat], dim=1)


def cache_geometry(dit: CausalWanDiT, latent_hw: tuple[int, int]) -> CacheGeometry:
    """The cache geometry a rollout of ``dit`` at latent size ``latent_hw`` uses (as :class:`Rollout`)."""
    cfg = dit.cfg
    tokens = (latent_hw[0] // 2) * (latent_hw[1] // 2)
    param = next(dit.parameters())
    return CacheGeometry(cfg.num_layers, cfg.num_heads, cfg.head_dim, tokens, 3, cfg.local_attn_size - 1,
                         str(param.device), param.dtype)


def context_state(dit: CausalWanDiT, clip, late_cond, chunks: int, writer=None, generated: int = 0,
                  schedule: FlowMatchSchedule | None = None, rng: np.random.Generator | None = None,
                  observe=None, context_sigmas: list[float] | None = None):
    """Run the first ``chunks`` chunks of a clip (an :class:`EncodedClip`, or a :class:`ClipBatch`
    of B clips run together) as context passes; returns (rollout state, writer, action rows).

    The writer defaults to MG2's own ``sliding`` cache (budget ``local_attn_size - 3``). The last
    ``generated`` of those chunks are not the clip's clean latents but the model's own sample of
    them (the product's sampler, :func:`sample_x0`, with ``schedule`` and noise from ``rng``), read
    and committed exactly as a rollout does: training on self-generated context (``--self-context``).
    ``observe(c, x0)``, when given, sees every context chunk's committed latents [B, 16, 3, h, w].
    ``context_sigmas`` (one noise level in [0, 1) per clip, ``--context-noise``): clip b's context
    passes run at timestep ``1000 sigma_b`` over its latents noised to ``sigma_b`` (noise from ``rng``),
    as a rollout with that context noise commits them (noise augmentation of the context against
    drift: GameNGen, Valevski et al. 2024, section 3.2.1; MG2's ``context_noise``, 0 in its configs).
    """
    batch = ClipBatch.of(clip)
    z, kb, ms, visual = batch.latents, batch.keyboard, batch.mouse, batch.clip_tokens
    if writer is None:
        writer = build_writer(MemoryConfig(cache="sliding"), dit.cfg.local_attn_size - 3)
    writer.reset(cache_geometry(dit, tuple(z.shape[-2:])))
    state = dit.new_rollout_state()
    with torch.no_grad():
        for c in range(chunks):
            sf = batch.frame_start + 3 * c
            writer.begin_chunk(sf)
            past = read_past(writer, dit.cfg.num_layers)
            chunk = ChunkInputs(rollout=state, past=past, frame_start=sf, keyboard=kb, mouse=ms, visual_context=visual)
            cond = cond_concat(batch, late_cond, sf, 3)
            x0 = z[:, :, 3 * c:3 * c + 3]
            if c >= chunks - generated:
                x0 = sample_x0(dit, x0.shape, cond, chunk, schedule, _numpy_draws(rng, z.device))
            t = z.new_zeros(len(batch), 3)
            if context_sigmas is not None and any(context_sigmas):
                sig = torch.tensor(context_sigmas, dtype=torch.float32, device=z.device)
                x0 = add_noise(x0, _numpy_draws(rng, z.device)(tuple(x0.shape)), sig.view(-1, 1, 1, 1, 1))
                t = (sig * NUM_TRAIN_TIMESTEPS).view(-1, 1).expand(-1, 3).contiguous()
            if observe is not None:
                observe(c, x0)
            _, committed = dit(x0, t, cond, chunk, commit=True)
            writer.commit(committed, list(range(sf, sf + 3)))
    return state, writer, (kb, ms, visual)


def _numpy_draws(rng: np.random.Generator, device: torch.device | str = "cpu"):
    """``draw(shape)``: float32 standard normal noise from a numpy generator (the trainer's stream,
    the same numbers on every device), on ``device``."""
    return lambda shape: torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(device)


@torch.no_grad()
def sample_x0(dit: CausalWanDiT, shape: tuple[int, ...], cond: torch.Tensor, chunk: ChunkInputs,
              schedule: FlowMatchSchedule, draw) -> torch.Tensor:
    """The product's sampler (as :meth:`~worldtrace_cli.engine.rollout.Rollout.step`: x0 from the flow at
    each step, moved to the next step's sigma by ``schedule.sampler``, :func:`~worldtrace_cli.model.sampler.next_x`)
    on one chunk: float32 x0 of ``shape`` [B, 16, 3, h, w]. ``draw(shape)`` gives each Gaussian draw
    (initial noise, then one per re-noising; ``euler`` draws only the initial noise)."""
    x = draw(shape)
    timesteps, sigmas = schedule.timesteps(), schedule.sigmas()
    for s, t in enumerate(timesteps):
        flow = dit(x, t.expand(shape[0], shape[2]).to(x.device), cond, chunk).float()
        x0 = flow_to_x0(x, flow, sigmas[s])
        if s < len(timesteps) - 1:
            x = next_x(x0, flow, sigmas[s + 1], schedule.sampler, lambda: draw(shape))
    return x0


def target_chunk_inputs(dit, clip, late_cond, target: int, state, writer, rows, past_edit=None):
    """ChunkInputs and cond_concat of chunk ``target`` of a clip or :class:`ClipBatch` reading
    ``writer``'s cache (``past_edit(list[LayerPast]) -> list[LayerPast]`` may change what is read:
    evaluation controls)."""
    sf = clip.frame_start + 3 * target
    writer.begin_chunk(sf)
    past = read_past(writer, dit.cfg.num_layers)
    if past_edit is not None:
        past = past_edit(past)
    state.cross_kv = None  # recomputed inside the graph so img_emb and the cross-attention K/V learn
    kb, ms, visual = rows
    return ChunkInputs(rollout=state, past=past, frame_start=sf, keyboard=kb, mouse=ms, visual_context=visual), cond_concat(clip, late_cond, sf, 3)


def sample_sigma(rng: np.random.Generator, schedule: FlowMatchSchedule, sampler_prob: float) -> float:
    """A training noise level: one of the sampler's sigmas with probability ``sampler_prob``, else
    ``shift * s / (1 + (shift - 1) s)`` for s ~ U(0, 1)."""
    if rng.random() < sampler_prob:
        sig = schedule.sigmas()
        return float(sig[int(rng.integers(len(sig)))])
    s = rng.random()
    return float(schedule.shift * s / (1 + (schedule.shift - 1) * s))


START_SHARE = 1 / 6  # default share of chunk-0 targets in a rollout-start clip (the first 3,965 steps of the shipped DiT)
def choose_target(rng: np.random.Generator, early: bool, start_share: float = START_SHARE) -> int:
    """The target chunk (0-2) of a clip: a rollout-start clip (``early``) trains chunk 0 with
    probability ``start_share``, else chunk 1 or 2 (1:4); a late clip chunk 1 or 2 (1:3). At the
    default share the draws are those of the shipped DiT's first 3,965 steps (``rng.choice([0, 1, 2, 2, 2, 2])``)."""
    if not early:
        return int(rng.choice([1, 2, 2, 2]))
    if start_share == START_SHARE:
        return int(rng.choice([0, 1, 2, 2, 2, 2]))
    return 0 if rng.random() < start_share else int(rng.choice([1, 2, 2, 2, 2]))


def self_generated_chunks(rng: np.random.Generator, early: bool, target: int, self_context: float) -> int:
    """How many context chunks before ``target`` the model generates itself: with probability
    ``self_context`` all of them in a rollout-start clip (as inference: the start image, then the
    model's own chunks), all but chunk 0 in a late clip (a late rollout never has an empty cache);
    else none (clean context). No draw is taken when ``self_context`` is 0 (older runs' streams)."""
    if self_context <= 0 or rng.random() >= self_context:
        return 0
    return target if early else max(target - 1, 0)


def context_sigma(rng: np.random.Generator, context_noise: float) -> float:
    """A clip's context noise level (``train dit --context-noise``): U(0, ``context_noise``), or 0
    without a draw when ``context_noise`` is 0 (older runs' random streams stay as they were)."""
    return float(rng.uniform(0.0, context_noise)) if context_noise > 0 else 0.0


def clip_loss(dit, clip: EncodedClip, late_cond, rng: np.random.Generator, schedule: FlowMatchSchedule,
              sampler_prob: float, return_weight: float, start_share: float = START_SHARE,
              self_context: float = 0.0, context_noise: float = 0.0) -> torch.Tensor:
    """Flow-matching loss of one clip's target chunk (see the module docstring): scalar float32."""
    early = clip.frame_start == 0
    target = choose_target(rng, early, start_share)
    generated = self_generated_chunks(rng, early, target, self_context)
    noise = context_sigma(rng, context_noise)
    batch = ClipBatch.of(clip)
    state, writer, rows = context_state(dit, batch, late_cond, target, generated=generated, schedule=schedule, rng=rng,
                                        context_sigmas=[noise])
    sigma = sample_sigma(rng, schedule, sampler_prob)
    eps = _numpy_draws(rng, clip.latents.device)(tuple(batch.latents[:, :, :3].shape))
    return target_losses(dit, batch, late_cond, target, state, writer, rows, [sigma], eps, return_weight)[0]


def target_losses(dit, batch: ClipBatch, late_cond, target: int, state, writer, rows, sigmas: list[float],
                  eps: torch.Tensor, return_weight: float) -> torch.Tensor:
    """Per-clip flow-matching losses [B] (float32) of chunk ``target`` of a :class:`ClipBatch`, after
    its context passes (:func:`context_state`): clip b's chunk is noised to ``sigmas[b]`` with
    ``eps[b]`` (``x_t = (1 - sigma) x0 + sigma eps``) and the mean squared error of the predicted
    flow against ``eps - x0`` is taken per latent frame, the frame where a loop returns weighted
    ``return_weight`` times (MG2 spec §10)."""
    chunk, cond = target_chunk_inputs(dit, batch, late_cond, target, state, writer, rows)
    x0 = batch.latents[:, :, 3 * target:3 * target + 3]
    sig = torch.tensor(sigmas, dtype=torch.float32, device=x0.device)
    xt = add_noise(x0, eps, sig.view(-1, 1, 1, 1, 1))
    t = torch.tensor([[sg * NUM_TRAIN_TIMESTEPS] * 3 for sg in sigmas], dtype=torch.float32, device=x0.device)
    flow = dit(xt, t, cond, chunk).float()
    err = (flow - (eps - x0)).pow(2).mean(dim=(1, 3, 4))  # [B, 3]: per clip and latent frame
    weights = torch.ones_like(err)
    for b, clip in enumerate(batch.clips):
        if clip.return_latent >= 0 and clip.return_latent // 3 == target:
            weights[b, clip.return_latent % 3] = return_weight
    return (err * weights).sum(1) / weights.sum(1)


def grouped_loss(dit, clips: list[EncodedClip], late_cond, rng: np.random.Generator, schedule: FlowMatchSchedule,
                 sampler_prob: float, return_weight: float, start_share: float = START_SHARE,
                 self_context: float = 0.0, context_noise: float = 0.0) -> torch.Tensor:
    """The mean flow-matching loss of ``clips`` (scalar float32), run as batches (``train dit
    --batched``): each clip draws its target chunk, self-generated context, context noise, sigma and noise as
    :func:`clip_loss` does (the same distributions; the numbers are drawn in another order), then the
    clips that share (absolute latent frames, target chunk, self-generated chunks) run their context
    passes and their target chunk as one :class:`ClipBatch`: one DiT call per chunk and group instead
    of one per clip, which is what lets a GPU's width be used."""
    plans = []
    for clip in clips:
        early = clip.frame_start == 0
        target = choose_target(rng, early, start_share)
        plans.append((clip.frame_start, target, self_generated_chunks(rng, early, target, self_context),
                      sample_sigma(rng, schedule, sampler_prob), context_sigma(rng, context_noise)))
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, plan in enumerate(plans):
        groups[plan[:3]].append(i)
    losses = []
    for (_, target, generated), members in sorted(groups.items()):
        batch = ClipBatch.of([clips[i] for i in members])
        state, writer, rows = context_state(dit, batch, late_cond, target, generated=generated, schedule=schedule,
                                            rng=rng, context_sigmas=[plans[i][4] for i in members])
        eps = _numpy_draws(rng, batch.latents.device)(tuple(batch.latents[:, :, :3].shape))
        losses.append(target_losses(dit, batch, late_cond, target, state, writer, rows,
                                    [plans[i][3] for i in members], eps, return_weight))
    return torch.cat(losses).mean()


__all__ = ["ClipBatch", "ClipPool", "START_SHARE", "cache_geometry", "choose_target", "clip_loss", "cond_concat",
           "context_sigma", "context_state", "grouped_loss", "sample_sigma", "sample_x0", "self_generated_chunks", "target_chunk_inputs",
           "target_losses"]
