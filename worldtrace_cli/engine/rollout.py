"""The one chunk loop: denoising steps -> context pass and cache commit, for every backbone.

:class:`ChunkRollout` generates one chunk per :meth:`ChunkRollout.step` through a cache writer
(MG2 spec §11, lingbot-architecture.md §9.1, docs/architecture.md §1): it reads the writer, draws
the chunk's noise, runs the denoising steps, checks the latents, runs the context pass, commits it
and builds the record. A backbone supplies only its conditioning and its DiT calls, as five
hooks (:meth:`~ChunkRollout.chunk_inputs`, :meth:`~ChunkRollout.flow`, :meth:`~ChunkRollout.to_x0`,
:meth:`~ChunkRollout.renoise`, :meth:`~ChunkRollout.context`), each given the chunk's
:class:`~worldtrace_cli.engine.feed.ChunkRequest`: :class:`Rollout` here for MG2,
:class:`~worldtrace_cli.engine.lingbot_rollout.LingbotRollout` for LingBot-World and
:class:`~worldtrace_cli.engine.text_rollout.TextRollout` for Self-Forcing / LongLive.
:class:`~worldtrace_cli.engine.decode.DecodePipeline` decodes the chunks in order and
:mod:`worldtrace_cli.engine.record` builds their records. The model's geometry (latent channels,
tokens per latent frame) comes from the DiT; the jobs build rollouts through
:class:`~worldtrace_cli.engine.pipeline.Pipeline`.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..errors import RunError
from ..memory import CacheGeometry, CacheWriter
from ..model.attention_stats import AttentionProbe
from ..model.dit import ChunkInputs
from .cache_read import CacheRead, WriterPast, begin_chunk, noise_draws, read_past  # noqa: F401  (re-exported)
from .feed import ChunkRequest, ConditioningFeed
from ..model.sampler import NUM_TRAIN_TIMESTEPS, FlowMatchSchedule, add_noise, flow_to_x0, next_x
from .record import chunk_record

log = logging.getLogger("worldtrace")


class PhaseTimer:
    """Wall-clock seconds per phase, synchronising the current CUDA stream so its GPU work is
    attributed to its phase (a decode on a side stream is not waited for)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        # the current stream only: a decode running on a side stream (DecodePipeline) keeps going
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


@dataclass
class ChunkOutput:
    """One generated chunk: ``latents`` [1,16,3,h,w] float32 (normalised), ``frames`` uint8 [T,H,W,3]
    (T = 9 for chunk 0, 12 after) once :class:`DecodePipeline` decoded it (None before), and its
    ``record`` for chunks.jsonl."""

    latents: torch.Tensor
    frames: torch.Tensor | None
    record: dict


class ChunkRollout:
    """The chunk loop shared by every backbone: a subclass sets up its DiT and conditioning, calls
    :meth:`_setup`, and implements the hooks; :meth:`step` is written once.

    Attributes (set by :meth:`_setup`): ``dit``, ``writer``, ``geometry`` (the writer's
    :class:`~worldtrace_cli.memory.CacheGeometry`), ``state`` (the DiT's rollout state: action or
    camera caches), ``chunk`` (chunks generated), ``seed``, ``noise``, ``on_step``, ``device``,
    ``dtype``, ``latent_hw``, ``frames_per_chunk``, ``latent_channels``, ``num_steps`` (denoising
    calls per chunk), ``feed`` (a rollout built from a whole run's inputs: its own
    :class:`~worldtrace_cli.engine.feed.ConditioningFeed`, else None). Nothing of a chunk is kept on the
    rollout between its hooks: the step hands each hook what it needs (the request, the attention probe,
    the noise draw).
    """

    def _setup(self, dit, writer: CacheWriter, seed: int, device: torch.device, latent_hw: tuple[int, int],
               frames_per_chunk: int, trained_offset: int, dtype: torch.dtype, num_steps: int, noise=None,
               on_step=None, poses: torch.Tensor | None = None) -> None:
        """The loop's state: the writer reset to the DiT's geometry (``trained_offset``: the largest
        query-key offset the model was trained on, in latent frames) and given ``poses``, a fresh
        rollout state, chunk 0."""
        self.dit, self.writer = dit, writer
        self.noise, self.on_step, self.seed = noise, on_step, seed
        self.device, self.dtype, self.latent_hw, self.frames_per_chunk = device, dtype, latent_hw, frames_per_chunk
        self.num_steps = num_steps
        cfg = dit.cfg
        self.latent_channels = cfg.out_dim
        ranks, group = getattr(dit, "head_split", (1, None))  # --split-heads: this process's heads only
        self.geometry = CacheGeometry(cfg.num_layers, cfg.num_heads // ranks, cfg.head_dim,
                                      dit.tokens_per_frame(latent_hw), frames_per_chunk, trained_offset, device, dtype,
                                      group)
        writer.reset(self.geometry)
        if poses is not None or not writer.needs_poses:  # a fed rollout's pose writer gets them per request
            writer.set_poses(poses)
        self.state = dit.new_rollout_state()
        self.chunk = 0
        self.attention_queries: int | None = None  # None: no attention stats (measure_attention)
        self.prefix: torch.Tensor | None = None  # a real video's latents, committed instead of generated (set_prefix)
        self.feed = None  # a whole run's own ConditioningFeed (the subclass sets it), for step() without a request

    def restore(self, state: dict, next_chunk: int) -> None:
        """Continue from a saved run: the rollout state's :meth:`state_dict` (action or camera caches, a
        text rollout's history) and the next chunk to make (a resume state, a saved or forked session).

        Raises:
            KeyError / ValueError / TypeError: a state that does not fit; ValueError: a negative chunk."""
        if next_chunk < 0:
            raise ValueError(f"next chunk must be >= 0, got {next_chunk}")
        self.state.load_state_dict(state)
        self.chunk = int(next_chunk)

    def skip(self, x0: torch.Tensor) -> None:
        """Count a chunk whose K/V were committed to the writer outside :meth:`step` (the memory plan's
        fill), its clean latents ``x0`` [1, C, F, h, w] seen by :meth:`finish_chunk`."""
        self.chunk += 1
        self.finish_chunk(x0)

    def set_prefix(self, latents: torch.Tensor | None) -> None:
        """Continue a real video: the chunks its ``latents`` cover are not generated but committed as
        they are, each through the same context pass and writer commit as a generated chunk (so
        every writer sees a real past exactly as it would see its own: landmark detection, field
        averaging, retrieval poses), and generation goes on after them.

        Args:
            latents: float32 ``[1, C, K * F, h, w]``, the normalised VAE latents of the prefix's
                ``K`` whole chunks (:meth:`~worldtrace_cli.engine.base.PipelineBase.encode_prefix`), or
                None (no prefix).
        Raises:
            ValueError: latents of another channel count or latent grid, or not a whole number of chunks.
        """
        if latents is None:
            self.prefix = None
            return
        f, (h, w) = self.frames_per_chunk, self.latent_hw
        if (latents.dim() != 5 or latents.shape[0] != 1 or latents.shape[1] != self.latent_channels
                or tuple(latents.shape[3:]) != (h, w) or latents.shape[2] == 0 or latents.shape[2] % f):
            raise ValueError(f"prefix latents {list(latents.shape)}: expected [1, {self.latent_channels}, "
                             f"K * {f}, {h}, {w}]")
        self.prefix = latents.detach().float().cpu()

    @property
    def prefix_chunks(self) -> int:
        """Chunks the prefix covers (0 without one)."""
        return 0 if self.prefix is None else self.prefix.shape[2] // self.frames_per_chunk

    def measure_attention(self, queries: int = 0) -> None:
        """Measure each chunk's attention per cache slot from now on (``--attention-stats``): at the
        chunk's last denoising step, every layer's share of the softmax mass on each slot and on the
        chunk itself (:class:`~worldtrace_cli.model.attention_stats.AttentionProbe`), into the
        record's ``cache.attention`` and each slot's ``attention``. ``queries``: a seeded sample of
        that many query tokens per layer (0: all). The frames are unchanged.

        Raises:
            ValueError: a negative ``queries``."""
        if queries < 0:
            raise ValueError(f"attention queries must be >= 0, got {queries}")
        self.attention_queries = int(queries)

    # -- the backbone's hooks ---------------------------------------------------------------------
    def check_chunk(self, chunk: int, frame_start: int, request: ChunkRequest) -> None:
        """Refuse a chunk the backbone cannot make (RunError); default: any."""

    def prepare_chunk(self, chunk: int, frame_start: int, timer: PhaseTimer, request: ChunkRequest) -> list[dict]:
        """Work on the cache before the chunk reads it (the text backbone's prompt-switch re-cache,
        timed in ``timer``'s phases when there is work: no stream synchronisation otherwise);
        returns events for the chunk's record. Default: none."""
        return []

    def finish_chunk(self, x0: torch.Tensor) -> None:
        """See the chunk's committed clean latents [1, C, F, h, w] (the text backbone keeps its last
        window for a re-cache). Default: nothing."""

    def chunk_inputs(self, read: "CacheRead", frame_start: int, frames: int,
                     request: ChunkRequest) -> tuple[object, torch.Tensor]:
        """(the DiT's per-chunk inputs, holding ``read.past``; the chunk's conditioning channels on
        the device) for latent frames ``frame_start .. frame_start + frames - 1``, from the chunk's
        ``request`` (its action rows, camera or prompt)."""
        raise NotImplementedError

    def flow(self, x: torch.Tensor, step: int, inputs, cond: torch.Tensor, probe=None) -> torch.Tensor:
        """The DiT's flow prediction for noisy latents ``x`` [1, C, F, h, w] at denoising ``step``;
        ``probe``: the chunk's :class:`~worldtrace_cli.model.attention_stats.AttentionProbe` at its last
        step when attention is measured (hand it to :meth:`call_dit`), else None."""
        raise NotImplementedError

    def to_x0(self, x: torch.Tensor, flow: torch.Tensor, step: int) -> torch.Tensor:
        """The clean latents the sampler reads off ``flow`` at ``step``."""
        raise NotImplementedError

    def renoise(self, x0: torch.Tensor, flow: torch.Tensor, step: int, draw) -> torch.Tensor:
        """The noisy latents of ``step + 1`` (``draw()``: the chunk's next Gaussian draw, CPU float32,
        drawn only by samplers that use it)."""
        raise NotImplementedError

    def context(self, x0: torch.Tensor, inputs, cond: torch.Tensor, draw=None):
        """The context pass at t = 0 over the clean latents: the per-layer canonical K/V to commit.
        ``draw()``: the chunk's next Gaussian draw after its denoising draws (a context pass that
        noises its input), or None (the memory plan: none needed)."""
        raise NotImplementedError

    def call_dit(self, x, t, cond, inputs, *, commit: bool = False, probe=None):
        """One DiT call on the chunk's ``inputs`` (``probe``: the attention probe it measures, only for
        this call); a torch.compile failure (no C++ compiler, no Triton, an Inductor bug) becomes
        a one-line RunError naming --compile instead of a long traceback (details at debug level)."""
        if probe is not None:
            inputs.attention = probe  # the DiT's interface (model/chunk.py:CacheView); this call only
        try:
            return self.dit(x, t, cond, inputs, commit=commit) if commit else self.dit(x, t, cond, inputs)
        except Exception as exc:
            mode = getattr(self.dit, "compile_mode", "none")
            from torch._dynamo.exc import TorchDynamoException

            if mode == "none" or not isinstance(exc, TorchDynamoException):
                raise
            log.debug("torch.compile failure", exc_info=True)
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            reason = lines[0] if lines else type(exc).__name__
            raise RunError(f"chunk {self.chunk}: --compile {mode} failed ({reason[:300]}); run without --compile, "
                           f"or give torch a working compiler (a C++ compiler on CPU, Triton on CUDA)") from None
        finally:
            if probe is not None:
                inputs.attention = None

    @torch.no_grad()
    def step(self, request: ChunkRequest | None = None) -> ChunkOutput:
        """Generate and commit the next chunk (decoding: :class:`DecodePipeline`).

        Args:
            request: the chunk's conditioning (:class:`~worldtrace_cli.engine.feed.ChunkRequest`: its
                index, action rows, the camera poses so far, its prompt); None: the next request of the
                rollout's own :attr:`feed` (one built from a whole run's inputs: a fixture replay).
        Returns:
            :class:`ChunkOutput` with the clean latents [1, C, F, h, w] float32 and the chunk's record.
        Raises:
            RunError: a chunk the backbone cannot make, non-finite latents (names the chunk), or a
                failed torch.compile; nothing of this chunk is committed.
            ValueError: a request for another chunk, or none for a rollout without its own feed.
        """
        if request is None:
            if self.feed is None:
                raise ValueError(f"chunk {self.chunk}: this rollout is fed chunk by chunk: step(request)")
            request = self.feed.request(self.chunk)
        c, f = request.chunk, self.frames_per_chunk
        start = c * f
        if c != self.chunk:
            raise ValueError(f"a request for chunk {c}, but the rollout is at chunk {self.chunk}")
        self.check_chunk(c, start, request)
        if request.poses is not None:  # the camera so far: the pose writers read the chunk's and the past's
            self.writer.set_poses(request.poses)
        elif self.writer.needs_poses and self.writer.frame_poses is None:
            self.writer.set_poses(None)  # InputError: this writer retrieves by pose and none came
        timer = PhaseTimer(self.device)
        before = self.prepare_chunk(c, start, timer, request)
        with timer.phase("cache"):
            read = begin_chunk(self.writer, start, self.geometry.num_layers)  # before this chunk's commit
        inputs, cond = self.chunk_inputs(read, start, f, request)
        given = c < self.prefix_chunks  # a real video's chunk: committed as it is, not generated
        probe = None
        if self.attention_queries is not None and not given:  # measured at the last denoising step (docs/attention.md)
            probe = AttentionProbe(read.tokens, self.attention_queries, self.seed, c, self.geometry.head_group)
        draw = noise_draws(self.seed, c, (1, self.latent_channels, f, *self.latent_hw), self.noise)
        if given:  # no noise drawn: the clip's latents are the chunk's x0
            x0 = self.prefix[:, :, start:start + f].to(self.device)
        else:
            x = draw(0).to(self.device)
        with timer.phase("denoise"):
            for s in range(0 if given else self.num_steps):
                flow = self.flow(x, s, inputs, cond, probe if s == self.num_steps - 1 else None)
                x0 = self.to_x0(x, flow, s)
                if self.on_step is not None:
                    self.on_step(c, s, x0)
                if s < self.num_steps - 1:
                    x = self.renoise(x0, flow, s, lambda: draw(s + 1))
        if not torch.isfinite(x0).all():
            raise RunError(f"chunk {c}: the denoised latents contain NaN or inf")
        with timer.phase("context"):
            committed = self.context(x0, inputs, cond, lambda: draw(self.num_steps))
        with timer.phase("cache"):
            self.writer.commit(committed, list(range(start, start + f)))
        del inputs
        self.chunk += 1
        self.finish_chunk(x0)
        record = chunk_record(self.writer, self.geometry, c, start, read, timer, x0, probe)
        if given:
            record["prefix"] = True
        if before:
            record["cache"]["events"] = before + record["cache"]["events"]
        return ChunkOutput(x0, None, record)


class Rollout(ChunkRollout):
    """MG2's backbone in the chunk loop (:class:`ChunkRollout`): 3 latent frames per chunk,
    conditioning = image latents + mask and CLIP tokens, the keyboard/mouse rows, the flow-matching
    sampler.

    Args:
        dit: a :class:`~worldtrace_cli.model.dit.CausalWanDiT` on ``device``.
        writer: the self-attention cache writer (reset here).
        conditioning: object with ``cond_concat(start, count) -> [1,20,count,h,w]`` (image latents + mask).
        visual_context: [1, 257, clip_dim] CLIP tokens.
        keyboard: [1, R, kd] action rows (pixel frames) of a whole run, which then feeds itself (its
            :attr:`feed`: :meth:`~worldtrace_cli.engine.feed.ConditioningFeed.whole`),
            or None: each :meth:`step` is given its chunk's rows (a live session); mouse: [1, R, 2] or None.
        schedule: the sampler's :class:`FlowMatchSchedule`.
        seed: noise seed; chunk c draws from ``chunk_generator(seed, c)`` (CPU, then moved).
        device: where the DiT runs; latent_hw: latent grid (pixels / 8); frames_per_chunk: latent
            frames per chunk (3). Decoding is :class:`DecodePipeline`'s job.
        noise: optional ``noise(chunk, draw, shape) -> Tensor`` replacing the seeded draws (draw 0 =
            the chunk's initial noise, draw s = the re-noising before step s); used to replay fixtures.
        on_step: optional ``on_step(chunk, step, x0)`` observer of every denoising step's x0.
        poses: optional float64 [N, 4, 4] camera-to-world pose of every latent frame of the whole run,
            handed to the writer (:meth:`~worldtrace_cli.memory.base.CacheWriter.set_poses`).
        context_noise: the context pass's timestep (0-999; the preset's ``context_noise``): 0 is MG2's
            clean pass, else :meth:`context` noises the chunk's latents first.
    """

    def __init__(self, dit, writer: CacheWriter, conditioning, visual_context, keyboard, mouse,
                 schedule: FlowMatchSchedule, seed: int, device: torch.device, latent_hw: tuple[int, int],
                 frames_per_chunk: int = 3, noise=None, on_step=None, poses: torch.Tensor | None = None,
                 context_noise: int = 0):
        dtype = next(dit.parameters()).dtype
        self.conditioning = conditioning
        self.visual_context = visual_context.to(device, dtype)
        self.timesteps, self.sigmas = schedule.timesteps(), schedule.sigmas()
        self.sampler = schedule.sampler
        self.context_noise = context_noise
        self._setup(dit, writer, seed, device, latent_hw, frames_per_chunk, dit.cfg.local_attn_size - 1, dtype,
                    len(self.timesteps), noise, on_step, poses)
        if keyboard is not None:
            self.feed = ConditioningFeed.whole(keyboard[0], None if mouse is None else mouse[0], poses)

    def chunk_inputs(self, read: "CacheRead", frame_start: int, frames: int, request: ChunkRequest):
        mouse = None if request.mouse is None else request.mouse[None].to(self.device, self.dtype)
        inputs = ChunkInputs(rollout=self.state, past=read.past, frame_start=frame_start,
                             keyboard=request.keyboard[None].to(self.device, self.dtype), mouse=mouse,
                             first_row=request.first_row, visual_context=self.visual_context,
                             temporal_freq_scale=read.freq_scale)
        return inputs, self.conditioning.cond_concat(frame_start, frames).to(self.device, self.dtype)

    def flow(self, x, step, inputs, cond, probe=None):
        t = self.timesteps[step].expand(1, self.frames_per_chunk).to(self.device)
        return self.call_dit(x, t, cond, inputs, probe=probe).float()

    def to_x0(self, x, flow, step):
        return flow_to_x0(x, flow, self.sigmas[step])

    def renoise(self, x0, flow, step, draw):
        return next_x(x0, flow, self.sigmas[step + 1], self.sampler, draw)

    def context(self, x0, inputs, cond, draw=None):
        """The context pass (MG2 spec §10 step 4) at timestep ``context_noise``: over ``x0`` itself at 0
        (MG2's configs), else over ``x0`` noised to sigma = ``context_noise`` / 1000 with ``draw()``, the
        chunk's next Gaussian draw (after its denoising draws), as ``train dit --context-noise`` trains.

        Raises:
            ValueError: a ``context_noise`` pass given no ``draw``."""
        t = torch.full((1, self.frames_per_chunk), float(self.context_noise), device=self.device)
        if self.context_noise:
            if draw is None:
                raise ValueError(f"context_noise {self.context_noise}: the context pass needs the chunk's noise draw")
            x0 = add_noise(x0, draw().to(x0.device, x0.dtype), self.context_noise / NUM_TRAIN_TIMESTEPS)
        _, committed = self.call_dit(x0, t, cond, inputs, commit=True)
        return committed
