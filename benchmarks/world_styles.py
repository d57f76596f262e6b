"""How well the shipped loopworld VAE keeps each world style (issue 47 part 1), and a picture of both.

    python benchmarks/world_styles.py [--worlds 8-11] [-o benchmarks/results/world-styles-DATE]

For each style (``procedural``, the city the shipped model was trained on, and ``towers``, drawn for
what a small model can draw) and each world: the true frames of ``trajectories/look_around.yaml``
(17 chunks) and of ``trajectories/abca.yaml``, encoded and decoded by the shipped loopworld VAE (the
``vae.*`` part of ``worldtrace_cli/presets/loopworld.safetensors``) in 33-frame pieces; PSNR (dB,
over all pixels and frames) of the reconstruction against the truth. Also the world identification
of the reconstruction alone (its own world's truth nearest, by mean squared error and by structure,
among itself and the other worlds of the list at the same poses): what the codec leaves a DiT to
draw. Writes ``table.md`` (the table), ``world-styles.json`` and ``world-styles.jpg`` (rows: per
style, the truth and the VAE's reconstruction of every 12th frame of ``look_around``, world 8).
CPU, about a minute per style.
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
from worldtrace_cli.loopbench.plan import parse_worlds  # noqa: E402
from worldtrace_cli.model.checkpoint import split_bundle  # noqa: E402
from worldtrace_cli.model.vae import build_wan_vae  # noqa: E402
from worldtrace_cli.trajectory import load_trajectory, plan_actions  # noqa: E402
from worldtrace_cli.world.scene import STYLES  # noqa: E402
from worldtrace_cli.world.truth import GroundTruth  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAJECTORIES = ("look_around", "abca")
PIECE = 33  # pixel frames per encode (1 + 4k: the causal VAE's layout)


def load_vae():
    """The shipped loopworld VAE (float32, CPU, eval) from the ``vae.*`` part of the preset bundle.
    Raises CheckpointError (split_bundle) for a malformed bundle."""
    from safetensors.torch import load_file

    parts = split_bundle(load_file(str(ROOT / "worldtrace_cli/presets/loopworld.safetensors")), "loopworld")
    return build_wan_vae("loopworld", parts["vae"]).eval()


@torch.no_grad()
def round_trip(vae, frames: np.ndarray) -> np.ndarray:
    """uint8 [T, H, W, 3] -> the VAE's reconstruction, uint8 of the same shape (pieces of 33 frames;
    a last piece shorter than 33 is padded with its last frame and cut back)."""
    out = []
    for start in range(0, len(frames), PIECE):
        piece = frames[start:start + PIECE]
        n = len(piece)
        if n < PIECE:
            piece = np.concatenate([piece, np.repeat(piece[-1:], PIECE - n, 0)])
        x = torch.from_numpy(piece).permute(3, 0, 1, 2).float().div(127.5).sub(1.0)[None]
        y = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
        out.append(((y[0].permute(1, 2, 3, 0) + 1) * 127.5 + 0.5).clamp(0, 255).byte().numpy()[:n])
    return np.concatenate(out)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of uint8 frames ``a`` against ``b`` (same shape), over every pixel and channel."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0 ** 2 / max(mse, 1e-10)))


def structure(frames: np.ndarray) -> np.ndarray:
    """Frames minus their 8 x 8-pixel block means, grey: edges and patterns without the colours."""
    g = frames.astype(np.float64).mean(-1)
    t, h, w = g.shape
    blocks = g.reshape(t, h // 8, 8, w // 8, 8).mean((2, 4), keepdims=True)
    return (g.reshape(t, h // 8, 8, w // 8, 8) - blocks).reshape(t, h, w)


def identified(recon: np.ndarray, truths: dict[int, np.ndarray], own: int) -> tuple[bool, bool]:
    """(own world's truth nearest by MSE, nearest by structure) for the whole sequence."""
    mse = {w: np.mean((recon.astype(np.float64) - t) ** 2) for w, t in truths.items()}
    rs = structure(recon)
    st = {w: np.mean((rs - structure(t)) ** 2) for w, t in truths.items()}
    return min(mse, key=mse.get) == own, min(st, key=st.get) == own


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="8-11")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "benchmarks/results/world-styles")
    args = ap.parse_args(argv)
    worlds = parse_worlds(args.worlds)
    torch.set_num_threads(1)
    vae = load_vae()
    rows, pictures = [], []
    for style in STYLES:
        t0 = time.time()
        for name in TRAJECTORIES:
            plan = plan_actions(load_trajectory(ROOT / f"trajectories/{name}.yaml"))
            truths = {w: GroundTruth(w, plan, 96, 176, style).frames(0, len(plan.keyboard)) for w in worlds}
            for w in worlds:
                recon = round_trip(vae, truths[w])
                by_colour, by_structure = identified(recon, truths, w)
                rows.append({"style": style, "trajectory": name, "world": w, "vae_psnr_db": round(psnr(recon, truths[w]), 2),
                             "identified": by_colour, "identified_by_structure": by_structure})
                if name == "look_around" and w == worlds[0]:
                    pick = slice(0, len(recon), 12)
                    pictures.append(np.concatenate(list(truths[w][pick]), 1))
                    pictures.append(np.concatenate(list(recon[pick]), 1))
        print(f"{style}: {time.time() - t0:.0f} s", file=sys.stderr)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "world-styles.json").write_text(json.dumps({"worlds": worlds, "rows": rows}, indent=1) + "\n")
    from PIL import Image

    Image.fromarray(np.concatenate(pictures, 0)).save(args.output / "world-styles.jpg", quality=88)
    lines = ["| style | trajectory | VAE PSNR (dB), mean [min, max] | reconstruction identified (colour / structure) |",
             "|---|---|---|---|"]
    for style in STYLES:
        for name in TRAJECTORIES:
            sel = [r for r in rows if r["style"] == style and r["trajectory"] == name]
            p = [r["vae_psnr_db"] for r in sel]
            lines.append(f"| {style} | {name} | {np.mean(p):.2f} [{min(p):.2f}, {max(p):.2f}] | "
                         f"{sum(r['identified'] for r in sel)}/{len(sel)} / "
                         f"{sum(r['identified_by_structure'] for r in sel)}/{len(sel)} |")
    table = "\n".join(lines)
    print(table)
    (args.output / "table.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
