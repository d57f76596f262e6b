"""Is it *this* world? Identify the world of loopworld runs from their generated frames.

    python benchmarks/world_identification.py RUNS... [--decoys 100-115] [-o ident.md] [--json ident.json]
        [--against OTHER.json]

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

What it measures: nearest in mean squared pixel error is mostly a matter of colours and their rough
layout (a blurred frame of the right colours passes). *Structure only* ranks the candidates by the
correlation of the frames minus their 8 x 8-pixel block means (the latent grid): edges, stripes and
checkers without the colours, the part a person needs to tell *these* buildings from others of the
same hues.

Writes Markdown (per configuration and writer: runs, chunks identified on the return leg and on the
other chunks, with the start-view control and the structure-only test beside them, and the mean
rank of the own world, 0 = nearest) and optionally JSON (per run, per chunk: the own world's rank and its PSNR margin over the
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
from worldtrace_cli.trajectory.actions import chunk_rows, chunks_for_frames  # noqa: E402
from worldtrace_cli.errors import InputError  # noqa: E402
from worldtrace_cli.loopbench.plan import parse_worlds  # noqa: E402
from worldtrace_cli.outputs import read_video_frames  # noqa: E402
from worldtrace_cli.trajectory import load_trajectory, plan_actions  # noqa: E402
from worldtrace_cli.world.truth import GroundTruth  # noqa: E402

WRITER_ORDER = ("sliding", "full", "field", "field-streaming", "landmark", "mixed:2", "memrope")


def find_runs(paths: list[Path]) -> list[Path]:
    """Complete run folders of a procedural world under ``paths`` (sorted)."""
    runs = set()
    for path in paths:
        for summary in ([path / "summary.json"] if (path / "summary.json").exists() else path.rglob("summary.json")):
            data = json.loads(summary.read_text())
            if data.get("status") == "complete" and (data.get("resolved") or {}).get("world_seed") is not None:
                runs.add(summary.parent)
    return sorted(runs)


def structure(frames: np.ndarray, block: int = 8) -> np.ndarray:
    """float32 [T, H, W, 3]: the frames minus their mean over ``block`` x ``block`` pixel blocks (the
    latent grid): edges, stripes and checkers without the colours (H and W multiples of ``block``)."""
    x = frames.astype(np.float32)
    t, h, w, c = x.shape
    low = x.reshape(t * h // block, block, w // block, block, c).mean(1).mean(2)  # [T H/b, W/b, c]
    return x - np.repeat(np.repeat(low.reshape(t, h // block, w // block, c), block, 1), block, 2)


def chunk_mse(frames: np.ndarray, truth: np.ndarray, fpc: int, num_chunks: int) -> np.ndarray:
    """Per chunk, the mean squared error (0-255 scale) of ``frames`` against ``truth`` (uint8 [T, H, W, 3])."""
    out = np.empty(num_chunks)
    for c in range(num_chunks):
        start, end = chunk_rows(c, fpc)
        end = min(end, len(frames))
        out[c] = float(np.mean((frames[start:end].astype(np.float32) - truth[start:end].astype(np.float32)) ** 2))
    return out


def chunk_structure_distance(structures: list[np.ndarray], truth: np.ndarray, fpc: int) -> np.ndarray:
    """Per chunk, 1 - the correlation (cosine) of the generated chunk's :func:`structure` (``structures[c]``)
    with that of ``truth``'s chunk. A correlation, not a squared error: with a squared error, frames
    whose structure matches none of the candidates would be "nearest" the least detailed one, the same
    for every model."""
    out = np.empty(len(structures))
    for c, a in enumerate(structures):
        start = chunk_rows(c, fpc)[0]
        b = structure(truth[start:start + len(a)])
        out[c] = 1.0 - float(np.sum(a * b) / max(np.sqrt(np.sum(a * a) * np.sum(b * b)), 1e-6))
    return out


def identify(runs: list[Path], decoys: list[int]) -> list[dict]:
    """Per run: config (the trajectory's stem), writer (the cache, ``@tau`` for landmark and mixed
    writers, with the preset when it is not ``loopworld``), world, seed, the return chunks, and per chunk the own world's rank
    among own + decoys (0 = nearest) and PSNR margin over the nearest decoy (dB), for the generated
    frames (``rank`` / ``margin``), for the start-view control (``start_rank``) and for the frames'
    structure alone (``structure_rank``: by :func:`chunk_structure_distance`, colours removed)."""
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
        if own in decoys:
            raise SystemExit(f"{run}: its world {own} is one of the decoys; pick decoys no run uses (--decoys)")
        candidates = [own] + decoys
        style = cfg.get("preset", {}).get("world")  # the run's world style (decoys are worlds of the same style)
        key = (str(cfg["trajectory"]), resolved["chunks"], fpc, frames.shape[1], frames.shape[2], style)
        if truths and next(iter(truths))[:6] != key:
            truths.clear()  # runs come sorted by folder: one trajectory's renders at a time
        mse, start_mse, struct_mse = [], [], []
        gen_structure = [structure(frames[start:min(end, len(frames))])
                         for start, end in (chunk_rows(c, fpc) for c in range(num_chunks))]
        for w in candidates:
            if key + (w,) not in truths:
                truths[key + (w,)] = GroundTruth(w, plan, frames.shape[1], frames.shape[2], style).frames(0, len(frames))
            truth = truths[key + (w,)]
            mse.append(chunk_mse(frames, truth, fpc, num_chunks))
            start_mse.append(chunk_mse(np.broadcast_to(truths[key + (own,)][:1], truth.shape), truth, fpc, num_chunks))
            struct_mse.append(chunk_structure_distance(gen_structure, truth, fpc))
        # [candidates, chunks]; row 0 = own world
        mse, start_mse, struct_mse = np.stack(mse), np.stack(start_mse), np.stack(struct_mse)
        # a tie counts against the own world (a flat chunk's structure ties with every candidate)
        rank = (mse[1:] <= mse[0]).sum(0)
        start_rank = (start_mse[1:] <= start_mse[0]).sum(0)
        structure_rank = (struct_mse[1:] <= struct_mse[0]).sum(0)
        margin = 10 * np.log10(mse[1:].min(0) / np.maximum(mse[0], 1e-6))
        ret = ((summary.get("metrics") or {}).get("gt") or {}).get("return") or {}
        memory = cfg.get("memory") or {}
        writer, preset = memory.get("cache", "?"), (cfg.get("preset") or {}).get("name")
        if writer.startswith(("landmark", "mixed")) and memory.get("landmark_threshold") is not None:
            writer += f"@{memory['landmark_threshold']:g}"  # the run's tau (given or the preset's) is part of the name
        out.append({"run_dir": str(run), "config": Path(cfg["trajectory"]).stem,
                    "writer": writer if preset in (None, "loopworld") else f"{writer} ({preset})",
                    "world": own, "seed": resolved.get("seed"),
                    "return_chunks": [c for c in (ret.get("chunks") or []) if c < num_chunks],
                    "rank": rank.tolist(), "start_rank": start_rank.tolist(), "structure_rank": structure_rank.tolist(),
                    "margin": margin.round(3).tolist()})
    return out


def _share(ranks: list[int]) -> str:
    return "—" if not ranks else f"{sum(r == 0 for r in ranks)}/{len(ranks)} ({100 * np.mean([r == 0 for r in ranks]):.0f} %)"


def _returns(run: dict, key: str = "rank", on_return: bool = True) -> list[int]:
    """The run's ``key`` ranks of its return chunks (or, ``on_return=False``, of its other chunks);
    chunk 0, which holds the start image, in neither."""
    back = set(run["return_chunks"])
    return [r for c, r in enumerate(run.get(key, [])) if c > 0 and (c in back) == on_return]


def _base(writer: str) -> str:
    """The writer without its preset (``"field (loopworld-euler)"`` -> ``"field"``)."""
    return writer.split(" (")[0]


def _paired(members: list[dict], base: list[dict]) -> list[dict]:
    """``base``'s runs of the same (configuration, writer, world, seed) as ``members``'."""
    index = {(r["config"], _base(r["writer"]), r["world"], r["seed"]): r for r in base}
    return [index[k] for r in members if (k := (r["config"], _base(r["writer"]), r["world"], r["seed"])) in index]


def versus(members: list[dict], base: list[dict], same_writer: bool = False) -> str:
    """Runs paired on (configuration, world, seed) (and writer with ``same_writer``) with ``base``'s:
    in how many the return leg is identified in more / fewer chunks, and the two-sided sign test's
    p (ties dropped); "—" without a pair that differs."""
    from scipy import stats

    def key(r):
        return (r["config"], r["world"], r["seed"]) + ((_base(r["writer"]),) if same_writer else ())

    index = {key(r): r for r in base}
    more = fewer = 0
    for r in members:
        other = index.get(key(r))
        if other is None or other is r:
            continue
        mine, theirs = sum(x == 0 for x in _returns(r)), sum(x == 0 for x in _returns(other))
        more, fewer = more + (mine > theirs), fewer + (mine < theirs)
    if more + fewer == 0:
        return "—"
    p = stats.binomtest(more, more + fewer, 0.5).pvalue
    return f"{more} / {fewer} ({'p < 0.001' if p < 0.001 else f'p = {p:.3f}'})"


def markdown(rows: list[dict], decoys: list[int], reference: list[dict] | None = None) -> str:
    """Per (configuration, writer): identified chunks on the return leg and elsewhere (generated /
    start-view control; chunk 0, which holds the start image, left out), the mean rank of the own
    world on the return leg, the binomial test of the return leg against chance, and the runs whose
    return leg is identified more / less often than sliding's (paired, sign test); with ``reference``
    (the runs of another model or preset, e.g. the committed JSON of the shipped weights), its return
    leg over the paired runs and the runs identified more / less often than the reference's same run
    (configuration, writer without its preset, world, seed)."""
    from scipy import stats

    groups: dict = defaultdict(list)
    for r in rows:
        groups[(r["config"], r["writer"])].append(r)
    chance = 1 / (1 + len(decoys))
    lines = [f"World identification: own world vs {len(decoys)} decoy worlds ({decoys[0]}-{decoys[-1]}) at the same "
             f"poses; chance {100 * chance:.0f} %. A chunk is identified when its own world's truth is the "
             "nearest (mean squared pixel error over the chunk's frames); chunk 0 (the start image) is left "
             "out. Control: the start view in place of every frame. Structure only: the candidates ranked by the "
             "correlation of the frames minus their 8 x 8-pixel block means (edges, stripes, checkers; no "
             "colours). p vs chance: binomial over chunks, which are not independent within a run (read it as "
             "descriptive); the paired comparisons are sign tests over runs.", "",
             "| configuration | writer | runs | return leg: identified | control | structure only | other chunks: identified | "
             "control | mean rank, return (0 = nearest) | p vs chance, return | runs more / fewer than sliding |"
             + (" reference: return leg identified | runs more / fewer than the reference |" if reference is not None else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if reference is not None else "")]
    order = {w: i for i, w in enumerate(WRITER_ORDER)}
    for (config, writer), members in sorted(groups.items(),
                                            key=lambda kv: (kv[0][0], order.get(_base(kv[0][1]).split("@")[0], 99), kv[0][1])):
        ret = [x for r in members for x in _returns(r)]
        ret_c = [x for r in members for x in _returns(r, "start_rank")]
        ret_s = [x for r in members for x in _returns(r, "structure_rank")]
        other = [x for r in members for x in _returns(r, on_return=False)]
        other_c = [x for r in members for x in _returns(r, "start_rank", on_return=False)]
        p = (stats.binomtest(sum(x == 0 for x in ret), len(ret), chance, alternative="greater").pvalue
             if ret else math.nan)
        base_name = "sliding" + writer[len(_base(writer)):]  # the same preset's sliding runs
        vs = "—" if writer == base_name else versus(members, groups.get((config, base_name), []))
        lines.append(f"| {config} | {writer} | {len(members)} | {_share(ret)} | {_share(ret_c)} | {_share(ret_s)} | {_share(other)} | "
                     f"{_share(other_c)} | {np.mean(ret) if ret else math.nan:.2f} | "
                     f"{'—' if math.isnan(p) else ('<0.001' if p < 0.001 else f'{p:.3f}')} | {vs} |"
                     + (f" {_share([x for r in _paired(members, reference) for x in _returns(r)])} | "
                        f"{versus(members, reference, same_writer=True)} |" if reference is not None else ""))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring). Raises SystemExit with a one-line message for bad
    --decoys, folders without procedural-world runs, or an --against JSON made with other decoys."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders or folders holding them")
    parser.add_argument("--decoys", default="100-115", help="decoy world seeds (default 100-115)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="Markdown file (default: stdout)")
    parser.add_argument("--json", type=Path, default=None, help="per-run, per-chunk ranks and margins")
    parser.add_argument("--against", type=Path, default=None,
                        help="a JSON this script wrote of other weights' runs (same decoys): pair the runs with it")
    args = parser.parse_args(argv)
    try:
        decoys = parse_worlds(args.decoys)
    except InputError as err:
        raise SystemExit(f"--decoys: {err}".replace("--worlds: ", "")) from None
    runs = find_runs(args.runs)
    if not runs:
        raise SystemExit(f"{', '.join(map(str, args.runs))}: no complete run of a procedural world (loopworld) found")
    reference = None
    if args.against is not None:
        ref = json.loads(args.against.read_text())
        if ref["decoys"] != decoys:
            raise SystemExit(f"{args.against}: made with decoys {ref['decoys']}, not {decoys}")
        reference = ref["runs"]
    rows = identify(runs, decoys)
    text = markdown(rows, decoys, reference)
    if args.json:
        args.json.write_text(json.dumps({"decoys": decoys, "runs": rows}, separators=(",", ":")) + "\n")
    if args.output:
        args.output.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
