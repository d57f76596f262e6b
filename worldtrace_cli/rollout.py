"""The chunk loop: denoising steps -> context pass and cache commit -> decode.

:class:`Rollout` generates one chunk (3 latent frames for MG2) per :meth:`Rollout.step` through a
cache writer (MG2 spec §11, design.md §3); :class:`DecodePipeline` decodes the chunks in order.
The model's geometry (latent channels, tokens per latent frame) comes from the DiT; the jobs build
rollouts through :class:`~worldtrace_cli.pipeline.Pipeline`.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .errors import RunError
from .runs.records import slot_records
from .schemas import SCHEMA_VERSION
from .memory import CacheGeometry, CacheWriter
from .model.dit import ChunkInputs, LayerPast
from .model.sampler import FlowMatchSchedule, chunk_generator, flow_to_x0, next_x

log = logging.getLogger("worldtrace")


def process_rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


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


class Rollout:
    """Autoregressive chunk generation with a pluggable KV-cache writer.

    Args:
        dit: a :class:`~worldtrace_cli.model.dit.CausalWanDiT` on ``device``.
        writer: the self-attention cache writer (reset here).
        conditioning: object with ``cond_concat(start, count) -> [1,20,count,h,w]`` (image latents + mask).
        visual_context: [1, 257, clip_dim] CLIP tokens.
        keyboard: [1, R, kd] action rows (pixel frames); mouse: [1, R, 2] or None.
        schedule: the sampler's :class:`FlowMatchSchedule`.
        seed: noise seed; chunk c draws from ``chunk_generator(seed, c)`` (CPU, then moved).
        device: where the DiT runs; latent_hw: latent grid (pixels / 8); frames_per_chunk: latent
            frames per chunk (3). Decoding is :class:`DecodePipeline`'s job.
        noise: optional ``noise(chunk, draw, shape) -> Tensor`` replacing the seeded draws (draw 0 =
            the chunk's initial noise, draw s = the re-noising before step s); used to replay fixtures.
        on_step: optional ``on_step(chunk, step, x0)`` observer of every denoising step's x0.
        poses: optional float64 [N, 4, 4] camera-to-world pose of every latent frame, handed to the
            writer (:meth:`~worldtrace_cli.memory.base.CacheWriter.set_poses`).
    """

    def __init__(self, dit, writer: CacheWriter, conditioning, visual_context, keyboard, mouse,
                 schedule: FlowMatchSchedule, seed: int, device: torch.device, latent_hw: tuple[int, int],
                 frames_per_chunk: int = 3, noise=None, on_step=None, poses: torch.Tensor | None = None):
        self.dit, self.writer, self.conditioning = dit, writer, conditioning
        self.noise, self.on_step = noise, on_step
        self.device, self.seed, self.frames_per_chunk = device, seed, frames_per_chunk
        self.dtype = next(dit.parameters()).dtype
        self.visual_context = visual_context.to(device, self.dtype)
        self.keyboard = keyboard.to(device, self.dtype)
        self.mouse = None if mouse is None else mouse.to(device, self.dtype)
        self.timesteps, self.sigmas = schedule.timesteps(), schedule.sigmas()
        self.sampler = schedule.sampler
        self.latent_hw = latent_hw
        cfg = dit.cfg
        tokens = dit.tokens_per_frame(latent_hw)
        self.latent_channels = cfg.out_dim
        self.geometry = CacheGeometry(cfg.num_layers, cfg.num_heads, cfg.head_dim, tokens, frames_per_chunk,
                                      cfg.local_attn_size - 1, device, self.dtype)
        writer.reset(self.geometry)
        writer.set_poses(poses)
        self.state = dit.new_rollout_state()
        self.chunk = 0

    def _dit(self, *args, **kwargs):
        """One DiT call; a torch.compile failure (no C++ compiler, no Triton, an Inductor bug) becomes
        a one-line RunError naming --compile instead of a long traceback (details at debug level)."""
        try:
            return self.dit(*args, **kwargs)
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

    @torch.no_grad()
    def step(self) -> ChunkOutput:
        """Generate and commit the next chunk (decoding: :class:`DecodePipeline`).

        Raises:
            RunError: non-finite latents (names the chunk), or a failed torch.compile; nothing of
                this chunk is committed.
        """
        c, f = self.chunk, self.frames_per_chunk
        sf = c * f
        timer = PhaseTimer(self.device)
        with timer.phase("cache"):
            read = begin_chunk(self.writer, sf, self.geometry.num_layers)  # before this chunk's commit
        chunk = ChunkInputs(rollout=self.state, past=read.past, frame_start=sf, keyboard=self.keyboard,
                            mouse=self.mouse, visual_context=self.visual_context, temporal_freq_scale=read.freq_scale)
        cond = self.conditioning.cond_concat(sf, f).to(self.device, self.dtype)
        draw = noise_draws(self.seed, c, (1, self.latent_channels, f, *self.latent_hw), self.noise)
        x = draw(0).to(self.device)
        with timer.phase("denoise"):
            for s, t in enumerate(self.timesteps):
                flow = self._dit(x, t.expand(1, f).to(self.device), cond, chunk).float()
                x0 = flow_to_x0(x, flow, self.sigmas[s])
                if self.on_step is not None:
                    self.on_step(c, s, x0)
                if s < len(self.timesteps) - 1:
                    x = next_x(x0, flow, self.sigmas[s + 1], self.sampler, lambda: draw(s + 1))
        if not torch.isfinite(x0).all():
            raise RunError(f"chunk {c}: the denoised latents contain NaN or inf")
        with timer.phase("context"):
            _, committed = self._dit(x0, torch.zeros(1, f, device=self.device), cond, chunk, commit=True)
        with timer.phase("cache"):
            self.writer.commit(committed, list(range(sf, sf + f)))
        del chunk
        self.chunk += 1
        record = chunk_record(self.writer, self.geometry, c, sf, read, timer, x0)
        return ChunkOutput(x0, None, record)


class DecodePipeline:
    """Decodes generated chunks in order with a streaming VAE decoder, either at once or one chunk
    behind generation so that chunk c's decode overlaps chunk c+1's DiT work.

    Overlap runs the decode on a side CUDA stream (waiting on the main stream's work so far; frames
    come back through pinned memory) on CUDA, and on a single worker thread on CPU. The decoder is
    stateful (causal feature cache), so chunks are always decoded in submission order, by one
    stream or thread. :meth:`flush` waits for everything submitted: call it before reading or
    loading the decoder's state (resume states) and at the end. Build the pipeline after restoring
    a decoder state: the restored tensors were made on the main stream, and the first side-stream
    decode marks them as used there, so the allocator does not hand their memory to the next
    chunk's DiT while the decode still reads them.

    Each returned :class:`ChunkOutput` has ``frames`` (uint8 [T, H, W, 3] on the CPU), its record's
    ``memory`` re-read after the decode (peak GPU bytes include it), and in ``timings_s``: ``decode`` (seconds the decode itself took: side-stream CUDA events or
    the worker's wall clock) and with overlap ``decode_wait`` (seconds generation waited for it:
    the part of the decode on the critical path).

    Args:
        decoder: a :class:`~worldtrace_cli.model.vae.StreamingDecoder`.
        device: the device generation runs on.
        overlap: decode one chunk behind (True) or at submission (False).
    """

    def __init__(self, decoder, device: torch.device, overlap: bool = False):
        self.decoder, self.device, self.overlap = decoder, torch.device(device), overlap
        self._pending: list = []
        self._stream = self._pool = None
        self._state_marked = False
        if overlap and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
        elif overlap:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="worldtrace-decode")

    def _decode_timed(self, latents: torch.Tensor):
        start = time.perf_counter()
        frames = self.decoder.decode(latents)
        return frames, time.perf_counter() - start

    def _launch(self, out: ChunkOutput):
        if self._stream is None:
            return self._pool.submit(self._decode_timed, out.latents)
        main = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(main)  # the latents (and a restored decoder state) are ready
        if not self._state_marked:  # a restored feature cache was allocated on the main stream
            for t in self.decoder.state()["cache"]:
                if isinstance(t, torch.Tensor) and t.is_cuda:
                    t.record_stream(self._stream)
            self._state_marked = True
        with torch.cuda.stream(self._stream):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            pixels = self.decoder.decode_pixels(out.latents)
            host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
            host.copy_(pixels, non_blocking=True)
            end.record()
        out.latents.record_stream(self._stream)  # the allocator must not reuse them under the decode
        return host, pixels, begin, end

    def _collect(self, out: ChunkOutput, handle) -> ChunkOutput:
        start = time.perf_counter()
        if self._stream is None:
            out.frames, seconds = handle.result()
        else:
            host, _pixels, begin, end = handle
            end.synchronize()
            out.frames, seconds = host, begin.elapsed_time(end) / 1000.0
        timings = out.record["timings_s"]
        timings["decode"] = round(seconds, 6)
        timings["decode_wait"] = round(time.perf_counter() - start, 6)
        out.record["memory"] = memory_record(self.device)
        return out

    def submit(self, out: ChunkOutput) -> list[ChunkOutput]:
        """Queue ``out`` (its ``latents`` [1, 16, F, h, w]) for decoding; returns the chunks whose
        frames are ready, oldest first (without overlap: ``out`` itself; with: the previous chunk)."""
        if not self.overlap:
            out.frames, seconds = self._decode_timed(out.latents)
            out.record["timings_s"]["decode"] = round(seconds, 6)
            out.record["memory"] = memory_record(self.device)
            return [out]
        self._pending.append((out, self._launch(out)))
        ready = []
        while len(self._pending) > 1:
            ready.append(self._collect(*self._pending.pop(0)))
        return ready

    def flush(self) -> list[ChunkOutput]:
        """Wait for every queued chunk; returns them with their frames, oldest first."""
        ready = [self._collect(*item) for item in self._pending]
        self._pending.clear()
        return ready

    def close(self) -> None:
        """Drop what is still queued (after a failure) and stop the worker thread."""
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def chunk_record(writer: CacheWriter, geometry: CacheGeometry, chunk: int, frame_start: int, read: CacheRead,
                 timer: PhaseTimer, x0: torch.Tensor) -> dict:
    """The ``chunks.jsonl`` record of a generated chunk (before decoding): index, latent frames
    ``[start, end)``, the cache as read (writer, scheme, :func:`slot_records`, trained and largest
    offset, KV bytes read, host bytes, events), phase seconds, memory and the latents' mean / std.
    ``read`` is what the chunk read (:func:`begin_chunk`), taken before its commit."""
    f = geometry.frames_per_chunk
    slots, tokens = read.slots, read.tokens
    token_bytes = writer.token_bytes()
    per_slot = [int(col[0]) if bool((col == col[0]).all()) else round(col.double().mean().item(), 2)
                for col in tokens.T] if len(slots) else []  # tokens per layer (mean when layers differ)
    slot_bytes = [int(col.sum()) * token_bytes for col in tokens.T] if len(slots) else []
    slot_recs = slot_records(slots, read.positions.tolist(), frame_start, per_slot, slot_bytes, f)
    return {
        "schema_version": SCHEMA_VERSION,
        "chunk": chunk,
        "latent_frames": [frame_start, frame_start + f],
        "cache": {
            "writer": writer.name,
            "positions": writer.positions_scheme,
            "slots": slot_recs,
            "trained_offset": geometry.trained_offset,
            "slot_count": len(slots),
            "max_offset": max((s["max_offset"] for s in slot_recs), default=None),
            "kv_bytes": read.kv_bytes,
            "host_bytes": writer.host_bytes(),
            "events": writer.events(),
        },
        "timings_s": {k: round(v, 6) for k, v in timer.seconds.items()},
        "memory": memory_record(timer.device),
        "latents": {"mean": round(x0.mean().item(), 6), "std": round(x0.std().item(), 6)},
    }


@dataclass
class CacheRead:
    """What a chunk reads from its writer, taken once before the chunk's commit: ``slots``,
    ``positions`` [S] float64, ``tokens`` int64 [L, S] (:meth:`CacheWriter.slot_tokens`), ``kv_bytes``
    (bytes read on the compute device), ``past`` (per layer :class:`LayerPast`) and
    ``freq_scale`` (YaRN's temporal frequency multipliers or None)."""

    slots: list
    positions: torch.Tensor
    tokens: torch.Tensor
    kv_bytes: int
    past: list[LayerPast]
    freq_scale: torch.Tensor | None


def begin_chunk(writer: CacheWriter, frame_start: int, num_layers: int) -> CacheRead:
    """``writer.begin_chunk(frame_start)`` and everything the chunk reads from it (design.md §3), for
    both rollouts: each writer query once per chunk (token counts once per layer)."""
    writer.begin_chunk(frame_start)
    slots, positions = writer.slots(), writer.positions()
    kv_bytes = writer.kv_bytes()
    past = read_past(writer, num_layers)
    t = writer.geometry.tokens_per_frame
    tokens = torch.stack([torch.full((len(slots),), t, dtype=torch.int64) if p.counts is None else p.counts.to(torch.int64)
                          for p in past]) if num_layers else torch.zeros(0, len(slots), dtype=torch.int64)
    return CacheRead(slots, positions, tokens, kv_bytes, past, writer.temporal_frequency_scale())


def noise_draws(seed: int, chunk: int, shape: tuple[int, ...], noise=None):
    """``draw(i)``: chunk ``chunk``'s i-th Gaussian draw of ``shape`` (0 = initial noise, s = the
    re-noising before step s), float32 on the CPU from ``chunk_generator(seed, chunk)`` in order, or
    from ``noise(chunk, i, shape)`` when given (fixture replays). Shared by both rollouts, so a
    resumed run draws the same numbers."""
    if noise is not None:
        return lambda i: noise(chunk, i, shape)
    gen = chunk_generator(seed, chunk)
    return lambda i: torch.randn(shape, generator=gen)


def read_past(writer: CacheWriter, num_layers: int) -> list[LayerPast]:
    """Every layer's :class:`~worldtrace_cli.model.chunk.LayerPast` of the chunk ``writer`` began
    (canonical K, V, per-slot positions and, for compressed slots, per-slot token counts): what the
    DiT reads this chunk. Used by both rollouts, training and its evaluation (design.md §3)."""
    return [LayerPast(*writer.read(layer), writer.token_counts(layer)) for layer in range(num_layers)]


def memory_record(device: torch.device) -> dict:
    """Peak GPU bytes since the last reset (cuda) and current process RSS bytes."""
    rec = {"rss_bytes": process_rss_bytes()}
    if device.type == "cuda":
        rec["gpu_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return rec
