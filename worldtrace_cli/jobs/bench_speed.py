"""``worldtrace bench speed``: seconds per chunk by phase, wall-clock seconds per chunk, DiT forward
time, fps and peak memory of each writer on one loaded :class:`~worldtrace_cli.engine.pipeline.Pipeline`
(random weights at the preset's full size). Results are JSON + Markdown with the device and versions.
"""

from __future__ import annotations

import torch

from ..config import memory_config


def speed_benchmark(preset_name: str = "tiny", caches: tuple[str, ...] = ("sliding", "field", "landmark"),
                    chunk_counts: tuple[int, ...] = (8, 16), device: str = "auto", dtype: str = "auto",
                    image=None, warmup_chunks: int = 1, decode: bool = True, seed: int = 0,
                    rope_precision: str = "float32", compile_mode: str = "none",
                    overlap_decode: bool = False, budget: int | None = None, repeats: int = 1,
                    weights_dtype: str = "auto", offload: str = "text", attention_stats: bool = False,
                    attention_queries: int = 0) -> dict:
    """Time and measure memory of each writer in one rollout per writer of ``max(chunk_counts)`` chunks,
    with snapshots at every count in ``chunk_counts``. Weights are seeded random (speed does not
    depend on their values).

    Per snapshot N, over chunks ``warmup_chunks``..N-1: phase seconds per chunk (timers synchronised
    with the generating CUDA stream: denoise, context, cache, decode, and with ``overlap_decode``
    decode_wait, the part of the decode generation waited for), ``seconds_per_chunk`` (the critical
    path: denoise + context + cache + decode, or + decode_wait with overlap), ``wall_seconds_per_chunk``
    (wall clock from the first measured chunk until chunk N's frames are on the host), DiT forward
    seconds (denoise time / steps), end-to-end ``fps`` (pixel frames / wall seconds),
    ``first_chunk_seconds`` (wall clock of chunk 0's generation, its decode not included,
    synchronised: with ``compile_mode`` the first run of a process pays the compilation there, and
    ``reduce-overhead`` records CUDA graphs over the first chunks; later runs reuse them),
    ``warmup_seconds`` (wall clock of the ``warmup_chunks`` excluded chunks, the first included, with
    their decode); both None when ``warmup_chunks`` is 0 (nothing excluded, nothing timed apart), peak GPU bytes
    since the rollout started (``torch.cuda.max_memory_allocated``), process RSS bytes, KV bytes
    read, writer host bytes, and ``reserve_seconds`` / ``reserved_bytes``: the writer's host store
    page-locked ahead before the clock starts (``CacheWriter.reserve_host``, as ``generate`` does).

    ``budget``: past latent-frame slots of every writer (None = each writer's default: sliding
    reads MG2's own 3 past frames, the WorldTrace writers 6, so at defaults they attend over 6 vs 9
    latent frames; pass 6 to compare at one cache size). The preset's own cache (``config.default_cache``:
    MG2 ``sliding``, LingBot's and LongLive's ``sink``, Self-Forcing's ``full``) runs with its official
    settings (LongLive: 3 sink frames at true offsets). ``repeats``: the writers run in turn this
    many times (interleaved, so drifting machine speed hits all alike); :func:`speed_summary` takes
    medians. ``attention_stats`` / ``attention_queries``: every rollout measures its attention per cache
    slot (``generate --attention-stats``; what it costs is this benchmark with and without it).
    ``rope_precision``/``compile_mode`` are :func:`~worldtrace_cli.model.speed.configure_speed`'s;
    compilation happens in the first chunk, so keep ``warmup_chunks`` >= 1 (>= 3 for
    ``reduce-overhead``, whose CUDA graphs are recorded over the first calls).

    Returns a dict with ``meta`` (device, torch/CUDA versions, preset, settings), ``rows`` (one per
    writer x repeat x snapshot) and ``summary`` (:func:`speed_summary`).
    Raises ValueError for an unknown precision or compile mode, or repeats < 1.
    """
    import platform
    import time

    from dataclasses import replace

    from ..config import load_preset
    from ..trajectory.images import load_image
    from ..engine.pipeline import Pipeline
    from ..engine.record import process_rss_bytes
    from ..runs.run import Run
    from ..trajectory.actions import ActionPlan
    from ..engine.tally import critical_path_seconds
    from ..trajectory import MODES, chunk_rows, frames_for_chunks

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    preset = load_preset(preset_name)
    from pathlib import Path

    from ..config import RunConfig

    # as generate loads it: fp8 storage and block offloading (docs/gpu-memory.md) through the one loader
    cfg = RunConfig(preset=preset, trajectory=Path("-"), output=Path("-"), random_weights=True, weights_seed=seed,
                    device=device, dtype=dtype, rope_precision=rope_precision, compile=compile_mode,
                    weights_dtype=weights_dtype, offload=offload)
    pipe = Pipeline.from_config(cfg)
    dev, dt = pipe.device, pipe.dtype
    n_max = max(chunk_counts)
    backbone = preset.backbone
    if not backbone.start_image and image is not None:
        from ..errors import InputError

        from ..config.backbones import titles_where

        raise InputError(f"--image: preset {preset.name} ({backbone.title}) takes no start image; only "
                         f"{titles_where(lambda r: r.start_image)} presets do")
    from ..engine.base import RunConditioning

    start_image = None
    if backbone.start_image and image is not None:
        start_image = load_image(image, (preset.height, preset.width))
    elif backbone.start_image:
        from PIL import Image

        ramp = torch.linspace(0, 255, preset.width).to(torch.uint8).expand(preset.height, -1)
        start_image = Image.fromarray(torch.stack([ramp] * 3, dim=-1).numpy())
    prompt = "a red lighthouse on a rocky cliff above a calm sea"  # a text-to-video model: one prompt, every chunk
    conditioned = pipe.condition(RunConditioning.of(cfg, n_max, image=start_image, prompt=prompt, prompts=[prompt] * n_max))
    fpc, spec = preset.frames_per_chunk, MODES[preset.mode]  # the mode's actions (LingBot: they move the camera)
    rows_n = frames_for_chunks(n_max, fpc)
    keyboard = torch.zeros(rows_n, spec.keyboard_dim)
    if spec.keyboard_dim:  # (text-to-video: no keys)
        keyboard[..., 0] = 1.0  # hold the first key (forward / jump) the whole time
    mouse = torch.zeros(rows_n, 2) if spec.mouse else None
    # the run's plan, fed as generate's is (one ConditioningFeed); its names are not written (sinks off)
    plan = ActionPlan(preset.mode, n_max, keyboard, mouse, [""] * n_max, [], [], fpc,
                      [prompt] * n_max if backbone.takes_prompts else None)
    from ..config import default_cache

    own = default_cache(preset)
    phase_names = ("denoise", "context", "cache", "decode") + (("decode_wait",) if overlap_decode and decode else ())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def measure(cache: str, repeat: int) -> list[dict]:
        # the preset's own cache with its settings (LongLive's sink of 3, LingBot's of 6; MG2 sliding), the preset's tau
        memory = {**own, **({} if budget is None else {"budget": budget})} if own["cache"] == cache else \
            {"cache": cache, "budget": budget}
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        # generate's Run with its sinks off: no folder, records neither finished nor kept, decode as asked
        run = Run(pipe, replace(cfg, memory=memory_config(preset=preset, **memory), attention_stats=attention_stats,
                                attention_queries=attention_queries, metrics="none"),
                  plan, seed=seed, image_label="bench", conditioned=conditioned, overlap=overlap_decode,
                  decode=decode, keep=False)
        writer = run.writer
        t_reserve = time.perf_counter()  # as generate does, before its clock starts (docs/gpu-memory.md); timed on its own
        reserved = writer.reserve_host(n_max * preset.frames_per_chunk)
        reserve = (time.perf_counter() - t_reserve, reserved)
        timings: list[dict] = []
        out_rows = []
        frames = 0
        wall_start = None
        sync()
        run_start = time.perf_counter()
        first_chunk = warmup = None
        try:
            for c in range(n_max):
                if c == warmup_chunks:
                    sync()
                    wall_start = time.perf_counter()
                    warmup = (wall_start - run_start) if warmup_chunks else None
                done = run.advance(run.feed.request(c))
                out = run.loop.last
                if c == 0 and warmup_chunks:  # within the warm-up: its synchronisation is not timed
                    sync()
                    first_chunk = time.perf_counter() - run_start
                n = c + 1
                if n in chunk_counts and decode:
                    done += run.flush()
                for d in done:
                    timings.append(d.record["timings_s"])
                    if d.record["chunk"] >= warmup_chunks:
                        start, end = chunk_rows(d.record["chunk"], fpc)
                        frames += end - start
                if n not in chunk_counts:
                    continue
                sync()
                wall = None if wall_start is None else time.perf_counter() - wall_start
                measured = timings[warmup_chunks:] or timings
                phases = {k: sum(t.get(k, 0.0) for t in measured) / len(measured) for k in phase_names}
                critical = critical_path_seconds(phases, "decode_wait" in phases)
                out_rows.append({
                    "cache": cache, "repeat": repeat, "chunks": n, "budget": writer.budget,
                    "seconds_per_chunk": critical,
                    "wall_seconds_per_chunk": None if wall is None else wall / (n - warmup_chunks),
                    "phase_seconds_per_chunk": phases,
                    "dit_forward_seconds": phases["denoise"] / len(preset.denoising_steps),
                    "fps": (frames / wall) if decode and wall else None,
                    "first_chunk_seconds": first_chunk, "warmup_seconds": warmup,
                    "reserve_seconds": reserve[0], "reserved_bytes": reserve[1],
                    "gpu_peak_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
                    "rss_bytes": process_rss_bytes(),
                    "kv_bytes": out.record["cache"]["kv_bytes"],
                    "host_bytes": writer.host_bytes(),
                })
        finally:
            run.close()
        return out_rows

    rows = [row for repeat in range(repeats) for cache in caches for row in measure(cache, repeat)]
    meta = {"benchmark": "speed", "preset": preset_name, "device": str(dev), "dtype": str(dt).replace("torch.", ""),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
            "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "caches": list(caches), "chunk_counts": list(chunk_counts), "warmup_chunks": warmup_chunks,
            "decode": decode, "resolution": [preset.height, preset.width], "rope_precision": rope_precision,
            "compile": compile_mode, "overlap_decode": overlap_decode and decode, "budget": budget,
            "weights_dtype": weights_dtype, "offload": offload,
            "attention_stats": ({"queries": attention_queries or "all"} if attention_stats else None),
            "repeats": repeats}
    result = {"meta": meta, "rows": rows}
    result["summary"] = speed_summary(result)
    return result


def speed_summary(result: dict) -> list[dict]:
    """The speed targets per writer x snapshot, over the repeats of :func:`speed_benchmark`.

    Each entry: ``cache``, ``chunks``, ``budget``, median ``seconds_per_chunk`` and
    ``wall_seconds_per_chunk``, ``vs_reference`` (median s/chunk / the reference writer's at the
    same N; the reference is ``sliding`` when measured, else the first writer), median ``fps``,
    largest ``gpu_peak_bytes`` and ``gpu_peak_vs_first`` (that peak / the writer's own peak at the
    smallest N; the flat-memory target), ``host_bytes``, and the first repeat's
    ``first_run_seconds_per_chunk`` and ``first_run_vs_reference`` (against the reference's first
    repeat): what one run in a fresh process sees, one-time costs included that later repeats in the
    same process no longer pay (on CUDA, page-locking a host store: PyTorch caches freed pinned
    memory), so a single ``generate`` run is the first repeat, not the median.
    """
    from statistics import median as _median

    rows = result["rows"]
    caches = list(dict.fromkeys(r["cache"] for r in rows))
    reference = "sliding" if "sliding" in caches else (caches[0] if caches else None)

    def pick(cache, n):
        return [r for r in rows if r["cache"] == cache and r["chunks"] == n]

    def first_run(cache, n):
        first = [r["seconds_per_chunk"] for r in pick(cache, n) if r.get("repeat", 0) == 0]
        return first[0] if first else None

    counts = sorted({r["chunks"] for r in rows})
    summary = []
    for cache in caches:
        first_peak = None
        for n in counts:
            group = pick(cache, n)
            if not group:
                continue
            s = _median([r["seconds_per_chunk"] for r in group])
            ref = _median([r["seconds_per_chunk"] for r in pick(reference, n)]) if pick(reference, n) else None
            walls = [r["wall_seconds_per_chunk"] for r in group if r["wall_seconds_per_chunk"] is not None]
            fps = [r["fps"] for r in group if r["fps"] is not None]
            peaks = [r["gpu_peak_bytes"] for r in group if r["gpu_peak_bytes"] is not None]
            peak = max(peaks) if peaks else None
            if first_peak is None:
                first_peak = peak
            once, ref_once = first_run(cache, n), first_run(reference, n)
            summary.append({
                "cache": cache, "chunks": n, "budget": group[0]["budget"], "seconds_per_chunk": s,
                "wall_seconds_per_chunk": _median(walls) if walls else None,
                "vs_reference": s / ref if ref else None, "reference": reference,
                "fps": _median(fps) if fps else None, "gpu_peak_bytes": peak,
                "gpu_peak_vs_first": peak / first_peak if peak and first_peak else None,
                "host_bytes": max(r["host_bytes"] for r in group),
                "first_run_seconds_per_chunk": once,
                "first_run_vs_reference": once / ref_once if once is not None and ref_once else None,
            })
    return summary


def speed_markdown(result: dict) -> str:
    """Markdown of a :func:`speed_benchmark` result: the summary against the targets (with a warning when
    the writers ran at different budgets, so the ratio to the reference mixes cache size into it), then every row."""
    m = result["meta"]
    summary = result.get("summary") or speed_summary(result)
    ref = summary[0]["reference"] if summary else "-"
    lines = [f"Preset `{m['preset']}` on {m['device_name']} ({m['device']}, {m['dtype']}, torch {m['torch']}), "
             f"{m['resolution'][0]}x{m['resolution'][1]}, decode {'on' if m['decode'] else 'off'}"
             f"{' (overlapped)' if m.get('overlap_decode') else ''}, compile {m.get('compile', 'none')}, "
             f"RoPE {m.get('rope_precision', 'float64')}"
             + (f", attention stats on ({m['attention_stats']['queries']} queries)" if m.get("attention_stats") else "")
             + f"; {m['warmup_chunks']} warm-up chunk(s) excluded; "
             f"{m.get('repeats', 1)} interleaved repeat(s), medians.\n"]
    budgets = {e["cache"]: e["budget"] for e in summary}
    if len(set(budgets.values())) > 1:  # the ratio then mixes cache size with the writer's own cost
        lines.append(f"Budgets differ ({', '.join(f'{c} {b}' for c, b in budgets.items())} past latent frames): "
                     f"`x {ref}` compares different cache sizes; `--budget N` compares the writers at one size.\n")
    repeated = m.get("repeats", 1) > 1  # then the first repeat (a fresh process's run) is shown beside the medians
    if repeated:
        lines.append("`first run`: the first repeat, what one run in a fresh process sees (one-time costs included, e.g. "
                     "page-locking a host store on CUDA, which later repeats reuse).\n")
    lines += [f"| cache | budget | chunks | s/chunk | x {ref} | wall s/chunk | fps | GPU peak MB | peak x first N | host MB |"
              + (f" first run s/chunk | first run x {ref} |" if repeated else ""),
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if repeated else "")]

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for e in summary:
        peak = None if e["gpu_peak_bytes"] is None else e["gpu_peak_bytes"] / 2**20
        lines.append(f"| {e['cache']} | {e['budget']} | {e['chunks']} | {e['seconds_per_chunk']:.3f} | "
                     f"{num(e['vs_reference'], '.3f')} | {num(e['wall_seconds_per_chunk'], '.3f')} | "
                     f"{num(e['fps'], '.1f')} | {num(peak, '.0f')} | {num(e['gpu_peak_vs_first'], '.3f')} | "
                     f"{e['host_bytes'] / 2**20:.1f} |"
                     + (f" {num(e.get('first_run_seconds_per_chunk'), '.3f')} | {num(e.get('first_run_vs_reference'), '.3f')} |"
                        if repeated else ""))
    lines += ["", "Every run:", "",
              "| cache | repeat | chunks | s/chunk | wall s/chunk | denoise | context | cache | decode | DiT fwd ms | "
              "fps | GPU peak MB | RSS MB | KV MB | host MB | first chunk s | warm-up s |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: | ---: |"]
    for r in result["rows"]:
        p = r["phase_seconds_per_chunk"]
        gpu = None if r["gpu_peak_bytes"] is None else r["gpu_peak_bytes"] / 2**20
        decode = f"{p['decode']:.3f}" + (f" (wait {p['decode_wait']:.3f})" if "decode_wait" in p else "")
        lines.append(f"| {r['cache']} | {r.get('repeat', 0)} | {r['chunks']} | {r['seconds_per_chunk']:.3f} | "
                     f"{num(r.get('wall_seconds_per_chunk'), '.3f')} | {p['denoise']:.3f} | "
                     f"{p['context']:.3f} | {p['cache']:.4f} | {decode} | {1000 * r['dit_forward_seconds']:.1f} | "
                     f"{num(r['fps'], '.1f')} | {num(gpu, '.0f')} | {r['rss_bytes'] / 2**20:.0f} | "
                     f"{r['kv_bytes'] / 2**20:.2f} | {r['host_bytes'] / 2**20:.1f} | "
                     f"{num(r.get('first_chunk_seconds'), '.2f')} | {num(r.get('warmup_seconds'), '.2f')} |")
    return "\n".join(lines)
