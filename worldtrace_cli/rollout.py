"""The chunk loop: conditions -> denoising steps -> context pass and cache commit -> decode -> sinks.

:class:`Rollout` generates one chunk (3 latent frames) per :meth:`Rollout.step` through a cache
writer (MG2 spec §11, design.md §3). :func:`generate` is the ``worldtrace generate`` job: it loads
the model, conditions on an image, runs the rollout over a trajectory and streams the run folder
(``video.mp4``, ``chunks.jsonl``, ``summary.json``; design.md §4).
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from . import __version__
from .config import RunConfig
from .errors import InputError, RunError
from .memory import CacheGeometry, CacheWriter, build_writer
from .model.dit import ChunkInputs, LayerPast
from .model.sampler import FlowMatchSchedule, add_noise, chunk_generator, flow_to_x0

log = logging.getLogger("worldtrace")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available else cpu. Raises InputError for cuda without a GPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available (use --device cpu)")
    if name not in ("cpu", "cuda"):
        raise InputError(f"--device: must be auto, cuda or cpu, got {name!r}")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bf16 on cuda, fp32 on cpu."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def process_rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux /proc; peak RSS elsewhere)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Timer:
    """Wall-clock seconds per phase, synchronising CUDA so GPU work is attributed to its phase."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


@dataclass
class ChunkOutput:
    """One generated chunk: ``latents`` [1,16,3,h,w] float32 (normalised), ``frames`` uint8 [T,H,W,3]
    (T = 9 for chunk 0, 12 after) or None without a decoder, and its ``record`` for chunks.jsonl."""

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
        decoder: optional streaming VAE decoder with ``decode(latents) -> uint8 [T,H,W,3]``.
        noise: optional ``noise(chunk, draw, shape) -> Tensor`` replacing the seeded draws (draw 0 =
            the chunk's initial noise, draw s = the re-noising before step s); used to replay fixtures.
        on_step: optional ``on_step(chunk, step, x0)`` observer of every denoising step's x0.
    """

    def __init__(self, dit, writer: CacheWriter, conditioning, visual_context, keyboard, mouse,
                 schedule: FlowMatchSchedule, seed: int, device: torch.device, latent_hw: tuple[int, int],
                 decoder=None, frames_per_chunk: int = 3, noise=None, on_step=None):
        self.dit, self.writer, self.conditioning, self.decoder = dit, writer, conditioning, decoder
        self.noise, self.on_step = noise, on_step
        self.device, self.seed, self.frames_per_chunk = device, seed, frames_per_chunk
        self.dtype = next(dit.parameters()).dtype
        self.visual_context = visual_context.to(device, self.dtype)
        self.keyboard = keyboard.to(device, self.dtype)
        self.mouse = None if mouse is None else mouse.to(device, self.dtype)
        self.timesteps, self.sigmas = schedule.timesteps(), schedule.sigmas()
        self.latent_hw = latent_hw
        cfg = dit.cfg
        tokens = (latent_hw[0] // 2) * (latent_hw[1] // 2)
        self.geometry = CacheGeometry(cfg.num_layers, cfg.num_heads, cfg.head_dim, tokens, frames_per_chunk,
                                      cfg.local_attn_size - 1, device, self.dtype)
        writer.reset(self.geometry)
        self.state = dit.new_rollout_state()
        self.chunk = 0

    @torch.no_grad()
    def step(self) -> ChunkOutput:
        """Generate, commit and decode the next chunk.

        Raises:
            RunError: non-finite latents (names the chunk); nothing of this chunk is committed.
        """
        c, f = self.chunk, self.frames_per_chunk
        sf = c * f
        timer = _Timer(self.device)
        with timer.phase("cache"):
            self.writer.begin_chunk(sf)
            slots, positions = self.writer.slots(), self.writer.positions()
            kv_bytes = self.writer.kv_bytes()  # what this chunk reads, before its own commit
            past = [LayerPast(*self.writer.read(layer)) for layer in range(self.geometry.num_layers)]
            freq_scale = self.writer.temporal_frequency_scale()
        chunk = ChunkInputs(self.state, past, sf, self.keyboard, self.mouse, self.visual_context,
                            temporal_freq_scale=freq_scale)
        cond = self.conditioning.cond_concat(sf, f).to(self.device, self.dtype)
        shape = (1, 16, f, *self.latent_hw)
        if self.noise is None:
            gen = chunk_generator(self.seed, c)
            draw = lambda i: torch.randn(shape, generator=gen)  # noqa: E731  (draws in order)
        else:
            draw = lambda i: self.noise(c, i, shape)  # noqa: E731
        x = draw(0).to(self.device)
        with timer.phase("denoise"):
            for s, t in enumerate(self.timesteps):
                flow = self.dit(x, t.expand(1, f).to(self.device), cond, chunk)
                x0 = flow_to_x0(x, flow.float(), self.sigmas[s])
                if self.on_step is not None:
                    self.on_step(c, s, x0)
                if s < len(self.timesteps) - 1:
                    x = add_noise(x0, draw(s + 1).to(self.device), self.sigmas[s + 1])
        if not torch.isfinite(x0).all():
            raise RunError(f"chunk {c}: the denoised latents contain NaN or inf")
        with timer.phase("context"):
            self.dit(x0, torch.zeros(1, f, device=self.device), cond, chunk, commit=True)
        with timer.phase("cache"):
            self.writer.commit(chunk.committed, list(range(sf, sf + f)))
        del chunk
        frames = None
        if self.decoder is not None:
            with timer.phase("decode"):
                frames = self.decoder.decode(x0)
        self.chunk += 1
        record = {
            "chunk": c,
            "latent_frames": [sf, sf + f],
            "cache": {
                "writer": self.writer.name,
                "positions": self.writer.positions_scheme,
                "slots": slot_records(slots, positions, sf, kv_bytes // len(slots) if slots else 0),
                "kv_bytes": kv_bytes,
                "host_bytes": self.writer.host_bytes(),
                "events": self.writer.events(),
            },
            "timings_s": {k: round(v, 6) for k, v in timer.seconds.items()},
            "memory": memory_record(self.device),
            "latents": {"mean": round(x0.mean().item(), 6), "std": round(x0.std().item(), 6)},
        }
        return ChunkOutput(x0, frames, record)


def slot_records(slots, positions: torch.Tensor, frame_start: int, bytes_per_slot: int) -> list[dict]:
    """JSON records of the slots read by a chunk: kind, source latent frames, virtual position
    (absolute latent-frame index), offset from the chunk's first frame, bytes (all layers, K+V)."""
    out = []
    for slot, pos in zip(slots, positions.tolist()):
        frames = list(slot.frames)
        rec = {"kind": slot.kind}
        if len(frames) > 8 and frames == list(range(frames[0], frames[-1] + 1)):
            rec["frames"] = {"first": frames[0], "last": frames[-1], "count": len(frames)}
        else:
            rec["frames"] = frames
        rec.update({"offset": pos, "virtual_position": frame_start + pos, "bytes": bytes_per_slot})
        out.append(rec)
    return out


def memory_record(device: torch.device) -> dict:
    """Peak GPU bytes since the last reset (cuda) and current process RSS bytes."""
    rec = {"rss_bytes": process_rss_bytes()}
    if device.type == "cuda":
        rec["gpu_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return rec


def versions() -> dict:
    """Versions of Python, torch and the libraries around the core (for summary.json)."""
    import importlib.metadata as md

    out = {"worldtrace": __version__, "python": platform.python_version(), "torch": torch.__version__}
    for name in ("diffusers", "transformers", "imageio-ffmpeg", "safetensors"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    out["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    return out


def generate(cfg: RunConfig) -> dict:
    """Run ``worldtrace generate``: returns the summary dict also written to ``summary.json``.

    Inputs are validated (trajectory, image, flags, output folder) before any model is loaded.
    ``video.mp4`` and ``chunks.jsonl`` are appended chunk by chunk, so a run that dies keeps every
    finished chunk; ``summary.json`` is written only when the run completes.

    Raises:
        InputError, CheckpointError, OutputError, RunError: see :mod:`worldtrace_cli.errors`.
    """
    from tqdm import tqdm

    from .metrics import OnlineMetrics
    from .model.checkpoint import load_world_model
    from .model.conditioning import build_conditioning, load_image, preprocess_image
    from .model.vae import StreamingDecoder
    from .outputs import JsonlWriter, VideoStreamWriter, prepare_run_dir, write_json_atomic
    from .timeline import plot_cache_timeline
    from .trajectory import chunk_rows, load_trajectory, plan_actions

    started = time.time()
    preset = cfg.preset
    traj = load_trajectory(cfg.trajectory)
    if traj.mode != preset.mode:
        raise InputError(f"{cfg.trajectory}: mode {traj.mode!r} does not match preset {preset.name} "
                         f"(mode {preset.mode!r})")
    plan = plan_actions(traj, cfg.chunks)
    for note in plan.notes:
        log.info(note)
    image_path = cfg.image or traj.image
    if image_path is None:
        raise InputError(f"{cfg.trajectory}: no conditioning image: pass --image or set `image:` in the trajectory")
    pil_image = load_image(image_path)
    seed = cfg.seed if cfg.seed is not None else (traj.seed if traj.seed is not None else 0)
    writer = build_writer(cfg.memory, preset.dit.local_attn_size - preset.frames_per_chunk)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    run_dir = prepare_run_dir(cfg.output, cfg.overwrite)

    t0 = time.perf_counter()
    world = load_world_model(preset, cfg.checkpoint, cfg.random_weights, cfg.weights_seed, device, dtype,
                             cfg.hash_checkpoint)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        image = preprocess_image(pil_image, preset.height, preset.width).to(device, dtype)
        conditioning, visual_context = build_conditioning(image, world.vae, world.clip,
                                                          plan.num_chunks * preset.frames_per_chunk)
    cond_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rollout = Rollout(world.dit, writer, conditioning, visual_context, plan.keyboard[None],
                      None if plan.mouse is None else plan.mouse[None],
                      FlowMatchSchedule(preset.denoising_steps, preset.timestep_shift), seed, device,
                      (preset.height // 8, preset.width // 8), StreamingDecoder(world.vae),
                      preset.frames_per_chunk)
    scorer = OnlineMetrics(cfg.metrics, world.clip if cfg.metrics == "all" else None)
    waypoints: dict[int, list[str]] = {}
    for chunk_index, label in plan.waypoints:
        waypoints.setdefault(chunk_index, []).append(label)
    totals: dict[str, float] = {}
    records: list[dict] = []
    peak = {"rss_bytes": 0, "gpu_peak_bytes": 0}
    video = VideoStreamWriter(run_dir / "video.mp4", preset.width, preset.height, preset.fps)
    jsonl = JsonlWriter(run_dir / "chunks.jsonl")
    bar = tqdm(total=plan.num_chunks, unit="chunk", file=sys.stderr, disable=not cfg.progress,
               desc=f"{writer.name}")
    try:
        for c in range(plan.num_chunks):
            out = rollout.step()
            video.write(out.frames)
            rec = out.record
            rec["pixel_frames"] = list(chunk_rows(c))
            rec["actions"] = plan.chunk_actions[c]
            rec["waypoints"] = waypoints.get(c, [])
            with torch.no_grad():
                rec["metrics"] = scorer.add_chunk(out.latents, out.frames)
            jsonl.write(rec)
            records.append(rec)
            for k, v in rec["timings_s"].items():
                totals[k] = totals.get(k, 0.0) + v
            for k in peak:
                peak[k] = max(peak[k], rec["memory"].get(k, 0))
            bar.update(1)
    finally:
        bar.close()
        jsonl.close()
        video.close()
        if records:
            plot_cache_timeline(records, run_dir / "cache_timeline.png")
    gen_s = sum(totals.values())
    summary = {
        "status": "complete",
        "run_dir": str(run_dir),
        "command": sys.argv,
        "config": cfg.to_dict(),
        "resolved": {"seed": seed, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
                     "trajectory": str(cfg.trajectory.resolve()), "waypoints": plan.waypoints,
                     "chunks": plan.num_chunks, "image": str(image_path), "notes": plan.notes},
        "checkpoint": world.files,
        "versions": versions(),
        "cache": {**writer.describe(), "kv_bytes": writer.kv_bytes(), "host_bytes": writer.host_bytes()},
        "metrics": scorer.summary(plan),
        "totals": {
            "chunks": plan.num_chunks,
            "latent_frames": plan.num_chunks * preset.frames_per_chunk,
            "pixel_frames": video.frames_written,
            "seconds": {"load": round(load_s, 3), "conditioning": round(cond_s, 3),
                        **{k: round(v, 3) for k, v in totals.items()}, "generate": round(gen_s, 3),
                        "wall": round(time.time() - started, 3)},
            "seconds_per_chunk": round(gen_s / plan.num_chunks, 4),
            "fps": round(video.frames_written / gen_s, 3) if gen_s else None,
            "peak_rss_bytes": peak["rss_bytes"],
            "gpu_peak_bytes": peak["gpu_peak_bytes"] if device.type == "cuda" else None,
        },
    }
    write_json_atomic(run_dir / "summary.json", summary)
    return summary
