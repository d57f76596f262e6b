"""Is it *this* world? Identify the world of loopworld runs from their generated frames.

    python benchmarks/world_identification.py RUNS... [--decoys 100-115] [-o ident.md] [--json ident.json]

RUNS: run folders of ``worldtrace generate`` / ``compare`` / ``loopbench run`` on a procedural-world
preset (``loopworld``), or folders holding them (searched for ``summary.json``). For every chunk of
every run, the generated pixel frames (``video.mp4``) are compared with the true frames, at the same
poses, of the run's own world and of each decoy world (``--decoys``, worlds no sweep uses by
default): the chunk is *identified* when its own world's truth is the nearest (lowest mean squared
pixel error over the chunk's frames). Chance is 1 / (1 + decoys). It puts a number on what the
issue's "a person recognises the same world" asks, and, on return legs, on what memory recalls:
a writer whose return leg is identified more often brings back *this* world, not a plausible one.

Control (the start-image leak): the same test with the start view (pixel frame 0's truth, which
conditions every chunk) standing in for every frame of the run. A model that identifies no better
than its start image shows nothing beyond its conditioning.

Writes Markdown (per configuration and writer: runs, chunks identified on the return leg and on the
other chunks, with the start-view control beside them, and the mean rank of the own world, 0 =
nearest) and optionally JSON (per run, per chunk: the own world's rank and its PSNR margin over the
nearest decoy, dB). Errors: SystemExit with a one-line message for folders without runs of a
procedural world.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from worldtrace_cli.actions import chunk_rows, chunks_for_frames  # noqa: E402
from worldtrace_cli.outputs import read_video_frames  # noqa: E402
from worldtrace_cli.trajectory import load_trajectory, plan_actions  # noqa: E402
from worldtrace_cli.world.truth import GroundTruth  # noqa: E402

WRITER_ORDER = ("sliding", "full", "field", "field-streaming", "landmark", "mixed:2", "memrope")


def parse_range(text: str) -> list[int]:
    """``"100-115"`` or ``"3,5,9"`` -> list of ints."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def find_runs(paths: list[Path]) -> list[Path]:
    """Complete run folders of a procedural world under ``paths`` (sorted)."""
    runs = set()
    for path in paths:
        for summary in ([path / "summary.json"] if (path / "summary.json").exists() else path.rglob("summary.json")):
            data = json.loads(summary.read_text())
            if data.get("status") == "complete" and (data.get("resolved") or {}).get("world_seed") is not None:
                runs.add(summary.parent)
    return sorted(runs)


def chunk_mse(frames: np.ndarray, truth: np.ndarray, fpc: int, num_chunks: int) -> np.ndarray:
    """Per chunk, the mean squared error (0-255 scale) of ``frames`` against ``truth`` (uint8 [T, H, W, 3])."""
    out = np.empty(num_chunks)
    for c in range(num_chunks):
        start, end = chunk_rows(c, fpc)
        end = min(end, len(frames))
        diff = frames[start:end].astype(np.float32) - truth[start:end].astype(np.float32)
        out[c] = float(np.mean(diff * diff))
    return out


def identify(runs: list[Path], decoys: list[int]) -> list[dict]:
    """Per run: config, writer, world, seed, the return chunks, and per chunk the own world's rank
    among own + decoys (0 = nearest) and PSNR margin over the nearest decoy (dB), for the generated
    frames (``rank`` / ``margin``) and for the start-view control (``start_rank``)."""
    from tqdm import tqdm

    truths: dict = {}  # (trajectory, chunks, fpc, H, W, world) -> true frames; renders shared by writers and seeds
    out = []
    for run in tqdm(runs, unit="run", dynamic_ncols=True):
        summary = json.loads((run / "summary.json").read_text())
        cfg, resolved = summary["config"], summary["resolved"]
        fpc = cfg.get("preset", {}).get("frames_per_chunk", 3)
        frames = read_video_frames(run / "video.mp4")
        num_chunks = chunks_for_frames(len(frames), fpc)
        plan = plan_actions(load_trajectory(cfg["trajectory"]), resolved["chunks"], fpc)
        own = int(resolved["world_seed"])
        candidates = [own] + [w for w in decoys if w != own]
        key = (str(cfg["trajectory"]), resolved["chunks"], fpc, frames.shape[1], frames.shape[2])
        if truths and next(iter(truths))[:5] != key:
            truths.clear()  # runs come sorted by folder: one trajectory's renders at a time
        mse, start_mse = [], []
        for w in candidates:
            if key + (w,) not in truths:
                truths[key + (w,)] = GroundTruth(w, plan, frames.shape[1], frames.shape[2]).frames(0, len(frames))
            truth = truths[key + (w,)]
            mse.append(chunk_mse(frames, truth, fpc, num_chunks))
            start_mse.append(chunk_mse(np.broadcast_to(truths[key + (own,)][:1], truth.shape), truth, fpc, num_chunks))
        mse, start_mse = np.stack(mse), np.stack(start_mse)  # [candidates, chunks]; row 0 = own world
        rank = (mse[1:] < mse[0]).sum(0)
        start_rank = (start_mse[1:] < start_mse[0]).sum(0)
        margin = 10 * np.log10(mse[1:].min(0) / np.maximum(mse[0], 1e-6))
        ret = ((summary.get("metrics") or {}).get("gt") or {}).get("return") or {}
        out.append({"run_dir": str(run), "config": Path(cfg["trajectory"]).stem, "writer":
                    (cfg.get("memory") or {}).get("cache", "?"), "world": own, "seed": resolved.get("seed"),
                    "return_chunks": [c for c in (ret.get("chunks") or []) if c < num_chunks],
                    "rank": rank.tolist(), "start_rank": start_rank.tolist(), "margin": margin.round(3).tolist()})
    return out


def _share(ranks: list[int]) -> str:
    return "—" if not ranks else f"{sum(r == 0 for r in ranks)}/{len(ranks)} ({100 * np.mean([r == 0 for r in ranks]):.0f} %)"


def markdown(rows: list[dict], decoys: list[int]) -> str:
    """Per (configuration, writer): identified chunks on the return leg and elsewhere (generated /
    start-view control), mean rank of the own world; then the binomial test of each writer's return
    leg against sliding's (paired chunk counts pooled per configuration)."""
    from scipy import stats

    groups: dict = defaultdict(list)
    for r in rows:
        groups[(r["config"], r["writer"])].append(r)
    chance = 1 / (1 + len(decoys))
    lines = [f"World identification: own world vs {len(decoys)} decoy worlds ({decoys[0]}-{decoys[-1]}) at the same "
             f"poses; chance {100 * chance:.0f} %. A chunk is identified when its own world's truth is the "
             "nearest (mean squared pixel error over the chunk's frames). Control: the start view in place of "
             "every frame.", "",
             "| configuration | writer | runs | return leg: identified | control | other chunks: identified | "
             "control | mean rank, return (0 = nearest) | p vs chance, return |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = {w: i for i, w in enumerate(WRITER_ORDER)}
    for (config, writer), members in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99), kv[0][1])):
        ret, ret_c, other, other_c = [], [], [], []
        for r in members:
            back = set(r["return_chunks"])
            for c, (rank, start) in enumerate(zip(r["rank"], r["start_rank"])):
                if c == 0:
                    continue  # chunk 0 holds the start image itself
                (ret if c in back else other).append(rank)
                (ret_c if c in back else other_c).append(start)
        p = (stats.binomtest(sum(x == 0 for x in ret), len(ret), chance, alternative="greater").pvalue
             if ret else math.nan)
        lines.append(f"| {config} | {writer} | {len(members)} | {_share(ret)} | {_share(ret_c)} | {_share(other)} | "
                     f"{_share(other_c)} | {np.mean(ret) if ret else math.nan:.2f} | "
                     f"{'—' if math.isnan(p) else ('<0.001' if p < 0.001 else f'{p:.3f}')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders or folders holding them")
    parser.add_argument("--decoys", default="100-115", help="decoy world seeds (default 100-115)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="Markdown file (default: stdout)")
    parser.add_argument("--json", type=Path, default=None, help="per-run, per-chunk ranks and margins")
    args = parser.parse_args(argv)
    runs = find_runs(args.runs)
    if not runs:
        raise SystemExit(f"{', '.join(map(str, args.runs))}: no complete run of a procedural world (loopworld) found")
    decoys = parse_range(args.decoys)
    rows = identify(runs, decoys)
    text = markdown(rows, decoys)
    if args.json:
        args.json.write_text(json.dumps({"decoys": decoys, "runs": rows}, indent=1) + "\n")
    if args.output:
        args.output.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
