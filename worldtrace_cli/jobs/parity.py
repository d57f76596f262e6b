"""Replay an MG2 golden fixture folder and report the largest deviation from the official outputs.

Usage: ``worldtrace parity FIXTURE_DIR [--rope-precision float64|float32] [--compile MODE]
[--device cpu|cuda]`` (format: ``tests/data/fixtures/FIXTURES.md``). Prints one
line per compared group and, last, ``max_abs_diff=<value>``; exits 0 when the value is <= 1e-4
and 1 otherwise (2 for an unreadable folder or bad arguments). The model runs in float32; the
speed options are those of ``worldtrace generate``, so a GPU session can check that a compiled
float32-RoPE CUDA rollout still replays the official one.

A folder holds ``tiny_config.json`` and ``tiny_outputs.safetensors``; weights and inputs come from
the folder or, when absent there, from its parent (``universal_la4`` uses the universal files;
``templerun`` applies ``tiny_weights_delta.safetensors`` to the parent's weights). The rollout uses
the MG2-native sliding cache (budget = local_attn_size - 3 past latent frames, actual positions).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import InputError
from ..memory import build_writer
from ..memory.base import MemoryConfig
from ..model.checkpoint import check_state_dict, read_json, read_state_dict
from ..model.config import DiTConfig
from ..model.dit import CausalWanDiT
from ..model.speed import configure_speed, tf32_allowed
from ..model.sampler import FlowMatchSchedule

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
    if not (folder / "tiny_config.json").is_file():
        raise InputError(f"{folder}: not a golden fixture folder (no tiny_config.json; e.g. tests/data/fixtures, "
                         f"described in tests/data/fixtures/FIXTURES.md)")
    cfg = DiTConfig.from_dict(read_json(folder / "tiny_config.json"), str(folder / "tiny_config.json"))
    check_replay_size(cfg, str(folder / "tiny_config.json"))  # before any allocation
    model = CausalWanDiT(cfg).float().eval()
    weights_path = _find(folder, "tiny_weights.safetensors")
    if weights_path is None:
        raise InputError(f"{folder}: no tiny_weights.safetensors here or in the parent folder")
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


def check_replay_size(cfg, source: str) -> None:
    """Refuse a fixture config whose DiT cannot fit this machine's RAM in float32 before it is built (a
    config asking for a huge model allocated until it was killed): the weights' lower bound
    (:func:`~worldtrace_cli.model.layout.dit_parameters_lower_bound`) against the RAM, as ``generate``
    refuses a preset. Raises InputError naming the config and its widths."""
    from ..model.layout import dit_parameters_lower_bound, physical_memory_bytes

    need = 4 * dit_parameters_lower_bound(cfg)
    ram = physical_memory_bytes()
    if ram and need > ram:
        raise InputError(f"{source}: dim {cfg.dim}, ffn_dim {cfg.ffn_dim}, {cfg.num_layers} layers: at least "
                         f"{need / 1e9:.3g} GB of float32 weights, more than this machine's {ram / 1e9:.1f} GB of RAM "
                         f"(a golden fixture is a tiny model)")


def check_inputs(cfg, inputs: dict, folder: Path) -> int:
    """The MG2 fixture inputs the replay reads, against its config (a tensor of the wrong shape was an
    IndexError deep in the rollout): ``noise`` [1, out_dim, 3 n, h, w], ``add_noise_draws`` [n, steps - 1,
    3, out_dim, h, w], ``cond_concat`` [1, 20, >= 3 n, h, w], ``keyboard_cond`` [1, >= 12 n - 3, kd],
    ``visual_context`` [1, 257, clip_dim], ``denoising_timesteps`` of 3 or 4 steps. Returns n, the chunks.

    Raises:
        InputError: one line naming the tensor, its shape and the shape the config needs."""
    def shape(name):
        if name not in inputs:
            raise InputError(f"{folder}: tiny_inputs.safetensors: {name}: missing")
        return list(inputs[name].shape)

    noise = shape("noise")
    if len(noise) != 5 or noise[0] != 1 or noise[1] != cfg.out_dim or noise[2] < 3 or noise[2] % FRAMES_PER_CHUNK:
        raise InputError(f"{folder}: tiny_inputs.safetensors: noise: shape {noise}, expected [1, {cfg.out_dim}, 3 n, h, w]")
    n, (h, w) = noise[2] // FRAMES_PER_CHUNK, noise[3:]
    steps = shape("denoising_timesteps")
    if len(steps) != 1 or steps[0] not in (3, 4):
        raise InputError(f"{folder}: tiny_inputs.safetensors: denoising_timesteps: shape {steps}, expected [3] or [4]")
    want = {"add_noise_draws": [n, steps[0] - 1, FRAMES_PER_CHUNK, cfg.out_dim, h, w],
            "visual_context": [1, 257, cfg.clip_dim]}
    for name, expected in want.items():
        if shape(name) != expected:
            raise InputError(f"{folder}: tiny_inputs.safetensors: {name}: shape {shape(name)}, expected {expected}")
    cond = shape("cond_concat")
    if len(cond) != 5 or cond[1] != cfg.in_dim - cfg.out_dim or cond[2] < noise[2] or cond[3:] != [h, w]:
        raise InputError(f"{folder}: tiny_inputs.safetensors: cond_concat: shape {cond}, expected "
                         f"[1, {cfg.in_dim - cfg.out_dim}, >= {noise[2]}, {h}, {w}]")
    keys = shape("keyboard_cond")
    if len(keys) != 3 or keys[1] < 4 * FRAMES_PER_CHUNK * n - 3:
        raise InputError(f"{folder}: tiny_inputs.safetensors: keyboard_cond: shape {keys}, expected "
                         f"[1, >= {4 * FRAMES_PER_CHUNK * n - 3}, keyboard_dim]")
    return n


class _FixtureConditioning:
    """cond_concat slices of a stored [1, 20, N, h, w] tensor (the rollout's conditioning interface)."""

    def __init__(self, cond: torch.Tensor):
        self.cond = cond

    def cond_concat(self, start: int, count: int) -> torch.Tensor:
        return self.cond[:, :, start:start + count]


def replay(model: CausalWanDiT, inputs: dict, on_call=None, writer=None, device: str = "cpu") -> torch.Tensor:
    """Replay the fixture rollout through :class:`~worldtrace_cli.engine.rollout.Rollout` with the stored
    noise draws; return the output latents [1,16,N,h,w].

    ``on_call(name, x0)`` is called with ``call_c{c}_s{s}`` names and each x0. ``writer`` defaults
    to the MG2-native sliding writer (budget local_attn_size - 3); the rollout resets it. ``device``:
    where the rollout runs (``model`` must be there); x0 and the latents come back on the CPU.
    """
    from ..engine.rollout import Rollout

    cfg = model.cfg
    noise, draws = inputs["noise"], inputs["add_noise_draws"]
    steps = {3: (1000, 666, 333), 4: (1000, 750, 500, 250)}[len(inputs["denoising_timesteps"])]
    if writer is None:
        writer = build_writer(MemoryConfig(cache="sliding"), cfg.local_attn_size - FRAMES_PER_CHUNK)

    def fixture_noise(chunk, draw, shape):
        if draw == 0:
            return noise[:, :, chunk * FRAMES_PER_CHUNK:(chunk + 1) * FRAMES_PER_CHUNK]
        return draws[chunk, draw - 1].permute(1, 0, 2, 3)[None]  # [(b f), C, H, W] -> [1, C, F, H, W]

    import sys

    from tqdm import tqdm

    n_chunks = noise.shape[2] // FRAMES_PER_CHUNK
    # shown only when the replay takes over 5 s (a fixture replays in about one: a long one says how far it is)
    bar = tqdm(total=n_chunks * len(steps), unit="call", desc="parity", file=sys.stderr, delay=5, leave=False)

    def on_step(chunk, step, x0):
        bar.update()
        if on_call:
            on_call(f"call_c{chunk}_s{step}", x0.cpu())

    mouse = inputs.get("mouse_cond") if cfg.action_config.enable_mouse else None
    rollout = Rollout(model, writer, _FixtureConditioning(inputs["cond_concat"]), inputs["visual_context"],
                      inputs["keyboard_cond"], mouse, FlowMatchSchedule(steps), seed=0,
                      device=torch.device(device), latent_hw=tuple(noise.shape[3:]), noise=fixture_noise,
                      on_step=on_step)
    with bar:
        return torch.cat([rollout.step().latents.cpu() for _ in range(n_chunks)], dim=2)


def compare(folder: str | Path, rope_precision: str = "float64", compile_mode: str = "none",
            device: str = "cpu") -> dict[str, float]:
    """Replay ``folder`` with the given speed options
    (:func:`~worldtrace_cli.model.speed.configure_speed`) on ``device``; return max |diff| per group:
    ``x0`` (every call), ``output_latents``.

    On CUDA the replay runs in IEEE float32 (:func:`~worldtrace_cli.model.speed.tf32_allowed` off): with PyTorch's default
    (cuDNN convolutions, here the patch embedding, in TF32) an H200 gave max |diff| 6.6-6.9e-4 on
    the three fixtures; in IEEE float32, as here, 2.9-3.0e-6 (benchmarks/results/gpu-h200-2026-11-26-b/).
    """
    with tf32_allowed(False):
        return _compare(folder, rope_precision, compile_mode, device)


def _compare(folder, rope_precision, compile_mode, device):
    model, inputs, outputs = load_fixture(folder)
    check_inputs(model.cfg, inputs, Path(folder))
    if "output_latents" not in outputs:
        raise InputError(f"{folder}: tiny_outputs.safetensors: output_latents: missing")
    model = model.to(device)
    configure_speed(model, rope_precision, compile_mode)
    diffs = {"x0": 0.0}
    compared = {"output_latents"}

    def on_call(name, x0):
        ref = outputs.get(f"{name}_x0")
        if ref is not None:
            if ref.shape != x0.shape:
                raise InputError(f"{folder}: tiny_outputs.safetensors: {name}_x0: shape {list(ref.shape)}, the replay "
                                 f"gives {list(x0.shape)}")
            compared.add(f"{name}_x0")
            diffs["x0"] = max(diffs["x0"], (x0 - ref).abs().max().item())

    latents = replay(model, inputs, on_call, device=device)
    if outputs["output_latents"].shape != latents.shape:
        raise InputError(f"{folder}: tiny_outputs.safetensors: output_latents: shape {list(outputs['output_latents'].shape)}, "
                         f"the replay gives {list(latents.shape)}")
    diffs["output_latents"] = (latents - outputs["output_latents"]).abs().max().item()
    NOT_CHECKED[str(folder)] = sorted(set(outputs) - compared)
    return diffs


NOT_CHECKED: dict[str, list[str]] = {}  # per replayed folder: the stored outputs the replay did not compare
