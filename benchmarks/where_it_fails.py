"""Where does the loopworld DiT lose its world? Free rollouts against teacher forcing (issue 47 part 2).

    python benchmarks/where_it_fails.py [--preset loopworld] [--trajectory trajectories/look_around.yaml]
        [--worlds 40-47] [--decoys 100-115] [--seed 0] [--cache sliding] [--modes free,...] [--threads N] -o DIR

The issue's first question: does the DiT draw its world from the true earlier chunks
(teacher-forced), and from one clean chunk? If it does not even then, drift is not what loses the
buildings: capacity and training compute are. Four ways to fill MG2's own cache (``sliding``, the
previous chunk's 3 latent frames; ``--cache`` another writer) are run on the same worlds, actions
and noise:

- ``free``: the product's rollout (``worldtrace generate --cache sliding``): every chunk reads the
  model's own earlier chunk;
- ``clean start``: chunk 0's context pass reads the true latents of chunk 0 (the codec's encoding
  of the true frames), every later chunk the model's own: how long one clean chunk carries;
- ``teacher-forced``: every chunk's context pass reads the true latents of that chunk, so each chunk
  is predicted from one clean previous chunk (and the start image), as in training;
- ``codec``: no DiT, the true frames through the VAE (encode, decode): the upper bound.

The generated latents of each chunk are the product's own (:class:`~worldtrace_cli.engine.rollout.Rollout`,
its sampler and noise draws); only what its context pass commits to the cache differs
(:func:`with_true_context`). Per mode, over the chunks after chunk 0 (chunk 0 holds the start image):
GT-PSNR (dB), GT detail (generated over true neighbouring-pixel differences,
:func:`~worldtrace_cli.metrics.scores.detail`), and world identification as
``benchmarks/world_identification.py`` scores it (own world's truth nearest among it and the decoys
at the same poses, by mean squared error and by structure alone), beside the start-view control.

Writes ``DIR/table.md``, ``DIR/where-it-fails.json`` (per world and mode, per chunk: PSNR, rank,
structure rank) and ``DIR/where-it-fails.jpg`` (the first world: each chunk's last pixel frame, one
row per mode and the truth). CPU: about a minute per world (every mode, 16 decoys) with
``look_around`` (17 chunks) on one thread; ``--modes free`` (the free rollout beside the codec and
the control: how a candidate's own rollouts compare) about a quarter of that.
Errors: SystemExit with a one-line message for a preset without a procedural world.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world_identification import chunk_mse, chunk_structure_distance, structure  # noqa: E402

from worldtrace_cli.config import load_preset  # noqa: E402
from worldtrace_cli.errors import InputError  # noqa: E402
from worldtrace_cli.loopbench.plan import parse_worlds  # noqa: E402
from worldtrace_cli.metrics.scores import detail  # noqa: E402
from worldtrace_cli.train.dataset import encode_frames  # noqa: E402
from worldtrace_cli.trajectory import frames_for_chunks, load_trajectory, plan_actions  # noqa: E402
from worldtrace_cli.trajectory.actions import chunk_rows  # noqa: E402
from worldtrace_cli.world.truth import GroundTruth  # noqa: E402

MODES = ("free", "clean start", "teacher-forced")  # + "codec", which runs no DiT


def with_true_context(rollout, truth: torch.Tensor | None, chunks: int):
    """Teacher forcing on a product rollout: ``rollout`` (what
    :meth:`~worldtrace_cli.engine.mg2.MG2Pipeline.rollout` made, an
    :class:`~worldtrace_cli.engine.rollout.Rollout`) commits the *true* latents of its first
    ``chunks`` chunks to its cache instead of the denoised ones; its denoising, noise, writer, poses
    and what :meth:`~worldtrace_cli.engine.rollout.ChunkRollout.step` returns stay the product's.

    Args:
        truth: normalised true latents float32 [1, 16, 3 N, h, w] (the VAE's encoding of the true
            frames, :func:`~worldtrace_cli.train.dataset.encode_frames`); None with ``chunks`` 0.
        chunks: how many chunks' context passes read ``truth`` (0: the free rollout; 1: a clean chunk
            0; N: teacher forcing throughout).
    Returns:
        ``rollout``, its context pass (the loop's hook :meth:`~worldtrace_cli.engine.rollout.Rollout.context`)
        replaced on this instance.
    """
    commit = rollout.context

    def context(x0, inputs, cond, draw=None):
        c, f = rollout.chunk, rollout.frames_per_chunk  # the chunk being made (step() counts it after the commit)
        if c < chunks:
            x0 = truth[:, :, c * f:(c + 1) * f].to(x0.device, x0.dtype)
        return commit(x0, inputs, cond, draw)

    rollout.context = context
    return rollout


@torch.no_grad()
def decode_all(decoder, latents: list[torch.Tensor]) -> np.ndarray:
    """Chunks of normalised latents [1, 16, 3, h, w] decoded in order by a fresh product decoder
    (:meth:`~worldtrace_cli.engine.base.PipelineBase.decoder`, a
    :class:`~worldtrace_cli.model.vae.StreamingDecoder`): uint8 [T, H, W, 3]."""
    return np.concatenate([decoder.decode(z).numpy() for z in latents])


def score(frames: np.ndarray, truths: dict[int, np.ndarray], own: int, fpc: int, n: int) -> dict:
    """Per chunk of ``frames`` (uint8 [T, H, W, 3], T the pixel frames of ``n`` chunks of ``fpc``
    latent frames): PSNR (dB, of the chunk's mean squared error) against the own world's truth
    (``truths``: world -> uint8 [T, H, W, 3] at the same poses), the own world's rank among
    ``truths`` (0 = nearest; a tie counts against it) by mean squared error and by structure, and the
    generated and true :func:`detail` sums. Returns ``{"psnr", "rank", "structure_rank": [n],
    "detail": [n] of [generated, true]}``."""
    others = [w for w in truths if w != own]
    mse = {w: chunk_mse(frames, truths[w], fpc, n) for w in truths}
    structures = [structure(frames[s:e]) for s, e in (chunk_rows(c, fpc) for c in range(n))]
    sdist = {w: chunk_structure_distance(structures, truths[w], fpc) for w in truths}
    rows = [chunk_rows(c, fpc) for c in range(n)]
    return {"psnr": (10 * np.log10(255.0 ** 2 / np.maximum(mse[own], 1e-6))).round(3).tolist(),
            "rank": [int(sum(mse[w][c] <= mse[own][c] for w in others)) for c in range(n)],
            "structure_rank": [int(sum(sdist[w][c] <= sdist[own][c] for w in others)) for c in range(n)],
            "detail": [[float(detail(frames[s:e]).sum()), float(detail(truths[own][s:e]).sum())] for s, e in rows]}


def run_world(pipe, preset, plan, world: int, decoys: list[int], seed: int, cache: str = "sliding",
              modes: tuple[str, ...] = MODES) -> dict:
    """Every mode on one world (module docstring) through the writer ``cache`` (a ``--cache`` of
    generate at its defaults, given the latent frames' camera poses as generate gives them; its
    summary slots, if any, then hold true or generated chunks as the mode commits them).

    Args:
        pipe: a loaded :class:`~worldtrace_cli.engine.mg2.MG2Pipeline` of ``preset`` (a
            procedural-world :class:`~worldtrace_cli.config.Preset`).
        plan: the trajectory's :class:`~worldtrace_cli.trajectory.ActionPlan` (universal mode).
        world, decoys: world seeds (the decoys' truths rank the own world's); seed: the noise seed.
        modes: which of :data:`MODES` to run (the codec and the control always are).
    Returns:
        ``{mode: score(...)}`` for every mode of ``modes``, ``"codec"`` and ``"control"`` (a still of the start
        view), plus ``"frames"``: mode (and ``"truth"``) -> uint8 [T, H, W, 3], for the picture.
    Raises:
        InputError: an unknown writer or settings it refuses.
    """
    from PIL import Image

    from worldtrace_cli.writer_options.registry import MemoryConfig

    fpc, n = preset.frames_per_chunk, plan.num_chunks
    total = frames_for_chunks(n, fpc)
    truths = {w: GroundTruth(w, plan, preset.height, preset.width, preset.world).frames(0, total)
              for w in [world] + decoys}
    truth_z = encode_frames(pipe.world.vae, truths[world])
    from worldtrace_cli.engine.base import RunConditioning

    conditioned = pipe.condition(RunConditioning(n, Image.fromarray(truths[world][0])))
    out: dict = {"frames": {}}
    keyboard, mouse = plan.keyboard[None], None if plan.mouse is None else plan.mouse[None]
    for mode, clean in zip(MODES, (0, 1, n)):
        if mode not in modes:
            continue
        rollout = pipe.rollout(pipe.build_writer(MemoryConfig(cache=cache)), conditioned, keyboard, mouse, seed)
        rollout = with_true_context(rollout, truth_z, clean)
        frames = decode_all(pipe.decoder(), [rollout.step().latents for _ in range(n)])
        out[mode], out["frames"][mode] = score(frames, truths, world, fpc, n), frames
    codec = decode_all(pipe.decoder(), [truth_z[:, :, c * fpc:(c + 1) * fpc] for c in range(n)])
    out["codec"], out["frames"]["codec"] = score(codec, truths, world, fpc, n), codec
    still = np.broadcast_to(truths[world][:1], truths[world].shape)
    out["control"] = score(np.ascontiguousarray(still), truths, world, fpc, n)
    out["frames"]["truth"] = truths[world]
    return out


def summarise(results: dict[int, dict], n_decoys: int) -> tuple[dict, str]:
    """Per mode over every world's chunks 1..n-1 (``results``: world -> :func:`run_world`'s scores,
    frames removed): GT-PSNR mean (dB), GT detail (ratio of sums), share of chunks identified by
    colour and by structure (0-1). Returns (that summary, the Markdown tables: summary and per chunk)."""
    summary = {}
    for mode in [m for m in MODES if m in next(iter(results.values()))] + ["codec", "control"]:
        psnr = [p for r in results.values() for p in r[mode]["psnr"][1:]]
        ranks = [k for r in results.values() for k in r[mode]["rank"][1:]]
        sranks = [k for r in results.values() for k in r[mode]["structure_rank"][1:]]
        det = [d for r in results.values() for d in r[mode]["detail"][1:]]
        summary[mode] = {"chunks": len(ranks), "gt_psnr": round(float(np.mean(psnr)), 2),
                         "gt_detail": round(sum(g for g, _ in det) / max(sum(t for _, t in det), 1e-9), 3),
                         "identified": round(float(np.mean([k == 0 for k in ranks])), 3),
                         "identified_structure": round(float(np.mean([k == 0 for k in sranks])), 3)}
    names = {"control": "control: the start view, still", "codec": "codec: the truth through the VAE"}
    lines = [f"Chunks 1..n-1 of every world (chunk 0 holds the start image); identification among the own world "
             f"and {n_decoys} decoys (chance {100 / (1 + n_decoys):.0f} %).", "",
             "| mode | chunks | GT-PSNR (dB) | GT detail | identified (colour) | identified (structure) |",
             "|---|---|---|---|---|---|"]
    for mode, s in summary.items():
        lines.append(f"| {names.get(mode, mode)} | {s['chunks']} | {s['gt_psnr']:.2f} | {s['gt_detail']:.2f} | "
                     f"{100 * s['identified']:.0f} % | {100 * s['identified_structure']:.0f} % |")
    n = len(next(iter(results.values()))["codec"]["rank"])
    lines += ["", "Per chunk: the share of worlds whose chunk is identified, by colour / by structure (%):", "",
              "| mode | " + " | ".join(str(c) for c in range(1, n)) + " |", "|---|" + "---|" * (n - 1)]
    for mode in summary:
        share = [[np.mean([r[mode][key][c] == 0 for r in results.values()]) for c in range(1, n)]
                 for key in ("rank", "structure_rank")]
        lines.append(f"| {mode} | " + " | ".join(f"{100 * a:.0f} / {100 * b:.0f}" for a, b in zip(*share)) + " |")
    return summary, "\n".join(lines) + "\n"


def picture(frames: dict[str, np.ndarray], fpc: int, n: int, path: Path) -> None:
    """A JPEG sheet at ``path``: each chunk's last pixel frame (``frames``: mode -> uint8 [T, H, W, 3]
    of ``n`` chunks of ``fpc`` latent frames), a row per mode run, the truth first."""
    from worldtrace_cli.outputs.sheet import frame_sheet

    order = [m for m in ("truth", "codec", "teacher-forced", "clean start", "free") if m in frames]
    last = [chunk_rows(c, fpc)[1] - 1 for c in range(n)]
    frame_sheet([frames[m][last] for m in order], order, [f"chunk {c}" for c in range(n)]).save(path, quality=90)


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="loopworld", help="a procedural-world preset (name or YAML)")
    parser.add_argument("--trajectory", type=Path, default=Path("trajectories/look_around.yaml"))
    parser.add_argument("--worlds", default="40-47", help="worlds to run (default 40-47: no sweep or tuning used them)")
    parser.add_argument("--decoys", default="100-115")
    parser.add_argument("--seed", type=int, default=0, help="noise seed")
    parser.add_argument("--cache", default="sliding", help="the writer (generate's --cache, default sliding: MG2's cache)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default all; the codec and the control always run)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes {args.modes!r}: give some of {', '.join(MODES)}, comma-separated")
    try:
        worlds, decoys = parse_worlds(args.worlds), parse_worlds(args.decoys)
        preset = load_preset(args.preset)
    except InputError as err:
        raise SystemExit(str(err)) from None
    if not preset.has_world:
        raise SystemExit(f"--preset {args.preset}: not a procedural-world preset (no ground truth)")
    try:
        from worldtrace_cli.jobs.inputs import check_writers
        from worldtrace_cli.writer_options.registry import MemoryConfig

        check_writers([MemoryConfig(cache=args.cache)], preset)
    except InputError as err:
        raise SystemExit(str(err)) from None
    if set(worlds) & set(decoys):
        raise SystemExit(f"--worlds and --decoys share worlds {sorted(set(worlds) & set(decoys))}")
    if args.threads:
        torch.set_num_threads(args.threads)
    from worldtrace_cli.engine.mg2 import MG2Pipeline

    plan = plan_actions(load_trajectory(args.trajectory), None, preset.frames_per_chunk)
    pipe = MG2Pipeline.from_preset(preset, device="cpu", dtype="fp32")
    args.output.mkdir(parents=True, exist_ok=True)
    results, started = {}, time.time()
    for w in worlds:
        results[w] = run_world(pipe, preset, plan, w, decoys, args.seed, args.cache, modes)
        print(f"world {w}: done ({time.time() - started:.0f} s)", file=sys.stderr)
    picture(results[worlds[0]].pop("frames"), preset.frames_per_chunk, plan.num_chunks,
            args.output / "where-it-fails.jpg")
    for r in results.values():
        r.pop("frames", None)
    summary, table = summarise(results, len(decoys))
    head = (f"`python benchmarks/where_it_fails.py --preset {args.preset} --trajectory {args.trajectory} "
            f"--worlds {args.worlds} --decoys {args.decoys} --seed {args.seed} --cache {args.cache}"
            f"{'' if modes == MODES else ' --modes ' + repr(','.join(modes))}` "
            f"({time.time() - started:.0f} s)\n\n")
    (args.output / "table.md").write_text(head + table)
    (args.output / "where-it-fails.json").write_text(json.dumps(
        {"preset": args.preset, "cache": args.cache, "modes": list(modes), "trajectory": str(args.trajectory), "worlds": worlds, "decoys": decoys,
         "seed": args.seed, "summary": summary, "per_world": {str(w): r for w, r in results.items()}}) + "\n")
    print(head + table, end="")


if __name__ == "__main__":
    main()
