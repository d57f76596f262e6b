"""``worldtrace compare``: one trajectory through several cache writers, side by side.

Every mode runs with the same image, seed and actions into ``DIR/<cache>/`` (an ordinary run
folder), then ``DIR/compare.mp4`` shows the runs as a grid of labelled panels (one row for up to
3 modes, two rows beyond), optionally with a HUD of the keys pressed and the mouse direction of
each pixel frame; ``DIR/compare.json`` / ``compare.md`` tabulate speed, memory and metrics. The
grid is streamed: panels are decoded and the grid encoded one pixel frame at a time. ``compare.png``
is a still: one row per mode, a few frames across the rollout. With a procedural-world preset
(loopworld) the truth, the world rendered at the same poses, is the first panel and row.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

from ..schemas import SCHEMA_VERSION
from ..outputs.sheet import font as _sheet_font, frame_sheet

log = logging.getLogger("worldtrace")

MAX_ROW_PANELS = 3  # up to 3 modes side by side; more go on 2 rows


def grid_shape(modes: int) -> tuple[int, int]:
    """(rows, columns) of the panel grid: 1 x n for n <= 3, else 2 x ceil(n / 2)."""
    return (1, modes) if modes <= MAX_ROW_PANELS else (2, -(-modes // 2))


def hud_rows(plan) -> list[tuple[list[str], tuple[float, float] | None]]:
    """Per pixel frame (action row) of an ActionPlan: (key letters pressed, (pitch, yaw) or None)."""
    from ..trajectory import MODES

    letters = MODES[plan.mode].key_letters
    keys = [[letters[i] for i, v in enumerate(row) if v > 0.5] for row in plan.keyboard.tolist()]
    mouse = [None] * len(keys) if plan.mouse is None else [tuple(m) for m in plan.mouse.tolist()]
    return list(zip(keys, mouse))


def draw_panel(frame, label: str, hud=None, key_letters: str = ""):
    """One panel: uint8 [H, W, 3] -> PIL image with ``label`` at the top left and, if ``hud`` =
    (pressed letters, (pitch, yaw) or None) is given, a key strip (pressed keys filled) at the
    bottom left and an arrow of the mouse direction at the bottom right."""
    from PIL import Image, ImageDraw

    img = Image.fromarray(frame)
    draw = ImageDraw.Draw(img, "RGBA")
    height = img.height
    unit = max(10, height // 10)  # text and key size scale with the panel (10 px at 96 px high)
    font = _sheet_font(unit)
    box = draw.textbbox((3, 2), label, font=font)
    draw.rectangle((0, 0, box[2] + 3, box[3] + 2), fill=(0, 0, 0, 150))
    draw.text((3, 2), label, fill=(255, 255, 255, 255), font=font)
    if hud is None:
        return img
    pressed, mouse = hud
    y0 = height - unit - 3
    for i, letter in enumerate(key_letters):
        x0 = 3 + i * (unit + 2)
        on = letter in pressed
        draw.rectangle((x0, y0, x0 + unit, y0 + unit), fill=(255, 255, 255, 220) if on else (0, 0, 0, 120),
                       outline=(255, 255, 255, 200))
        draw.text((x0 + unit / 2, y0 + unit / 2), letter, fill=(0, 0, 0, 255) if on else (255, 255, 255, 200),
                  font=_sheet_font(max(8, unit - 2)), anchor="mm")
    if mouse is not None:
        radius = unit
        cx, cy = img.width - radius - 4, height - radius - 4
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=(0, 0, 0, 120),
                     outline=(255, 255, 255, 200))
        pitch, yaw = mouse
        norm = (pitch * pitch + yaw * yaw) ** 0.5
        if norm > 0:  # yaw right -> arrow right; pitch up -> arrow up (image y grows down)
            dx, dy = yaw / norm * (radius - 2), -pitch / norm * (radius - 2)
            draw.line((cx, cy, cx + dx, cy + dy), fill=(255, 255, 0, 255), width=max(1, unit // 5))
            draw.ellipse((cx + dx - 2, cy + dy - 2, cx + dx + 2, cy + dy + 2), fill=(255, 255, 0, 255))
    return img


def write_grid_video(videos: list[Path], labels: list[str], path: Path, fps: float, hud=None,
                     key_letters: str = "", scale: int = 1) -> dict:
    """Stream the panel videos into one grid MP4 (see :func:`grid_shape`), frame by frame.

    Args:
        videos: run videos of equal size; the grid has as many frames as the shortest.
        hud: optional per-frame list from :func:`hud_rows` (frames past its end get no HUD).
        scale: integer upscaling of every panel (nearest neighbour: pixels stay sharp), so small
            models' 176 x 96 frames and their labels are readable.

    Returns:
        ``{"frames", "width", "height", "rows", "columns"}`` of the written video.

    Raises:
        OutputError: a panel video cannot be read, sizes differ, or the grid cannot be written.
    """
    import imageio_ffmpeg
    import numpy as np
    from PIL import Image

    from ..errors import OutputError
    from ..outputs import VideoStreamWriter, atomic_path, tail_words

    readers = [imageio_ffmpeg.read_frames(str(v), pix_fmt="rgb24") for v in videos]
    try:
        try:
            sizes = {tuple(next(r)["size"]) for r in readers}
        except (OSError, RuntimeError, StopIteration) as err:
            raise OutputError(f"cannot read a panel video: {tail_words(err)}") from None
        if len(sizes) != 1:
            raise OutputError(f"panel videos differ in size: {sorted(sizes)}")
        (src_w, src_h), = sizes
        width, height = src_w * scale, src_h * scale
        rows, cols = grid_shape(len(videos))
        canvas = Image.new("RGB", (cols * width, rows * height))
        frames = 0
        with atomic_path(path) as tmp, VideoStreamWriter(tmp, cols * width, rows * height, fps) as out:
            for bufs in zip(*readers):
                state = hud[frames] if hud is not None and frames < len(hud) else None
                for k, (buf, label) in enumerate(zip(bufs, labels)):
                    frame = np.frombuffer(buf, np.uint8).reshape(src_h, src_w, 3)
                    if scale > 1:
                        frame = frame.repeat(scale, axis=0).repeat(scale, axis=1)
                    panel = draw_panel(frame, label, state, key_letters if state else "")
                    canvas.paste(panel, ((k % cols) * width, (k // cols) * height))
                out.write(np.asarray(canvas)[None])
                frames += 1
    finally:
        for r in readers:
            r.close()
    return {"frames": frames, "width": cols * width, "height": rows * height, "rows": rows, "columns": cols}


def _mode_record(cache: str, folder: str, summary: dict) -> dict:
    metrics = summary.get("metrics") or {}
    cont = metrics.get("continuation") or {}
    pac = metrics.get("pac")
    totals = summary["totals"]
    return {"cache": cache, "run_dir": folder,
            "writer": summary.get("cache", {}), "s_per_chunk": totals["seconds_per_chunk"], "fps": totals["fps"],
            "peak_rss_bytes": totals["peak_rss_bytes"], "gpu_peak_bytes": totals["gpu_peak_bytes"],
            "kv_bytes": summary.get("cache", {}).get("kv_bytes"),
            "host_bytes": summary.get("cache", {}).get("host_bytes"),
            "metrics": {"temp_ssim": metrics.get("temp_ssim"), "latent_diff": metrics.get("latent_diff"),
                        "scene_drift": metrics.get("scene_drift"),
                        "pac": pac.get("mean") if isinstance(pac, dict) else None,
                        "gt_psnr": (metrics.get("gt") or {}).get("psnr"),
                        "gt_ssim": (metrics.get("gt") or {}).get("ssim"),
                        "gt_detail": (metrics.get("gt") or {}).get("detail"),
                        "gt_return_psnr": ((metrics.get("gt") or {}).get("return") or {}).get("psnr"),
                        "ref_psnr": cont.get("psnr"), "ref_ssim": cont.get("ssim"), "ref_mse": cont.get("mse")},
            "prefix_chunks": cont.get("prefix_chunks"),
            "attention": _attention_brief(summary.get("attention"))}


def _attention_brief(attention: dict | None) -> dict | None:
    """A mode's attention in compare.json: the chunk's own share, the summary and recent slots' (means
    over chunks) and the recall attention on return chunks (None without it); None without stats."""
    if not attention:
        return None
    recall = attention.get("recall") or {}
    return {"self": attention["self"], "summary": attention["summary"], "recent": attention["recent"],
            "recall": recall.get("mean")}


def compare_markdown(result: dict) -> str:
    """The ``compare.md`` text: settings, then one table row per mode."""
    def f(v, spec=".3f"):
        return "—" if v is None else format(v, spec)

    def mib(v):
        return "—" if v is None else f"{v / 2**20:.1f} MiB"

    gt = any(m["metrics"].get("gt_psnr") is not None for m in result["modes"])
    lines = ["# worldtrace compare", "",
             f"Trajectory `{result['trajectory']}`, "
             + ("prompt segments (text-to-video)" if result["image"] == "prompts" else f"image `{result['image']}`")
             + f", seed {result['seed']}, "
             f"{result['chunks']} chunks, preset {result['preset']}, device {result['device']}. "
             f"Video: `compare.mp4` ({result['video']['frames']} frames, "
             f"{result['video']['width']}x{result['video']['height']}).", "",
             "| mode | s/chunk | KV cache | peak RSS | GPU peak | TempSSIM ↑ | LatentDiff ↓ | Scene Drift ↓ "
             "| PAC ↑ |" + (" GT-PSNR ↑ | GT-SSIM ↑ | GT detail | GT-PSNR return ↑ |" if gt else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if gt else "")]
    for m in result["modes"]:
        x = m["metrics"]
        lines.append(f"| {m['cache']} | {f(m['s_per_chunk'])} | {mib(m['kv_bytes'])} | {mib(m['peak_rss_bytes'])} | "
                     f"{mib(m['gpu_peak_bytes'])} | {f(x['temp_ssim'])} | {f(x['latent_diff'])} | "
                     f"{f(x['scene_drift'])} | {f(x['pac'])} |"
                     + (f" {f(x['gt_psnr'], '.2f')} | {f(x['gt_ssim'])} | {f(x['gt_detail'], '.2f')} | "
                        f"{f(x['gt_return_psnr'], '.2f')} |" if gt else ""))
    ref = [m for m in result["modes"] if m["metrics"].get("ref_psnr") is not None]
    if ref:
        lines += ["", f"Continuation of a real clip (`--prefix`: its first {ref[0]['prefix_chunks']} chunks committed to "
                  "the cache, the rest generated), scored against the real frames that follow the prefix "
                  "(MIND's lcm group: PSNR in dB, SSIM, MSE on [0, 1] pixels; LPIPS not computed).", "",
                  "| mode | PSNR ↑ | SSIM ↑ | MSE ↓ |", "|---|---|---|---|"]
        for m in ref:
            x = m["metrics"]
            lines.append(f"| {m['cache']} | {f(x['ref_psnr'], '.2f')} | {f(x['ref_ssim'])} | {f(x['ref_mse'], '.4f')} |")
    att = [m for m in result["modes"] if m.get("attention")]
    if att:
        lines += ["", "Attention per cache slot (`--attention-stats`, `compare_attention.png`): the share of each "
                  "chunk's attention at its last denoising step on its own keys, on the summary slots and on the "
                  "recent slots (means over chunks), and on return chunks the share on slots that hold the first "
                  "visit of the place (recall).", "",
                  "| mode | self | summary slots | recent slots | recall on return chunks |", "|---|---|---|---|---|"]
        for m in att:
            a = m["attention"]
            lines.append(f"| {m['cache']} | {f(a['self'])} | {f(a['summary'])} | {f(a['recent'])} | {f(a['recall'])} |")
    if gt:
        lines += ["", f"GT: generated vs true frames of world {result['world_seed']} at the same poses "
                  "(PSNR in dB); detail = the generated frames' neighbouring-pixel differences over the true "
                  "frames' (1 = as detailed as the truth, below 1 blurred: PSNR rewards a blurred average); "
                  "return = the chunks that come back to a place seen before. "
                  "The video's first panel is the truth."]
    return "\n".join(lines) + "\n"


def write_keyframes(videos: list[Path], labels: list[str], path: Path, plan, columns: int = 8, scale: int = 1) -> dict:
    """A still of the comparison: one row per video (labelled), ``columns`` pixel frames spread over the
    rollout (each chunk's last frame at evenly spaced chunks), written as PNG at ``path``. Only those
    frames are decoded. Returns ``{"path": file name, "frames": pixel-frame indices, "chunks": chunk
    indices}``; ``scale`` upscales every frame (nearest neighbour). Raises OutputError when a video
    cannot be read."""
    from ..outputs import atomic_path, read_video_frames
    from ..trajectory import chunk_rows

    chunks = sorted({round(c) for c in np.linspace(0, plan.num_chunks - 1, min(columns, plan.num_chunks))})
    picks = [chunk_rows(c, plan.frames_per_chunk)[1] - 1 for c in chunks]
    rows = [read_video_frames(v, indices=picks) for v in videos]  # frames of picks, in order
    if scale > 1:
        rows = [r.repeat(scale, axis=1).repeat(scale, axis=2) for r in rows]
    # a shorter (interrupted) video lacks the last picks: its row ends early
    sheet = frame_sheet(rows, labels, [f"chunk {c}" for c in chunks])
    with atomic_path(path) as tmp:
        sheet.save(tmp)
    return {"path": path.name, "frames": picks, "chunks": chunks}


def write_attention_comparison(out_dir: Path, caches: list[str], folders: list[str], plan) -> str | None:
    """``compare_attention.png`` from the runs' ``chunks.jsonl`` (``--attention-stats``): each writer's
    attention per cache slot, the return chunks of ``plan`` and their first visit's slots marked
    (:func:`~worldtrace_cli.outputs.timeline.plot_attention_comparison`). Returns its file name, or
    None when no run measured attention."""
    from ..metrics.revisit import first_visit_frames, revisit_pairs
    from ..outputs import read_jsonl
    from ..outputs.timeline import plot_attention_comparison

    runs = [(cache, read_jsonl(out_dir / folder / "chunks.jsonl")) for cache, folder in zip(caches, folders)]
    if not any("attention" in r["cache"] for _, recs in runs for r in recs):
        return None
    returns = first_visit_frames(plan, revisit_pairs(plan)["chunk_pairs"])
    path = plot_attention_comparison(runs, out_dir / "compare_attention.png", returns)
    return None if path is None else path.name


def write_truth_video(folder: Path, world_seed: int, plan, preset) -> Path:
    """The true frames of ``plan`` in world ``world_seed`` as ``folder/video.mp4`` (the compare panel;
    :meth:`~worldtrace_cli.world.truth.GroundTruth.write_video`). Returns the video's path."""
    from ..world.truth import GroundTruth

    folder.mkdir(parents=True, exist_ok=True)
    truth = GroundTruth(world_seed, plan, preset.height, preset.width, preset.world)
    return truth.write_video(folder / "video.mp4", preset.fps, plan.num_chunks)


def run_compare(trajectory: str | Path, caches: list[str], out_dir: str | Path, preset: str | None = None,
                image: str | Path | None = None, seed: int | None = None, chunks: int | None = None,
                hud: bool = True, metrics: str = "all", device: str = "auto", dtype: str = "auto",
                checkpoint: str | Path | None = None, random_weights: bool = False, overwrite: bool = False,
                progress: bool = False, speed: dict | None = None, world_seed: int = 0,
                memory: dict | None = None, scale: int = 1, overall: bool = False,
                attention: dict | None = None, prefix: dict | None = None) -> dict:
    """Run ``trajectory`` once per cache writer into ``out_dir/<cache>/`` and write the grid video
    ``compare.mp4`` plus ``compare.json`` / ``compare.md`` (returns the JSON dict). ``scale``:
    integer upscaling of the panels of ``compare.mp4`` / ``compare.png`` (the runs are unchanged).
    ``overall``: one tqdm bar on stderr over the runs (``progress``: each run's per-chunk bar).
    ``attention``: RunConfig's ``attention_stats`` / ``attention_queries`` for every run
    (:func:`~worldtrace_cli.cli.options.attention_config`); with stats, ``compare_attention.png`` too.
    ``prefix``: RunConfig's ``prefix`` / ``prefix_chunks`` / ``reference`` for every run
    (:func:`~worldtrace_cli.cli.options.prefix_config`): each writer continues the same real clip; a
    clip with frames after the prefix is the video's first panel (``out_dir/reference/video.mp4``), and
    the table gains each writer's scores against it.

    ``memory``: :func:`~worldtrace_cli.config.memory_configs` keywords (``budget``, ``summary_slots``,
    ... every writer gets; a writer's own setting, ``landmark_threshold``, ``top_k``, ..., goes to the
    listed writers that read it). ``preset`` None = ``mg2-<trajectory mode>`` with a checkpoint, else ``loopworld`` (universal) or
    ``tiny``. Panel order and labels follow ``caches``; a ``:`` in a spec becomes ``-`` in its folder
    name. With a procedural-world preset and no ``image``, the runs walk world ``world_seed`` and the
    video's first panel is the truth (``out_dir/truth/video.mp4``, the world rendered at the same poses). ``speed``:
    RunConfig speed fields (:func:`~worldtrace_cli.cli.options.speed_config`), the same for every writer.

    A rerun of the same command finishes an interrupted comparison: complete runs are reused,
    stopped ones resumed from their saved state, the others regenerated; the panels are made at the
    end. ``overwrite`` regenerates every run.

    Raises:
        InputError: bad writers/flags/trajectory (before anything runs); OutputError: a run folder
        holds a complete run of other settings (without ``overwrite``), FolderBusy: another process
        works in ``out_dir``; the errors of :func:`~worldtrace_cli.jobs.generate.run_generation`.
        Interrupted: Ctrl-C / SIGTERM during a run (its state saved; the same command finishes).
    """
    from ..config import RunConfig, default_preset_name, load_preset, memory_configs
    from ..errors import InputError, Interrupted, OutputError
    from ..outputs import atomic_path, cache_folder, write_json_atomic
    from ..runs import RunFolder
    from ..runs.claims import remove_own_result
    from ..trajectory import MODES, load_trajectory, plan_actions
    from tqdm import tqdm

    from .inputs import check_inputs, check_writers

    trajectory, out_dir = Path(trajectory), Path(out_dir)
    folders = [cache_folder(c) for c in caches]
    if not caches or len(set(folders)) != len(folders):
        raise InputError(f"--cache: expected distinct writers, got {','.join(caches) or '(none)'}")
    traj = load_trajectory(trajectory)
    preset_obj = load_preset(preset or default_preset_name(traj.mode, checkpoint))
    memories = memory_configs(caches, preset_obj, **(memory or {}))
    configs = [RunConfig(preset=preset_obj, trajectory=trajectory, output=out_dir / folder, image=image,
                         chunks=chunks, seed=seed, device=device, dtype=dtype, checkpoint=checkpoint,
                         random_weights=random_weights, memory=memories[cache],
                         overwrite=overwrite, progress=progress, metrics=metrics, world_seed=world_seed,
                         **(speed or {}), **(attention or {}), **(prefix or {}))
               for cache, folder in zip(caches, folders)]
    check_inputs(configs[0], traj)  # options, trajectory, image: before torch is imported
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"output folder {out_dir} exists and is not a folder")
    if not overwrite:  # complete runs of other settings: refused before torch loads too (again under the lock)
        from ..runs.resume import next_step

        for cfg in configs:
            next_step(cfg.output, cfg)
    check_writers([cfg.memory for cfg in configs], preset_obj)  # every writer's flags: torch-free first
    plan = plan_actions(traj, chunks, preset_obj.frames_per_chunk)
    from ..engine.pipeline import Pipeline
    from ..runs.resume import next_step
    from .generate import run_generation, stage
    from .sinks import StopFlag

    with RunFolder(out_dir).lock("compare"):
        steps = [("run", cfg) if overwrite else next_step(cfg.output, cfg) for cfg in configs]  # refuse before running
        remove_own_result(out_dir / "compare.json", "modes", "compare")  # complete only once its panels exist
        pipeline, summaries = None, []
        try:
            # a signal heard between runs, or in a run's last chunk (that run then completes), stops
            # the comparison before its next run
            with StopFlag("stopping after the current run (Ctrl-C again to abort now)") as stop, \
                    tqdm(total=len(caches), unit="run", desc="compare", file=sys.stderr, disable=not overall,
                         dynamic_ncols=True) as bar:
                for cache, (step, what) in zip(caches, steps):
                    bar.set_postfix_str(cache)
                    log.info(f"compare: {cache} -> {out_dir / cache_folder(cache)}"
                             + {"reuse": " (complete, reused)", "resume": " (resumed)", "run": ""}[step])
                    if step == "reuse":
                        summaries.append(what)
                        bar.update()
                        continue
                    if stop.signal is not None:
                        raise Interrupted(f"stopped before the {cache} run")
                    if pipeline is None or not pipeline.serves(what):
                        pipeline = Pipeline.from_config(what)
                    summaries.append(run_generation(what, resume=step == "resume", pipeline=pipeline))
                    bar.update()
        except Interrupted as exc:
            raise Interrupted(f"{exc}; finish the comparison by running the same compare command again") from None
    videos, labels = [out_dir / f / "video.mp4" for f in folders], list(caches)
    from ..continuation import write_reference_video

    reference = write_reference_video(configs[0], out_dir / "reference", plan)
    if reference is not None:
        videos, labels = [reference] + videos, ["real"] + labels
    elif preset_obj.has_world and image is None:
        with stage(f"rendering the truth of world {world_seed}"):
            truth = write_truth_video(out_dir / "truth", world_seed, plan, preset_obj)
        videos, labels = [truth] + videos, ["truth"] + labels
    video = write_grid_video(videos, labels, out_dir / "compare.mp4", preset_obj.fps, hud_rows(plan) if hud else None,
                             MODES[traj.mode].key_letters, scale)
    still = write_keyframes(videos, labels, out_dir / "compare.png", plan, scale=scale)
    attention = write_attention_comparison(out_dir, caches, folders, plan)
    resolved = summaries[0]["resolved"]
    result = {"schema_version": SCHEMA_VERSION, "trajectory": str(trajectory), "image": resolved["image"], "seed": resolved["seed"],
              "world_seed": resolved.get("world_seed"),
              "chunks": resolved["chunks"], "preset": preset_obj.name, "device": resolved["device"],
              "dtype": resolved["dtype"], "metrics_level": metrics, "hud": hud,
              "panel_scale": scale,
              "video": {"path": "compare.mp4", **video}, "keyframes": still,
              "attention_figure": attention,
              "modes": [_mode_record(c, f, s) for c, f, s in zip(caches, folders, summaries)]}
    with atomic_path(out_dir / "compare.md") as tmp:
        tmp.write_text(compare_markdown(result), encoding="utf-8")
    write_json_atomic(out_dir / "compare.json", result)  # last: a comparison is complete once it exists
    return result
