"""Replay the LingBot-World golden fixtures through the product's rollout (``worldtrace parity``).

Two folder layouts are read (``docs/reference/lingbot-architecture.md`` fixtures README):

* the official fixture folder (``tiny_config.json``, ``tiny_weights.safetensors``,
  ``tiny_inputs.safetensors``, ``tiny_run_inputs.safetensors``, ``action_path/poses.npy`` and
  ``intrinsics.npy``, and one folder per variant with ``run_config.json`` and
  ``tiny_outputs.safetensors``);
* the repository's extract of it, ``tests/data/lingbot`` (``tiny_data.safetensors``, written by its
  ``make_test_data.py``): the same inputs and every variant's x0 and final latents.

Each variant (``main`` window 18 sink 6, ``nosink_la10``, ``global``) runs its 8 chunks through
:class:`~worldtrace_cli.engine.lingbot_rollout.LingbotRollout` with the official cache as one of our writers
(:func:`~worldtrace_cli.model.lingbot.config.official_memory`), the camera from the pose files
(:class:`~worldtrace_cli.model.lingbot.camera.CameraTrack`), the stored text context, VAE latent and
noise draws, in float32; every denoising call's x0 and the final latents are compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..errors import InputError
from ..model.checkpoint import read_state_dict
from .parity_selfforcing import whole_number

TOLERANCE = 1e-4
LINGBOT_VARIANTS = {"main": (18, 6), "nosink_la10": (10, 0), "global": (-1, 0)}  # the extract's settings
FRAME_NUM = 137  # video frames the fixtures requested (their run_config.json)


# what an official-layout variant's run_config.json may say for the replay to reproduce it: the causal-fast
# loop with chunks of 4 latent frames, shift 10 and the 4-step table (any other value: "not replayed")
REPLAYED = {"chunk_size": 4, "shift": 10.0, "timesteps_index": [0, 250, 500, 750], "num_train_timesteps": 1000,
            "infer_mode": "causal_fast"}


def variant_settings(cfg) -> tuple[tuple[int, int, int] | None, str | None]:
    """((local_attn_size, sink_size, frame_num_requested), None) from an official-layout variant's
    ``run_config.json``, or (None, why) when the replay cannot reproduce it: not an object, a key it
    reads missing or not a whole number, another sampler, chunk size or loop (:data:`REPLAYED`).
    ``cfg``: the JSON the official code's fixture extraction wrote (keys as in
    docs/reference/lingbot-architecture.md's fixtures); the frame count is in pixel frames. Raises nothing."""
    if not isinstance(cfg, dict):
        return None, "run_config.json is not an object"
    for key in ("local_attn_size", "sink_size", "frame_num_requested"):
        if key not in cfg:
            return None, f"run_config.json lacks {key!r}"
        if not whole_number(cfg[key]):
            return None, f"run_config.json {key!r} is {cfg[key]!r}, not a whole number"
    for key, value in REPLAYED.items():
        if key in cfg and cfg[key] != value:
            return None, f"{key} {cfg[key]!r}: this replay reproduces {value!r}"
    return (cfg["local_attn_size"], cfg["sink_size"], cfg["frame_num_requested"]), None


def is_lingbot_fixture(folder: str | Path) -> bool:
    """True for a LingBot fixture folder of either layout."""
    folder = Path(folder)
    return (folder / "tiny_data.safetensors").is_file() or (folder / "tiny_run_inputs.safetensors").is_file()


def _need(path: Path) -> Path:
    if not path.is_file():
        raise InputError(f"{path}: file not found (not a LingBot fixture folder?)")
    return path


def load_lingbot_fixture(folder: str | Path, skipped: list | None = None) -> tuple[dict, dict]:
    """(inputs, variants) of a fixture folder: inputs ``text_context`` [12, 4096], ``vae_latent``
    [16, 32, 4, 8], ``poses`` [140, 4, 4], ``intrinsics`` [140, 4], ``noise``, ``add_noise_draws``,
    ``frame_num``; variants ``name -> (local_attn_size, sink_size, {"c{c}_s{s}_x0": [16, 4, 4, 8],
    "output_latents": [16, 32, 4, 8]})``. A variant the replay cannot reproduce
    (:func:`variant_settings`) is left out and named in ``skipped`` (``"name (why)"``).

    Raises:
        InputError: a file is missing, no variant is replayable; CheckpointError: one is unreadable.
    """
    folder = Path(folder)
    if (folder / "tiny_data.safetensors").is_file():
        data = read_state_dict(folder / "tiny_data.safetensors")
        inputs = {k: data[k] for k in ("text_context", "vae_latent", "poses", "intrinsics", "noise", "add_noise_draws")}
        inputs["frame_num"] = FRAME_NUM
        variants = {name: (w, s, {k.split("/", 1)[1]: v for k, v in data.items() if k.startswith(name + "/")
                                  and (k.endswith("_x0") or k.endswith("/output_latents"))})
                    for name, (w, s) in LINGBOT_VARIANTS.items()}
        _not_checked(folder, sorted(k for k in data if k not in inputs and not k.endswith("_x0")
                                    and not k.endswith("/output_latents")))
        return inputs, variants
    raw = read_state_dict(_need(folder / "tiny_inputs.safetensors"))
    run = read_state_dict(_need(folder / "tiny_run_inputs.safetensors"))
    poses = np.load(_need(folder / "action_path" / "poses.npy"), allow_pickle=False)
    intrinsics = np.load(_need(folder / "action_path" / "intrinsics.npy"), allow_pickle=False)
    inputs = {"text_context": raw["text_context"], "vae_latent": raw["vae_latent"], "poses": torch.from_numpy(poses),
              "intrinsics": torch.from_numpy(intrinsics), "noise": run["noise"],
              "add_noise_draws": run["add_noise_draws"]}
    variants, skipped = {}, [] if skipped is None else skipped
    frame_nums, unchecked = set(), []
    for sub in sorted(p for p in folder.iterdir() if (p / "run_config.json").is_file()):
        try:
            settings, why = variant_settings(json.loads((sub / "run_config.json").read_text()))
        except (OSError, ValueError) as exc:
            settings, why = None, f"run_config.json unreadable: {' '.join(str(exc).split())[:80]}"
        if settings is None:
            skipped.append(f"{sub.name} ({why})")
            continue
        out = read_state_dict(_need(sub / "tiny_outputs.safetensors"))
        if "output_latents" not in out:
            skipped.append(f"{sub.name} (tiny_outputs.safetensors has no output_latents)")
            continue
        wanted = {k[len("call_"):]: v for k, v in out.items() if k.startswith("call_c") and k.endswith("_x0")}
        wanted["output_latents"] = out["output_latents"]
        variants[sub.name] = (settings[0], settings[1], wanted)
        unchecked += [f"{sub.name}/{k}" for k in sorted(out) if k != "output_latents" and f"{k[len('call_'):]}" not in wanted]
        frame_nums.add(settings[2])
    if len(frame_nums) > 1:  # one set of inputs (noise, poses) for every variant
        raise InputError(f"{folder}: variants request different frame counts ({sorted(frame_nums)}); one folder's "
                         f"variants share its inputs")
    if not variants:
        raise InputError(f"{folder}: no replayable variant folder with run_config.json"
                         f"{'; not replayed: ' + '; '.join(skipped) if skipped else ''}"[:400])
    inputs["frame_num"] = frame_nums.pop()
    _not_checked(folder, unchecked)
    return inputs, variants


def _not_checked(folder: Path, names: list[str]) -> None:
    """Name the stored outputs the replay does not compare (``parity`` prints them as "not checked",
    never as passed): :data:`~worldtrace_cli.jobs.parity.NOT_CHECKED`."""
    from .parity import NOT_CHECKED

    NOT_CHECKED[str(folder)] = names


def replay_variant(model, inputs: dict, local_attn_size: int, sink_size: int, device: str = "cpu",
                   memory=None, noise=None):
    """One fixture rollout through the product's :class:`LingbotRollout`.

    Args:
        model: a :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT`; inputs: of :func:`load_lingbot_fixture`.
        local_attn_size, sink_size: the official run's cache (the window of the records; the writer
            unless ``memory`` is given: :func:`~worldtrace_cli.model.lingbot.config.official_memory`).
        memory: another :class:`~worldtrace_cli.config.MemoryConfig` to run the same inputs through.
        noise: ``noise(chunk, draw, shape)``; default the fixture's stored draws.
    Returns:
        (x0 per ``"c{c}_s{s}_x0"`` [16, 4, lh, lw], latents [16, lat_f, lh, lw]) on the CPU, and the writer.
    """
    from ..engine.lingbot_rollout import LingbotRollout
    from ..memory import MemoryConfig, build_writer
    from ..model.conditioning import ConditioningLatents
    from ..model.lingbot.camera import CameraTrack, frame_counts
    from ..model.lingbot.config import official_memory, trained_window

    lat = inputs["vae_latent"]
    lh, lw = lat.shape[2:]
    kept, lat_f, _ = frame_counts(len(inputs["poses"]), inputs["frame_num"])
    track = CameraTrack(inputs["poses"].numpy()[:kept], inputs["intrinsics"].numpy(), lat_f, (8 * lh, 8 * lw))
    window = trained_window(local_attn_size)
    writer = build_writer(memory or MemoryConfig.of(**official_memory(local_attn_size, sink_size)), 0, window)
    initial, draws = inputs["noise"], inputs["add_noise_draws"]

    def stored(c, s, shape):
        return initial[None, :, 4 * c:4 * c + 4] if s == 0 else draws[c, s - 1][None]

    x0s = {}
    rollout = LingbotRollout(model, writer, ConditioningLatents(lat[None, :, :lat_f]), inputs["text_context"], track,
                             0, torch.device(device), (lh, lw), window=window, noise=noise or stored, on_step=lambda c, s, x0: x0s.__setitem__(f"c{c}_s{s}_x0", x0[0].cpu()),
                             poses=torch.from_numpy(track.latent_poses))
    latents = torch.cat([rollout.step().latents for _ in range(lat_f // 4)], dim=2)[0].cpu()
    return x0s, latents, writer


def compare_lingbot(folder: str | Path, rope_precision: str = "float32", device: str = "cpu",
                    compile_mode: str = "none") -> tuple[dict[str, float], list[str]]:
    """(largest |difference| per variant (``<variant>/x0`` over every denoising call,
    ``<variant>/latents``) between the product's replay and the official outputs; the variants present
    but not replayed, :func:`load_lingbot_fixture`'s ``skipped``), with the speed
    settings of ``generate`` (``rope_precision``, ``compile_mode``:
    :func:`~worldtrace_cli.model.speed.configure_speed`).

    On CUDA the replay runs in IEEE float32 (:func:`~worldtrace_cli.model.speed.tf32_allowed` off),
    as MG2's :func:`~worldtrace_cli.jobs.parity.compare` does: PyTorch's default runs cuDNN convolutions
    (the patch embedding) in TF32, which moved MG2's CUDA replay by 6.6-6.9e-4, over the 1e-4 bound.

    Raises:
        InputError / CheckpointError: an incomplete or unreadable folder.
    """
    from ..model.speed import tf32_allowed

    with tf32_allowed(False):
        return _compare_lingbot(Path(folder), rope_precision, device, compile_mode)


def _compare_lingbot(folder: Path, rope_precision: str, device: str, compile_mode: str) -> tuple[dict, list]:
    from ..model.lingbot.checkpoint import load_lingbot_dit
    from ..model.speed import configure_speed

    model = load_lingbot_dit(_need(folder / "tiny_config.json"), weights=_need(folder / "tiny_weights.safetensors"),
                             device=device)
    configure_speed(model, rope_precision, compile_mode)
    skipped: list[str] = []
    inputs, variants = load_lingbot_fixture(folder, skipped)
    diffs = {}
    for name, (window, sink, want) in variants.items():
        x0s, latents, _ = replay_variant(model, inputs, window, sink, device)
        missing = sorted(set(k for k in want if k != "output_latents") - set(x0s))
        if missing:
            raise InputError(f"{folder}: variant {name} expects calls this replay did not make: {', '.join(missing[:4])}")
        diffs[f"{name}/x0"] = max((x0s[k] - v).abs().max().item() for k, v in want.items() if k != "output_latents")
        diffs[f"{name}/latents"] = (latents - want["output_latents"]).abs().max().item()
    return diffs, skipped
