"""What ``--attention-stats`` costs: the same rollouts with and without it, interleaved in one process
(one loaded model, the writers in turn, off and on alternating), compared by the seconds of the phase
it runs in (``denoise``: the chunk's last denoising step measures it) and by the chunk's generation
(denoise + context + cache; the decode is the same with and without it).

    python benchmarks/attention_cost.py --preset loopworld --caches sliding,landmark --chunks 12 --repeats 5 \\
        [--queries 0] [--device cpu] -o benchmarks/results/attention-stats-DATE/cost-loopworld.json

Random weights at the preset's full size (speed does not depend on their values), the preset's own
image or a gradient; prints a Markdown table (medians over repeats of the per-chunk means, chunk 0
left out) and writes it with the raw numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="loopworld")
    parser.add_argument("--caches", default="sliding,landmark")
    parser.add_argument("--chunks", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--queries", type=int, default=0, help="--attention-queries (0: every query token)")
    parser.add_argument("--budget", type=int, default=6)
    parser.add_argument("--device", default="auto")
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()

    import torch
    from PIL import Image

    from worldtrace_cli.config import RunConfig, load_preset, memory_config
    from worldtrace_cli.engine.pipeline import Pipeline
    from worldtrace_cli.trajectory import MODES, frames_for_chunks

    preset = load_preset(args.preset)
    pipe = Pipeline.from_config(RunConfig(preset=preset, trajectory=Path("-"), output=Path("-"), random_weights=True,
                                          device=args.device))
    ramp = torch.linspace(0, 255, preset.width).to(torch.uint8).expand(preset.height, -1)
    image = Image.fromarray(torch.stack([ramp] * 3, dim=-1).numpy())
    from worldtrace_cli.engine.base import RunConditioning

    backbone = preset.backbone
    conditioned = pipe.condition(RunConditioning(args.chunks, image if backbone.start_image else None,
                                                 "a red lighthouse" if backbone.run_prompt else None,
                                                 ["a red lighthouse"] * args.chunks if backbone.takes_prompts else None))
    spec = MODES[preset.mode]
    rows = frames_for_chunks(args.chunks, preset.frames_per_chunk)
    keyboard = torch.zeros(1, rows, spec.keyboard_dim)
    if spec.keyboard_dim:
        keyboard[..., 0] = 1.0
    mouse = torch.zeros(1, rows, 2) if spec.mouse else None

    def rollout_seconds(cache: str, stats: bool) -> dict:
        writer = pipe.build_writer(memory_config(preset=preset, cache=cache, budget=args.budget))
        rollout = pipe.rollout(writer, conditioned, keyboard, mouse, 0)
        if stats:
            rollout.measure_attention(args.queries)
        phases = []
        for _ in range(args.chunks):
            phases.append(rollout.step().record["timings_s"])
        measured = phases[1:]
        return {k: sum(p.get(k, 0.0) for p in measured) / len(measured) for k in ("denoise", "context", "cache")}

    caches = args.caches.split(",")
    raw = {f"{c}/{'on' if s else 'off'}": [] for c in caches for s in (False, True)}
    started = time.time()
    for repeat in range(args.repeats):
        for cache in caches:
            for stats in ((False, True) if repeat % 2 == 0 else (True, False)):  # alternate the order
                raw[f"{cache}/{'on' if stats else 'off'}"].append(rollout_seconds(cache, stats))
    rows_out = []
    lines = [f"Preset `{args.preset}` at {preset.height}x{preset.width} on {pipe.device} "
             f"({torch.cuda.get_device_name() if pipe.device.type == 'cuda' else platform.processor() or 'cpu'}, "
             f"{torch.get_num_threads()} threads, torch {torch.__version__}), budget {args.budget}, "
             f"{args.chunks} chunks (chunk 0 left out), {args.repeats} interleaved repeats, medians; queries: "
             f"{args.queries or 'all'}.", "",
             "| cache | denoise s/chunk off | on | x | generation s/chunk off | on | x |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for cache in caches:
        off, on = raw[f"{cache}/off"], raw[f"{cache}/on"]
        d_off = statistics.median(r["denoise"] for r in off)
        d_on = statistics.median(r["denoise"] for r in on)
        g_off = statistics.median(sum(r.values()) for r in off)
        g_on = statistics.median(sum(r.values()) for r in on)
        rows_out.append({"cache": cache, "denoise_off": d_off, "denoise_on": d_on, "generation_off": g_off,
                         "generation_on": g_on})
        lines.append(f"| {cache} | {d_off:.4f} | {d_on:.4f} | {d_on / d_off:.3f} | {g_off:.4f} | {g_on:.4f} | "
                     f"{g_on / g_off:.3f} |")
    text = "\n".join(lines)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"command": sys.argv, "preset": args.preset, "device": str(pipe.device),
                                           "chunks": args.chunks, "repeats": args.repeats, "queries": args.queries,
                                           "budget": args.budget, "seconds": round(time.time() - started, 1),
                                           "rows": rows_out, "raw": raw}, indent=1) + "\n")
        args.output.with_suffix(".md").write_text(f"`{' '.join(sys.argv)}`\n\n{text}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
