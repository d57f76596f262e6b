"""Benchmarks behind ``worldtrace bench``: the memory mechanism on synthetic scenes.

``mechanism``: synthetic canonical keys with scene structure (each scene a distribution of keys),
a trajectory that leaves scene A and comes back, fed chunk by chunk into every writer; then the
*return query* (a query whose canonical content matches scene A) attends through the real RoPE
code (:class:`~worldtrace_cli.model.rope.MainRope`). Reported per writer x position scheme:

* ``mismatch``: the distribution mismatch ``||alpha_hat P - alpha||_1`` of paper App. B (Prop. 2),
  where ``alpha`` is full attention over every past frame at its actual offset (an unbounded cache)
  and ``alpha_hat P`` maps the compressed cache's slot weights back onto the frames each slot
  summarises (uniform rows for averages, one-hot rows for verbatim slots; EMA slots spread their
  row over the frames they folded with the EMA weights). In [0, 2].
* ``mismatch_content``: the same with temporal RoPE removed from both sides (content only), which
  separates what compression loses from what repositioning changes.
* ``scene_a_mass``: the fraction of the return query's attention (over past slots) that lands on
  scene-A content (each slot weighted by the share of its sources that were in scene A).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from .memory import SCHEMES, CacheGeometry, MemoryConfig, build_writer, example_specs
from .model.rope import MainRope

HEAD_DIM = 128


@dataclass(frozen=True)
class SceneSetup:
    """Synthetic scene structure.

    Attributes:
        tokens: tokens per latent frame (T).
        noise: per-frame key noise relative to the scene mean (unit-norm scale).
        sharpness: scale of the return query (inverse temperature of the softmax).
        queries: number of return-query samples averaged.
    """

    tokens: int = 8
    noise: float = 0.3
    sharpness: float = 4.0
    queries: int = 8
    seed: int = 0


def _scene_keys(setup: SceneSetup, scenes: list[str], gen) -> dict[str, torch.Tensor]:
    return {s: torch.randn(setup.tokens, HEAD_DIM, generator=gen) / math.sqrt(HEAD_DIM) * 4 for s in scenes}


def frame_scenes(route: str, leg_chunks: int, frames_per_chunk: int = 3) -> list[str]:
    """Scene label of every past latent frame for a loop like ``ABA``: each leg but the last lasts
    ``leg_chunks`` chunks; the query chunk is the first one back in the last scene."""
    return [s for s in route[:-1] for _ in range(leg_chunks * frames_per_chunk)]


def _projection(slots, n_frames: int, ema_weights) -> torch.Tensor:
    """P [S, N]: row i = the distribution over frames that slot i summarises."""
    p = torch.zeros(len(slots), n_frames, dtype=torch.float64)
    for i, s in enumerate(slots):
        frames = torch.tensor(s.frames)
        if s.kind == "ema":
            w = ema_weights[i]
            p[i, frames] = w / w.sum()
        else:
            p[i, frames] = 1.0 / len(frames)
    return p


def _ema_row(frames, time: float) -> torch.Tensor:
    # weights of an EMA whose effective time is `time`: alpha from the lag, geometric in age
    lag = max(1e-6, frames[-1] - time)
    alpha = 1.0 / (lag + 1.0)
    ages = torch.tensor([frames[-1] - f for f in frames], dtype=torch.float64)
    return alpha * (1 - alpha) ** ages


def evaluate(writer_name: str, scheme: str, route: str, leg_chunks: int, setup: SceneSetup,
             landmark_threshold: float = 0.1) -> dict:
    """Run one writer x scheme on one loop; return the three measures (see module docstring)."""
    gen = torch.Generator().manual_seed(setup.seed)
    labels = frame_scenes(route, leg_chunks)
    means = _scene_keys(setup, sorted(set(route)), gen)
    keys = torch.stack([means[s] + setup.noise * torch.randn(setup.tokens, HEAD_DIM, generator=gen) * means[s].std()
                        for s in labels])  # [N, T, D] canonical
    geom = CacheGeometry(num_layers=1, heads=1, head_dim=HEAD_DIM, tokens_per_frame=setup.tokens)
    writer = build_writer(MemoryConfig(cache=writer_name, positions=scheme, landmark_threshold=landmark_threshold),
                          default_budget=3)
    writer.reset(geom)
    n = len(labels)
    for start in range(0, n, 3):
        writer.begin_chunk(start)
        k = keys[start:start + 3].reshape(1, -1, 1, HEAD_DIM)
        writer.commit([(k, torch.zeros_like(k))], list(range(start, start + 3)))
    writer.begin_chunk(n)
    k_slots, _, positions = writer.read(0)
    slots = writer.slots()
    rope = MainRope(HEAD_DIM)
    q = setup.sharpness * (means[route[-1]] + setup.noise * torch.randn(setup.queries, setup.tokens, HEAD_DIM,
                                                                           generator=gen) * means[route[-1]].std())
    q = q.reshape(1, -1, 1, HEAD_DIM)  # queries at offset 0
    in_a = torch.tensor([lbl == route[-1] for lbl in labels], dtype=torch.float64)
    ema = {i: _ema_row(s.frames, s.centroid) for i, s in enumerate(slots) if s.kind == "ema"}
    p = _projection(slots, n, ema)
    out = {}
    for name, rotate in (("mismatch", True), ("mismatch_content", False)):
        full_k = keys.reshape(1, -1, 1, HEAD_DIM)
        qq, kk, ks = q, full_k, k_slots
        if rotate:
            frame_pos = torch.arange(-n, 0, dtype=torch.float64)
            kk = rope.rotate_slots(full_k, frame_pos)
            # the writer's own frequencies (YaRN rescales them); the reference keeps the trained ones
            ks = rope.rotate_slots(k_slots, positions, writer.temporal_frequency_scale())
        alpha = _token_attention(qq, kk, n, setup.tokens)      # [Q, N]
        alpha_hat = _token_attention(qq, ks, len(slots), setup.tokens)  # [Q, S]
        out[name] = (alpha_hat @ p - alpha).abs().sum(-1).mean().item()
        if rotate:
            out["scene_a_mass"] = (alpha_hat @ (p @ in_a)).mean().item()
    out["slots"] = len(slots)
    return out


def _token_attention(q: torch.Tensor, k: torch.Tensor, n_frames: int, tokens: int) -> torch.Tensor:
    """Per query token: softmax over all key tokens, then summed per frame/slot -> [Q*T, n_frames]."""
    scores = (q[0, :, 0].double() @ k[0, :, 0].double().T) / math.sqrt(HEAD_DIM)
    w = scores.softmax(-1)
    return w.view(w.shape[0], n_frames, tokens).sum(-1)


def mechanism_benchmark(writers: list[str] | None = None, schemes: list[str] | None = None,
                        routes: tuple[str, ...] = ("ABA", "ABCA"), legs: tuple[int, ...] = (2, 8, 32),
                        setup: SceneSetup = SceneSetup(), landmark_threshold: float = 0.1) -> list[dict]:
    """Every writer x scheme x route x leg length; returns result rows (dicts)."""
    writers = writers or example_specs()
    schemes = schemes or sorted(SCHEMES)
    rows = []
    for writer, scheme, route, leg in itertools.product(writers, schemes, routes, legs):
        rows.append({"writer": writer, "positions": scheme, "route": route, "leg_chunks": leg,
                     "landmark_threshold": landmark_threshold,
                     **evaluate(writer, scheme, route, leg, setup, landmark_threshold)})
    return rows


def markdown_table(rows: list[dict], route: str, metric: str) -> str:
    """One Markdown table: writer x scheme rows, one column per leg length."""
    legs = sorted({r["leg_chunks"] for r in rows if r["route"] == route})
    pairs = sorted({(r["writer"], r["positions"]) for r in rows if r["route"] == route})
    lines = ["| writer | positions | " + " | ".join(f"leg {leg}" for leg in legs) + " |",
             "| --- | --- | " + " | ".join("---" for _ in legs) + " |"]
    for w, s in pairs:
        vals = {r["leg_chunks"]: r[metric] for r in rows if (r["writer"], r["positions"], r["route"]) == (w, s, route)}
        lines.append(f"| {w} | {s} | " + " | ".join(f"{vals[leg]:.3f}" for leg in legs) + " |")
    return "\n".join(lines)


def write_mechanism_report(rows: list[dict], folder, stem: str = "mechanism",
                           setup: SceneSetup = SceneSetup()) -> list:
    """Write ``<stem>.json`` (rows + the ``setup`` they were made with + versions) and ``<stem>.md``
    (tables) into ``folder``; returns the two paths. Raises OSError when ``folder`` is not writable."""
    import json
    import platform
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "mechanism", "torch": torch.__version__, "python": platform.python_version(),
            "setup": setup.__dict__}
    (folder / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    parts = ["# Mechanism benchmark (synthetic scenes, real RoPE)\n",
             "Produced by `worldtrace bench mechanism`; definitions in `worldtrace_cli/bench.py`.\n"]
    for route in sorted({r["route"] for r in rows}):
        for metric, what in (("scene_a_mass", "return-query attention mass on scene-A content (higher = recall)"),
                             ("mismatch", "distribution mismatch vs full attention at actual offsets (lower = closer)"),
                             ("mismatch_content", "distribution mismatch, temporal RoPE removed (content only)")):
            parts.append(f"\n## {route}: {metric}\n\n{what}; columns: chunks per leg.\n\n"
                         + markdown_table(rows, route, metric) + "\n")
    (folder / f"{stem}.md").write_text("".join(parts))
    return [folder / f"{stem}.json", folder / f"{stem}.md"]


# --------------------------------------------------------------------------- speed and memory


def speed_benchmark(preset_name: str = "tiny", caches: tuple[str, ...] = ("sliding", "field", "landmark"),
                    chunk_counts: tuple[int, ...] = (8, 16), device: str = "auto", dtype: str = "auto",
                    image=None, warmup_chunks: int = 1, decode: bool = True, seed: int = 0,
                    rope_precision: str = "float32", compile_mode: str = "none",
                    overlap_decode: bool = False, budget: int | None = None, repeats: int = 1) -> dict:
    """Time and measure memory of each writer in one rollout per writer of ``max(chunk_counts)`` chunks,
    with snapshots at every count in ``chunk_counts``. Weights are seeded random (speed does not
    depend on their values).

    Per snapshot N, over chunks ``warmup_chunks``..N-1: phase seconds per chunk (timers synchronised
    with the generating CUDA stream: denoise, context, cache, decode, and with ``overlap_decode``
    decode_wait, the part of the decode generation waited for), ``seconds_per_chunk`` (the critical
    path: denoise + context + cache + decode, or + decode_wait with overlap), ``wall_seconds_per_chunk``
    (wall clock from the first measured chunk until chunk N's frames are on the host), DiT forward
    seconds (denoise time / steps), end-to-end ``fps`` (pixel frames / wall seconds), peak GPU bytes
    since the rollout started (``torch.cuda.max_memory_allocated``), process RSS bytes, KV bytes
    read, writer host bytes.

    ``budget``: past latent-frame slots of every writer (None = each writer's default: sliding
    reads MG2's own 3 past frames, the WorldTrace writers 6, so at defaults they attend over 6 vs 9
    latent frames; pass 6 to compare at one cache size). ``repeats``: the writers run in turn this
    many times (interleaved, so drifting machine speed hits all alike); :func:`speed_summary` takes
    medians. ``rope_precision``/``compile_mode`` are :func:`~worldtrace_cli.model.dit.configure_speed`'s;
    compilation happens in the first chunk, so keep ``warmup_chunks`` >= 1 (>= 3 for
    ``reduce-overhead``, whose CUDA graphs are recorded over the first calls).

    Returns a dict with ``meta`` (device, torch/CUDA versions, preset, settings), ``rows`` (one per
    writer x repeat x snapshot) and ``summary`` (:func:`speed_summary`).
    Raises ValueError for an unknown precision or compile mode, or repeats < 1.
    """
    import platform
    import time

    from .config import load_preset
    from .model.checkpoint import load_world_model
    from .model.conditioning import build_conditioning, load_image, preprocess_image
    from .model.dit import configure_speed
    from .model.sampler import FlowMatchSchedule
    from .model.vae import StreamingDecoder
    from .rollout import DecodePipeline, Rollout, process_rss_bytes, resolve_device, resolve_dtype
    from .trajectory import chunk_rows, frames_for_chunks

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    preset = load_preset(preset_name)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    world = load_world_model(preset, None, True, seed, dev, dt)
    configure_speed(world.dit, rope_precision, compile_mode)
    n_max = max(chunk_counts)
    f = preset.frames_per_chunk
    if image is not None:
        pixels = preprocess_image(load_image(image), preset.height, preset.width)
    else:
        pixels = torch.linspace(-1, 1, preset.width).expand(1, 3, preset.height, -1).clone()
    with torch.no_grad():
        cond, ctx = build_conditioning(pixels.to(dev, dt), world.vae, world.clip, n_max * f)
    kd = preset.dit.action_config.keyboard_dim_in
    rows_n = frames_for_chunks(n_max)
    keyboard = torch.zeros(1, rows_n, kd)
    keyboard[..., 0] = 1.0  # hold the first key (forward / jump) the whole time
    mouse = torch.zeros(1, rows_n, 2) if preset.dit.action_config.enable_mouse else None
    schedule = FlowMatchSchedule(preset.denoising_steps, preset.timestep_shift)
    phase_names = ("denoise", "context", "cache", "decode") + (("decode_wait",) if overlap_decode and decode else ())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def measure(cache: str, repeat: int) -> list[dict]:
        writer = build_writer(MemoryConfig(cache=cache, budget=budget), preset.dit.local_attn_size - f)
        sync()
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        rollout = Rollout(world.dit, writer, cond, ctx, keyboard, mouse, schedule, seed, dev,
                          (preset.height // 8, preset.width // 8), f)
        pipeline = DecodePipeline(StreamingDecoder(world.vae), dev, overlap_decode) if decode else None
        timings: list[dict] = []
        out_rows = []
        frames = 0
        wall_start = None
        try:
            for c in range(n_max):
                if c == warmup_chunks:
                    sync()
                    wall_start = time.perf_counter()
                out = rollout.step()
                done = pipeline.submit(out) if pipeline else [out]
                n = c + 1
                if n in chunk_counts and pipeline:
                    done += pipeline.flush()
                for d in done:
                    timings.append(d.record["timings_s"])
                    if d.record["chunk"] >= warmup_chunks:
                        start, end = chunk_rows(d.record["chunk"])
                        frames += end - start
                if n not in chunk_counts:
                    continue
                sync()
                wall = None if wall_start is None else time.perf_counter() - wall_start
                measured = timings[warmup_chunks:] or timings
                phases = {k: sum(t.get(k, 0.0) for t in measured) / len(measured) for k in phase_names}
                critical = sum(v for k, v in phases.items() if not (k == "decode" and "decode_wait" in phases))
                out_rows.append({
                    "cache": cache, "repeat": repeat, "chunks": n, "budget": writer.budget,
                    "seconds_per_chunk": critical,
                    "wall_seconds_per_chunk": None if wall is None else wall / (n - warmup_chunks),
                    "phase_seconds_per_chunk": phases,
                    "dit_forward_seconds": phases["denoise"] / len(schedule.denoising_steps),
                    "fps": (frames / wall) if decode and wall else None,
                    "gpu_peak_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
                    "rss_bytes": process_rss_bytes(),
                    "kv_bytes": out.record["cache"]["kv_bytes"],
                    "host_bytes": writer.host_bytes(),
                })
        finally:
            if pipeline:
                pipeline.close()
        return out_rows

    rows = [row for repeat in range(repeats) for cache in caches for row in measure(cache, repeat)]
    meta = {"benchmark": "speed", "preset": preset_name, "device": str(dev), "dtype": str(dt).replace("torch.", ""),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
            "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "caches": list(caches), "chunk_counts": list(chunk_counts), "warmup_chunks": warmup_chunks,
            "decode": decode, "resolution": [preset.height, preset.width], "rope_precision": rope_precision,
            "compile": compile_mode, "overlap_decode": overlap_decode and decode, "budget": budget,
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
    smallest N; the flat-memory target), and ``host_bytes``.
    """
    from statistics import median as _median

    rows = result["rows"]
    caches = list(dict.fromkeys(r["cache"] for r in rows))
    reference = "sliding" if "sliding" in caches else (caches[0] if caches else None)

    def pick(cache, n):
        return [r for r in rows if r["cache"] == cache and r["chunks"] == n]

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
            summary.append({
                "cache": cache, "chunks": n, "budget": group[0]["budget"], "seconds_per_chunk": s,
                "wall_seconds_per_chunk": _median(walls) if walls else None,
                "vs_reference": s / ref if ref else None, "reference": reference,
                "fps": _median(fps) if fps else None, "gpu_peak_bytes": peak,
                "gpu_peak_vs_first": peak / first_peak if peak and first_peak else None,
                "host_bytes": max(r["host_bytes"] for r in group),
            })
    return summary


def speed_markdown(result: dict) -> str:
    """Markdown of a :func:`speed_benchmark` result: the summary against the targets, then every row."""
    m = result["meta"]
    summary = result.get("summary") or speed_summary(result)
    ref = summary[0]["reference"] if summary else "-"
    lines = [f"Preset `{m['preset']}` on {m['device_name']} ({m['device']}, {m['dtype']}, torch {m['torch']}), "
             f"{m['resolution'][0]}x{m['resolution'][1]}, decode {'on' if m['decode'] else 'off'}"
             f"{' (overlapped)' if m.get('overlap_decode') else ''}, compile {m.get('compile', 'none')}, "
             f"RoPE {m.get('rope_precision', 'float64')}; {m['warmup_chunks']} warm-up chunk(s) excluded; "
             f"{m.get('repeats', 1)} interleaved repeat(s), medians.\n",
             f"| cache | budget | chunks | s/chunk | x {ref} | wall s/chunk | fps | GPU peak MB | peak x first N | host MB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def num(value, fmt):
        return "-" if value is None else format(value, fmt)

    for e in summary:
        peak = None if e["gpu_peak_bytes"] is None else e["gpu_peak_bytes"] / 2**20
        lines.append(f"| {e['cache']} | {e['budget']} | {e['chunks']} | {e['seconds_per_chunk']:.3f} | "
                     f"{num(e['vs_reference'], '.3f')} | {num(e['wall_seconds_per_chunk'], '.3f')} | "
                     f"{num(e['fps'], '.1f')} | {num(peak, '.0f')} | {num(e['gpu_peak_vs_first'], '.3f')} | "
                     f"{e['host_bytes'] / 2**20:.1f} |")
    lines += ["", "Every run:", "",
              "| cache | repeat | chunks | s/chunk | wall s/chunk | denoise | context | cache | decode | DiT fwd ms | "
              "fps | GPU peak MB | RSS MB | KV MB | host MB |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        p = r["phase_seconds_per_chunk"]
        gpu = None if r["gpu_peak_bytes"] is None else r["gpu_peak_bytes"] / 2**20
        decode = f"{p['decode']:.3f}" + (f" (wait {p['decode_wait']:.3f})" if "decode_wait" in p else "")
        lines.append(f"| {r['cache']} | {r.get('repeat', 0)} | {r['chunks']} | {r['seconds_per_chunk']:.3f} | "
                     f"{num(r.get('wall_seconds_per_chunk'), '.3f')} | {p['denoise']:.3f} | "
                     f"{p['context']:.3f} | {p['cache']:.4f} | {decode} | {1000 * r['dit_forward_seconds']:.1f} | "
                     f"{num(r['fps'], '.1f')} | {num(gpu, '.0f')} | {r['rss_bytes'] / 2**20:.0f} | "
                     f"{r['kv_bytes'] / 2**20:.2f} | {r['host_bytes'] / 2**20:.1f} |")
    return "\n".join(lines)
