"""Replay an MG2 golden fixture folder and report the largest deviation from the official outputs.

Usage: ``python -m worldtrace_cli.parity FIXTURE_DIR`` (format: ``tests/data/fixtures/FIXTURES.md``).
Prints one line per compared group and, last, ``max_abs_diff=<value>``; exits 0 when the value is
<= 1e-4 and 1 otherwise (2 for an unreadable folder).

A folder holds ``tiny_config.json`` and ``tiny_outputs.safetensors``; weights and inputs come from
the folder or, when absent there, from its parent (``universal_la4`` uses the universal files;
``templerun`` applies ``tiny_weights_delta.safetensors`` to the parent's weights). The rollout uses
the MG2-native sliding cache (budget = local_attn_size - 3 past latent frames, actual positions).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from .errors import WorldtraceError
from .memory import build_writer
from .memory.base import CacheGeometry, MemoryConfig
from .model.checkpoint import check_state_dict, read_json, read_state_dict
from .model.config import DiTConfig
from .model.dit import CausalWanDiT, ChunkInputs, LayerPast
from .model.sampler import flow_to_x0

TOLERANCE = 1e-4
FRAMES_PER_CHUNK = 3


def _find(folder: Path, name: str) -> Path | None:
    for cand in (folder / name, folder.parent / name):
        if cand.is_file():
            return cand
    return None


def load_fixture(folder: str | Path):
    """Return (model float32, inputs dict, outputs dict) for a fixture folder.

    Raises:
        WorldtraceError: a required file is missing or does not match the config.
    """
    folder = Path(folder)
    cfg = DiTConfig.from_dict(read_json(folder / "tiny_config.json"), str(folder / "tiny_config.json"))
    model = CausalWanDiT(cfg).float().eval()
    weights_path = _find(folder, "tiny_weights.safetensors")
    if weights_path is None:
        raise WorldtraceError(f"{folder}: no tiny_weights.safetensors here or in the parent folder")
    sd = read_state_dict(weights_path)
    expected = model.state_dict()
    sd = {k: v for k, v in sd.items() if k in expected}
    if (folder / "tiny_weights_delta.safetensors").is_file():
        sd.update(read_state_dict(folder / "tiny_weights_delta.safetensors"))
    check_state_dict(model, sd, str(weights_path))
    model.load_state_dict(sd)
    inputs: dict[str, torch.Tensor] = {}
    for path in (folder.parent / "tiny_inputs.safetensors", folder / "tiny_inputs.safetensors"):
        if path.is_file() and (path.parent == folder or not inputs):
            inputs.update(read_state_dict(path))
    outputs = read_state_dict(folder / "tiny_outputs.safetensors")
    return model, inputs, outputs


@torch.no_grad()
def replay(model: CausalWanDiT, inputs: dict, on_call=None, writer=None) -> torch.Tensor:
    """Replay the fixture rollout; return the output latents [1,16,N,h,w].

    ``on_call(name, x0)`` is called with ``call_c{c}_s{s}`` names and each x0. ``writer`` defaults
    to the MG2-native sliding writer (budget local_attn_size - 3); it is reset here.
    """
    cfg = model.cfg
    noise, cond = inputs["noise"], inputs["cond_concat"]
    ts, sigmas, draws = inputs["denoising_timesteps"], inputs["denoising_sigmas"], inputs["add_noise_draws"]
    mouse = inputs.get("mouse_cond") if cfg.action_config.enable_mouse else None
    n_chunks = noise.shape[2] // FRAMES_PER_CHUNK
    tokens = (noise.shape[3] // 2) * (noise.shape[4] // 2)
    if writer is None:
        writer = build_writer(MemoryConfig(cache="sliding"), cfg.local_attn_size - FRAMES_PER_CHUNK)
    writer.reset(CacheGeometry(cfg.num_layers, cfg.num_heads, cfg.head_dim, tokens, FRAMES_PER_CHUNK,
                               cfg.local_attn_size - 1))
    state = model.new_rollout_state()
    out = torch.zeros_like(noise)
    for c in range(n_chunks):
        sf = c * FRAMES_PER_CHUNK
        sl = slice(sf, sf + FRAMES_PER_CHUNK)
        writer.begin_chunk(sf)
        past = [LayerPast(*writer.read(layer)) for layer in range(cfg.num_layers)]
        chunk = ChunkInputs(state, past, sf, inputs["keyboard_cond"], mouse, inputs["visual_context"])
        x = noise[:, :, sl]
        for s in range(len(ts)):
            t = ts[s].expand(1, FRAMES_PER_CHUNK)
            x0 = flow_to_x0(x, model(x, t, cond[:, :, sl], chunk), sigmas[s])
            if on_call:
                on_call(f"call_c{c}_s{s}", x0)
            if s < len(ts) - 1:
                x = (1 - sigmas[s + 1]) * x0 + sigmas[s + 1] * draws[c, s].permute(1, 0, 2, 3)[None]
        out[:, :, sl] = x0
        model(x0, torch.zeros(1, FRAMES_PER_CHUNK), cond[:, :, sl], chunk, commit=True)
        writer.commit(chunk.committed, list(range(sf, sf + FRAMES_PER_CHUNK)))
    return out


def compare(folder: str | Path) -> dict[str, float]:
    """Replay ``folder``; return max |diff| per group: ``x0`` (every call), ``output_latents``."""
    model, inputs, outputs = load_fixture(folder)
    diffs = {"x0": 0.0}

    def on_call(name, x0):
        ref = outputs.get(f"{name}_x0")
        if ref is not None:
            diffs["x0"] = max(diffs["x0"], (x0 - ref).abs().max().item())

    latents = replay(model, inputs, on_call)
    diffs["output_latents"] = (latents - outputs["output_latents"]).abs().max().item()
    return diffs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m worldtrace_cli.parity FIXTURE_DIR", file=sys.stderr)
        return 2
    try:
        diffs = compare(argv[0])
    except WorldtraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, value in diffs.items():
        print(f"{name}: max_abs_diff={value:.3e}")
    worst = max(diffs.values())
    print(f"max_abs_diff={worst:.6e}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
