"""The ``worldtrace generate`` job: inputs -> model -> rollout -> run folder, safe to interrupt.

Nothing generated is lost:

* ``video.mp4`` and ``chunks.jsonl`` are appended chunk by chunk (fragmented MP4 written by a
  separate ffmpeg; JSONL records fsync'ed), so even SIGKILL leaves every finished chunk.
* Ctrl-C (SIGINT) or SIGTERM stops after the current chunk, saves a resume state and exits 130
  with the command that resumes. A second Ctrl-C aborts at once.
* Every ``save_every`` chunks a resume state is saved in ``RUN_DIR/resume/`` (writer contents and
  host stores, action caches, decoder cache, metric accumulators, chunk index; safetensors + JSON,
  no pickle). ``--resume RUN_DIR`` rebuilds the run from its saved config, restores the state, cuts
  the video and records back to the saved chunk and continues; noise depends only on (seed, chunk),
  so the resumed run generates bit-identical chunks (each record carries ``frames_sha256``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from .config import RunConfig
from .errors import InputError, Interrupted, OutputError  # noqa: F401  (Interrupted: re-exported)
from .memory import build_writer
from .outputs import STATE_NAME
from .model.dit import COMPILE_MODES, ROPE_PRECISIONS, configure_speed
from .rollout import DecodePipeline, Rollout, resolve_device, resolve_dtype, versions

log = logging.getLogger("worldtrace")
STATE_DIR = STATE_NAME
VIDEO_PART = "video.part.mp4"


class _StopFlag:
    """SIGINT/SIGTERM set a flag checked between chunks; a second SIGINT aborts immediately."""

    def __init__(self):
        self.signal: int | None = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no graceful stop, nothing else changes
                pass
        return self

    def _handle(self, signum, frame):
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum
        log.info("stopping after the current chunk (Ctrl-C again to abort now)")

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _state_parts(rollout: Rollout, decoder, scorer, progress: dict) -> dict:
    return {"writer": rollout.writer.__dict__ | {"geometry": None},
            "action_caches": {"mouse": rollout.state.mouse_kv, "keyboard": rollout.state.keyboard_kv},
            "decoder": decoder.state(),
            "scorer": scorer.__dict__ | {"tower": None, "truth": None},
            "progress": progress}


def _restore(rollout: Rollout, decoder, scorer, parts: dict, tensors: dict) -> dict:
    from .state import unpack

    # every tensor returns to the device it was saved from: host stores stay on the host
    writer_state = unpack(parts["writer"], tensors)
    writer_state.pop("geometry")
    rollout.writer.__dict__.update(writer_state)
    caches = unpack(parts["action_caches"], tensors)
    rollout.state.mouse_kv, rollout.state.keyboard_kv = caches["mouse"], caches["keyboard"]
    dec = unpack(parts["decoder"], tensors)
    decoder.load_state(dec)
    tower, truth = scorer.tower, scorer.truth
    scorer.__dict__.update(unpack(parts["scorer"], tensors, "cpu"))
    scorer.tower, scorer.truth = tower, truth
    return unpack(parts["progress"], tensors)


def _save(run_dir: Path, cfg: RunConfig, rollout: Rollout, decoder, scorer, progress: dict, inputs: dict) -> None:
    from .state import save_state

    save_state(run_dir / STATE_DIR, {"config": cfg.to_dict(), "next_chunk": rollout.chunk, "version": 1,
                                     "inputs": inputs}, _state_parts(rollout, decoder, scorer, progress))


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def resume_config(run_dir: str | Path) -> RunConfig:
    """The RunConfig saved with a run's resume state.

    Raises:
        InputError: no state, an unreadable one, or a folder whose run already completed.
    """
    from .state import load_meta

    run_dir = Path(run_dir)
    summary = run_dir / "summary.json"
    if summary.is_file() and json.loads(summary.read_text() or "{}").get("status") == "complete":
        raise InputError(f"{run_dir}: the run already completed; nothing to resume")
    meta = load_meta(run_dir / STATE_DIR)
    try:
        return RunConfig.from_dict(meta["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{run_dir}: resume state from another worldtrace version ({type(exc).__name__}: {exc})") from None


def run_generation(cfg: RunConfig, resume: bool = False) -> dict:
    """Run ``worldtrace generate``; returns the summary also written to ``summary.json``.

    Inputs are validated (trajectory, image, flags, output folder) before any model is loaded.
    With ``resume``, ``cfg`` must be :func:`resume_config` of ``cfg.output``.

    Raises:
        InputError, CheckpointError, OutputError, RunError: see :mod:`worldtrace_cli.errors`.
        Interrupted: Ctrl-C / SIGTERM; the resume state is saved first.
    """
    from tqdm import tqdm

    from .metrics import OnlineMetrics
    from .model.checkpoint import load_world_model
    from .model.conditioning import build_conditioning, load_image, preprocess_image
    from .model.sampler import FlowMatchSchedule
    from .model.vae import StreamingDecoder
    from .outputs import (JsonlWriter, VideoStreamWriter, concat_videos, prepare_run_dir, probe_video,
                          read_jsonl, truncate_video, write_json_atomic)
    from .state import load_state
    from .timeline import plot_cache_timeline
    from .trajectory import chunk_rows, frames_for_chunks, load_trajectory, plan_actions

    started = time.time()
    if not resume:  # absolute paths: a resume may start from another working directory
        cfg = replace(cfg, trajectory=Path(cfg.trajectory).resolve(), output=Path(cfg.output).resolve(),
                      image=None if cfg.image is None else Path(cfg.image).resolve(),
                      checkpoint=None if cfg.checkpoint is None else Path(cfg.checkpoint).resolve())
    preset = cfg.preset
    traj = load_trajectory(cfg.trajectory)
    if traj.mode != preset.mode:
        raise InputError(f"{cfg.trajectory}: mode {traj.mode!r} does not match preset {preset.name} "
                         f"(mode {preset.mode!r})")
    plan = plan_actions(traj, cfg.chunks)
    for note in plan.notes:
        log.info(note)
    truth = None
    if preset.world == "procedural" and cfg.image is None:
        from PIL import Image

        from .world.truth import GroundTruth

        if cfg.world_seed < 0:
            raise InputError(f"--world-seed: must be >= 0, got {cfg.world_seed}")
        truth = GroundTruth(cfg.world_seed, plan, preset.height, preset.width)
        if traj.image is not None:
            log.info(f"preset {preset.name}: the start image is world {cfg.world_seed}'s view, not the "
                     f"trajectory's image (--image overrides, without ground truth)")
        start_view = truth.start_image()
        pil_image, image_path = Image.fromarray(start_view), f"world:{cfg.world_seed}"
        image_sha = hashlib.sha256(start_view.tobytes()).hexdigest()
    else:
        image_path = cfg.image or traj.image
        if image_path is None:
            raise InputError(f"{cfg.trajectory}: no conditioning image: pass --image or set `image:` in the trajectory")
        if preset.world == "procedural":
            log.warning(f"--image replaces world {cfg.world_seed}'s start view: no ground-truth metrics")
        pil_image = load_image(image_path)
        image_sha = _sha256(image_path)
    seed = cfg.seed if cfg.seed is not None else (traj.seed if traj.seed is not None else 0)
    if seed < 0:
        raise InputError(f"--seed: must be >= 0, got {seed}")
    inputs = {"trajectory_sha256": _sha256(cfg.trajectory), "image_sha256": image_sha}
    writer = build_writer(cfg.memory, preset.dit.local_attn_size - preset.frames_per_chunk)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    if cfg.save_every < 0:
        raise InputError(f"--save-every: must be >= 0, got {cfg.save_every}")
    if cfg.rope_precision not in ROPE_PRECISIONS:
        raise InputError(f"--rope-precision: must be one of {', '.join(ROPE_PRECISIONS)}, got {cfg.rope_precision!r}")
    if cfg.compile not in COMPILE_MODES:
        raise InputError(f"--compile: must be one of {', '.join(COMPILE_MODES)}, got {cfg.compile!r}")
    run_dir = Path(cfg.output) if resume else prepare_run_dir(cfg.output, cfg.overwrite)

    t0 = time.perf_counter()
    world = load_world_model(preset, cfg.checkpoint, cfg.random_weights, cfg.weights_seed, device, dtype,
                             cfg.hash_checkpoint)
    configure_speed(world.dit, cfg.rope_precision, cfg.compile)
    if cfg.compile != "none":
        log.info(f"--compile {cfg.compile}: the first chunk includes compiling the DiT blocks")
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
                      (preset.height // 8, preset.width // 8), preset.frames_per_chunk)
    decoder = StreamingDecoder(world.vae)
    scorer = OnlineMetrics(cfg.metrics, world.clip if cfg.metrics == "all" else None, truth)
    progress = {"totals": {}, "peak": {"rss_bytes": 0, "gpu_peak_bytes": 0}}
    records: list[dict] = []
    video_path = run_dir / "video.mp4"
    start = 0
    if resume:
        meta, parts, tensors = load_state(run_dir / STATE_DIR)
        if meta.get("inputs") != inputs:
            raise InputError(f"{run_dir}: the trajectory or image changed since the run started; "
                             f"resume would not continue the same video (use --overwrite to start again)")
        start = meta["next_chunk"]
        (run_dir / "summary.json").unlink(missing_ok=True)
        # cut the video and records back to the saved chunk: the chunks after it are regenerated
        concat_videos([video_path, run_dir / VIDEO_PART], video_path)  # a part left by an earlier resume
        truncate_video(video_path, frames_for_chunks(start))
        records = [r for r in read_jsonl(run_dir / "chunks.jsonl") if r["chunk"] < start]
        have = probe_video(video_path)["frames"] if video_path.is_file() else 0
        if [r["chunk"] for r in records] != list(range(start)) or have != frames_for_chunks(start):
            raise OutputError(f"{run_dir}: the video ({have} frames) or chunks.jsonl ({len(records)} records) "
                              f"lost chunks before the saved chunk {start}; cannot resume exactly "
                              f"(use --overwrite to start again)")
        progress = _restore(rollout, decoder, scorer, parts, tensors)
        rollout.chunk = start
        tmp = run_dir / "chunks.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        tmp.replace(run_dir / "chunks.jsonl")
        log.info(f"resuming {run_dir} at chunk {start} of {plan.num_chunks}")
    waypoints: dict[int, list[str]] = {}
    for chunk_index, label in plan.waypoints:
        waypoints.setdefault(chunk_index, []).append(label)
    totals, peak = progress["totals"], progress["peak"]
    video = VideoStreamWriter(run_dir / VIDEO_PART if start else video_path, preset.width, preset.height, preset.fps)
    jsonl = JsonlWriter(run_dir / "chunks.jsonl", append=True)
    bar = tqdm(total=plan.num_chunks, initial=start, unit="chunk", file=sys.stderr, disable=not cfg.progress,
               desc=writer.name)
    stop = _StopFlag().__enter__()  # held until the summary is written: a late Ctrl-C finishes cleanly
    pipeline = None

    def finish(out):
        """Write one decoded chunk: video frames, metrics, its chunks.jsonl record."""
        c = out.record["chunk"]
        video.write(out.frames)
        rec = out.record
        rec["pixel_frames"] = list(chunk_rows(c))
        rec["actions"] = plan.chunk_actions[c]
        rec["waypoints"] = waypoints.get(c, [])
        rec["frames_sha256"] = hashlib.sha256(out.frames.numpy().tobytes()).hexdigest()
        with torch.no_grad():
            rec["metrics"] = scorer.add_chunk(out.latents, out.frames)
        jsonl.write(rec)
        records.append(rec)
        for k, v in rec["timings_s"].items():
            totals[k] = totals.get(k, 0.0) + v
        for k in peak:
            peak[k] = max(peak[k], rec["memory"].get(k, 0))
        bar.update(1)

    try:
        stopped = None
        try:
            pipeline = DecodePipeline(decoder, device, cfg.overlap_decode)  # after any decoder restore
            for c in range(start, plan.num_chunks):
                try:
                    ready = pipeline.submit(rollout.step())
                except KeyboardInterrupt:  # a second Ctrl-C: abort now, without waiting for a decode
                    raise
                except BaseException:
                    try:
                        for done in pipeline.flush():  # the chunks generated before are still written
                            finish(done)
                    except Exception as exc:  # the original error is the one to report
                        log.warning(f"while writing the chunks before the failure: {exc}")
                    raise
                for done in ready:
                    finish(done)
                last = c == plan.num_chunks - 1
                signalled = stop.signal is not None  # read once: a signal arriving now counts next chunk
                save = not last and (signalled or (cfg.save_every and (c + 1) % cfg.save_every == 0))
                if save or last or signalled:
                    for done in pipeline.flush():  # the decoder state must cover every chunk saved
                        finish(done)
                if save:
                    _save(run_dir, cfg, rollout, decoder, scorer, progress, inputs)
                if signalled and not last:
                    stopped = c
                    break
        finally:
            failing = sys.exc_info()[1] is not None  # then a closing error must not hide the real one
            steps = [bar.close, jsonl.close, video.close] if pipeline is None else \
                [pipeline.close, bar.close, jsonl.close, video.close]
            if start:
                steps.append(lambda: concat_videos([video_path, run_dir / VIDEO_PART], video_path))
            if records:
                steps.append(lambda: plot_cache_timeline(records, run_dir / "cache_timeline.png"))
            for step in steps:
                try:
                    step()
                except Exception as exc:
                    if not failing:
                        raise
                    log.warning(f"while stopping: {exc}")
        if stopped is not None:
            raise Interrupted(f"interrupted after chunk {stopped} of {plan.num_chunks}; every finished chunk is in "
                              f"{run_dir}; resume with: worldtrace generate --resume {run_dir}")
        # with overlap the decode runs beside the DiT: only the wait for it is on the critical path
        gen_s = sum(v for k, v in totals.items() if k != ("decode" if cfg.overlap_decode else "decode_wait"))
        frames_total = frames_for_chunks(plan.num_chunks)
        summary = {
            "status": "complete",
            "run_dir": str(run_dir),
            "command": sys.argv,
            "config": cfg.to_dict(),
            "resolved": {"seed": seed, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
                         "trajectory": str(Path(cfg.trajectory).resolve()), "waypoints": plan.waypoints,
                         "chunks": plan.num_chunks, "image": str(image_path), "notes": plan.notes,
                         "world_seed": None if truth is None else truth.world_seed,
                         "resumed_at_chunk": start or None},
            "checkpoint": world.files,
            "versions": versions(),
            "cache": {**writer.describe(), "kv_bytes": writer.kv_bytes(), "host_bytes": writer.host_bytes()},
            "metrics": scorer.summary(plan),
            "totals": {
                "chunks": plan.num_chunks,
                "latent_frames": plan.num_chunks * preset.frames_per_chunk,
                "pixel_frames": frames_total,
                "seconds": {"load": round(load_s, 3), "conditioning": round(cond_s, 3),
                            **{k: round(v, 3) for k, v in totals.items()}, "generate": round(gen_s, 3),
                            "wall": round(time.time() - started, 3)},
                "seconds_per_chunk": round(gen_s / plan.num_chunks, 4),
                "fps": round(frames_total / gen_s, 3) if gen_s else None,
                "peak_rss_bytes": peak["rss_bytes"],
                "gpu_peak_bytes": peak["gpu_peak_bytes"] if device.type == "cuda" else None,
            },
        }
        write_json_atomic(run_dir / "summary.json", summary)
        for leftover in (STATE_DIR, STATE_DIR + ".old", STATE_DIR + ".tmp"):
            shutil.rmtree(run_dir / leftover, ignore_errors=True)
        return summary
    finally:
        stop.__exit__(None, None, None)
