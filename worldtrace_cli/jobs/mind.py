"""``worldtrace mind run`` / ``score``: continue MIND clips through the writers and score submissions as
MIND's evaluator does (:mod:`worldtrace_cli.continuation.mind`; docs/continue.md)."""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import InputError

log = logging.getLogger("worldtrace")


def _split(clip, perspective: str | None, test_type: str | None) -> tuple[str, str]:
    from ..continuation.mind import PERSPECTIVES, TEST_TYPES

    p, t = perspective or clip.perspective, test_type or clip.test_type
    if p not in PERSPECTIVES or t not in TEST_TYPES:
        # a clip folder outside MIND's tree: the submission still needs both levels
        p, t = p if p in PERSPECTIVES else "1st_data", t if t in TEST_TYPES else "mem_test"
    return p, t


def run_mind(clips: list[Path], caches: list[str], out: Path, preset: str = "loopworld", model: str = "worldtrace",
             image: Path | None = None, seed: int = 0, camera: str = "actions", eval_size: str = "mind",
             random_weights: bool = False, checkpoint: Path | None = None, device: str = "auto", dtype: str = "auto",
             overwrite: bool = False, memory: dict | None = None, perspective: str | None = None,
             test_type: str | None = None) -> dict:
    """Continue each MIND clip with each writer: the clip's real frames before ``mark_time`` (its whole
    chunks: :func:`~worldtrace_cli.continuation.mind.prefix_chunks_for`) committed to the cache, the rest
    generated along its actions (:func:`~worldtrace_cli.continuation.mind.mind_trajectory`) to the end
    of the clip; each run in ``out/runs/<perspective>/<test>/<clip>/<writer>/`` (a normal run folder: a
    rerun reuses complete runs, resumes stopped ones), its predicted frames (from ``mark_time``) as
    ``out/submission/<model>-<writer>/<perspective>/<test>/<clip>/video.mp4``, scored into
    ``out/result_<model>-<writer>.json`` (MIND's per-video format) and a table ``out/mind.md``.

    Returns ``{"results": [result files], "rows": [{model, clip, psnr, ssim, mse, ...}]}``.
    Raises:
        InputError: a clip folder that is not a MIND clip, a preset that does not walk in universal mode,
            the errors of ``generate`` (before any model loads for the first clip's inputs).
    """
    from ..config import RunConfig, load_preset, memory_configs
    from ..continuation import write_frames_after
    from ..continuation.mind import (EVAL_SIZE, mind_poses, mind_trajectory, prefix_chunks_for, read_mind_clip, result_entry,
                                     write_result)
    from ..runs.resume import next_step
    from ..trajectory.actions import chunks_for_frames
    from .generate import run_generation

    preset_obj = load_preset(preset)
    if preset_obj.mode != "universal":
        raise InputError(f"--preset {preset}: mode {preset_obj.mode!r}; MIND's actions are walked in universal mode "
                         f"(MG2 universal, loopworld, tiny, LingBot-World)")
    if camera != "actions" and not preset_obj.backbone.camera_files:
        raise InputError(f"--camera {camera}: only presets that take camera files (LingBot-World) read poses")
    read = [read_mind_clip(c) for c in clips]  # every clip checked before anything runs
    names = [c.name for c in read]
    if len(set(names)) != len(names):
        raise InputError(f"two clips share a name ({', '.join(names)}): a submission names a clip by its folder")
    memories = memory_configs(caches, preset_obj, **(memory or {}))
    size = EVAL_SIZE if eval_size == "mind" else (preset_obj.height, preset_obj.width)
    fpc = preset_obj.frames_per_chunk
    pipeline, results, rows = None, [], []
    entries: dict[str, list] = {cache: [] for cache in caches}
    for clip in read:
        p, t = _split(clip, perspective, test_type)
        work = out / "runs" / p / t / clip.name
        work.mkdir(parents=True, exist_ok=True)
        trajectory = work / "trajectory.yaml"
        trajectory.write_text(mind_trajectory(clip), encoding="utf-8")
        poses = None
        if camera != "actions":
            import numpy as np

            poses = work / "poses.npy"
            np.save(poses, mind_poses(clip, camera))
        k = prefix_chunks_for(clip.mark_time, fpc)
        chunks = chunks_for_frames(clip.total_time, fpc)
        if k >= chunks:
            raise InputError(f"{clip.folder}: mark_time {clip.mark_time} leaves no chunk to generate before total_time "
                             f"{clip.total_time}")
        for cache in caches:
            cfg = RunConfig(preset=preset_obj, trajectory=trajectory, output=work / cache.replace(":", "-"), image=image,
                            chunks=chunks, seed=seed, device=device, dtype=dtype, checkpoint=checkpoint,
                            random_weights=random_weights, memory=memories[cache], overwrite=overwrite,
                            progress=False, metrics="fast", prefix=str(clip.video.resolve()), prefix_chunks=k,
                            poses=poses)
            step, what = ("run", cfg) if overwrite else next_step(cfg.output, cfg)
            log.info(f"mind: {clip.name} / {cache}: {k} real chunks (mark_time {clip.mark_time}), {chunks - k} "
                     f"generated" + {"reuse": " (complete, reused)", "resume": " (resumed)", "run": ""}[step])
            if step != "reuse":
                from ..engine.pipeline import Pipeline

                if pipeline is None or not pipeline.serves(what):
                    pipeline = Pipeline.from_config(what)
                run_generation(what, resume=step == "resume", pipeline=pipeline)
            name = f"{model}-{cache.replace(':', '-')}"
            video = out / "submission" / name / p / t / clip.name / "video.mp4"
            write_frames_after(cfg.output / "video.mp4", video, clip.mark_time, preset_obj.fps)
            entry = result_entry(video, clip, p, t, size)
            entries[cache].append(entry)
            lcm = entry.get("lcm") or {}
            rows.append({"model": name, "clip": clip.name, "perspective": p, "test_type": t,
                         "frames": lcm.get("length"), "psnr": lcm.get("avg_psnr"), "ssim": lcm.get("avg_ssim"),
                         "mse": lcm.get("avg_mse"), "error": entry.get("error")})
    for cache in caches:
        name = f"{model}-{cache.replace(':', '-')}"
        results.append(write_result(out / f"result_{name}.json", entries[cache]))
    _write_table(out / "mind.md", rows, size)
    return {"results": results, "rows": rows}


def _write_table(path: Path, rows: list[dict], size) -> None:
    from ..outputs import atomic_path

    f = lambda v, s=".3f": "—" if v is None else format(v, s)  # noqa: E731
    lines = ["# MIND: continuations scored against the real frames after mark_time", "",
             f"lcm group as MIND's evaluator computes it, at {size[1]}x{size[0]}: PSNR (dB), SSIM (Gaussian 11 / 1.5), "
             "MSE on [0, 1] pixels; LPIPS, visual quality, DINO and action accuracy need models this tool does not "
             "load (named in the result files' not_computed).", "",
             "| model | clip | perspective | test | frames | PSNR ↑ | SSIM ↑ | MSE ↓ |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['clip']} | {r['perspective']} | {r['test_type']} | {r['frames'] or '—'} | "
                     f"{f(r['psnr'], '.2f')} | {f(r['ssim'])} | {f(r['mse'], '.4f')} |"
                     + (f" error: {r['error']}" if r["error"] else ""))
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")


def score_submission(model_dir: Path, data_root: Path, output: Path | None = None, size: str | None = None) -> Path:
    """Score a submission ``model_dir/<perspective>/<test>/<clip>/video.mp4`` against MIND's data
    (``data_root/<perspective>/test/<test>/<clip>/``: video.mp4 + action.json) into MIND's result file
    (default ``result_<model>.json`` beside ``model_dir``). A submitted clip without ground truth is
    skipped, as MIND's evaluator skips it (logged). ``size``: None = MIND's 1280x720; ``"native"``: the
    submitted video's size.

    Raises:
        InputError: ``model_dir`` or ``data_root`` not a folder, no submitted video with ground truth."""
    from ..continuation.mind import EVAL_SIZE, PERSPECTIVES, TEST_TYPES, read_mind_clip, result_entry, write_result
    from ..outputs import probe_video

    model_dir, data_root = Path(model_dir), Path(data_root)
    for flag, path in (("MODEL_DIR", model_dir), ("--data", data_root)):
        if not path.is_dir():
            raise InputError(f"{flag} {path}: not a folder")
    entries = []
    for p in PERSPECTIVES:
        for t in TEST_TYPES:
            folder = model_dir / p / t
            if not folder.is_dir():
                continue
            for clip_dir in sorted(d for d in folder.iterdir() if d.is_dir()):
                video = clip_dir / "video.mp4"
                truth = data_root / p / "test" / t / clip_dir.name
                if not video.is_file():
                    continue
                if not truth.is_dir():
                    log.info(f"mind score: {p}/{t}/{clip_dir.name}: no ground truth in {data_root}, skipped")
                    continue
                clip = read_mind_clip(truth)
                shape = EVAL_SIZE
                if size == "native":
                    info = probe_video(video)
                    shape = (info["height"], info["width"])
                entries.append(result_entry(video, clip, p, t, shape))
    if not entries:
        raise InputError(f"{model_dir}: no <perspective>/<test>/<clip>/video.mp4 with ground truth in {data_root}")
    return write_result(output or model_dir.parent / f"result_{model_dir.name}.json", entries)


__all__ = ["run_mind", "score_submission"]
