"""Which weights a preset reads and whether a checkpoint folder holds them, torch-free.

``generate``, ``compare`` and ``loopbench run`` call :func:`check_weights_source` with the other input
checks, before torch is imported, so a wrong ``--checkpoint`` (or none) is a one-line error at once
instead of after the model starts loading; the loaders call the same functions again
(:func:`resolve_checkpoint_files` for MG2, :func:`lingbot_checkpoint_paths` for LingBot-World,
:func:`diffusers_checkpoint_paths` for a text-to-video preset given a diffusers Wan DiT folder).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError, InputError
from .diffusers_folder import check_diffusers_dit, diffusers_dit_folder

LINGBOT_OPTIONAL_ROLES = ("clip",)  # LingBot has no image encoder; the CLIP file only feeds --metrics all
LINGBOT_ALTERNATIVES = {"text_encoder": "text_encoder"}  # role -> path used when the preset's file is absent
# a diffusers pipeline folder's own files for the roles besides the DiT (Wan2.1-T2V-1.3B-Diffusers' layout)
DIFFUSERS_ALTERNATIVES = {"vae": "vae/diffusion_pytorch_model.safetensors", "text_encoder": "text_encoder",
                          "tokenizer": "tokenizer"}


def resolve_checkpoint_files(files: dict[str, str], folder: str | Path, preset_name: str) -> dict[str, Path]:
    """Map each role (dit, vae, clip) to its file in an official MG2 folder (MG2 spec §15).

    Raises:
        CheckpointError: the folder is missing, or one line listing every expected file not found.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"--checkpoint {folder}: not a folder")
    paths = {role: folder / rel for role, rel in files.items()}
    missing = [str(rel) for role, rel in files.items() if not paths[role].is_file()]
    if missing:
        raise CheckpointError(f"--checkpoint {folder}: missing {', '.join(missing)} "
                              f"(preset {preset_name} expects: {', '.join(files.values())})")
    return paths


def lingbot_checkpoint_paths(preset, folder: str | Path) -> dict[str, Path]:
    """Each role of a LingBot preset's ``files`` in ``folder``; the optional CLIP file is left out when
    absent; a ``text_encoder/`` folder stands in for the umT5 ``.pth``.

    Raises:
        CheckpointError: not a folder, or one line listing every required file or folder missing.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"--checkpoint {folder}: not a folder")
    paths = {role: folder / rel for role, rel in preset.files.items()}
    for role, alternative in LINGBOT_ALTERNATIVES.items():
        if role in paths and not paths[role].exists() and (folder / alternative).exists():
            paths[role] = folder / alternative
    missing = [rel + (f" (or {LINGBOT_ALTERNATIVES[role]}/)" if role in LINGBOT_ALTERNATIVES else "")
               for role, rel in preset.files.items() if role not in LINGBOT_OPTIONAL_ROLES and not paths[role].exists()]
    if missing:
        raise CheckpointError(f"--checkpoint {folder}: missing {', '.join(missing)} (preset {preset.name} expects: "
                              f"{', '.join(v for k, v in preset.files.items() if k not in LINGBOT_OPTIONAL_ROLES)})")
    return {role: p for role, p in paths.items() if p.exists()}


def check_weights_source(preset, checkpoint, random_weights: bool) -> None:
    """Check that a run's weights can be found, before anything loads: a preset that ships its weights
    takes no ``--checkpoint``; a checkpoint preset needs ``--checkpoint`` (or ``--random-weights``),
    a folder holding every file the preset expects (names and presence only; their contents are
    checked when the model loads).

    Raises:
        InputError: ``--checkpoint`` with a bundled preset, or none for a checkpoint preset.
        CheckpointError: not a folder, or files missing (one line listing them).
    """
    if preset.weights == "bundled" and checkpoint is not None:
        raise InputError(f"--checkpoint: preset {preset.name} ships its own weights ({preset.bundle}); "
                         f"drop --checkpoint, or choose an mg2-* preset")
    if random_weights:
        return
    if checkpoint is not None and takes_diffusers_dit(preset):
        if diffusers_dit_folder(checkpoint) is not None or preset.weights == "random":
            diffusers_checkpoint_paths(preset, checkpoint)  # config, shards, tensor names and shapes
            return
    if preset.weights != "checkpoint":
        return
    if checkpoint is None:
        needed = ", ".join(v for k, v in preset.files.items() if k not in LINGBOT_OPTIONAL_ROLES)
        what = f"{preset.backbone.checkpoint_folder} holding {needed}"
        raise InputError(f"preset {preset.name} needs --checkpoint DIR ({what}) or --random-weights")
    if preset.backbone.text_encoder:  # files and folders (the umT5 tokenizer)
        lingbot_checkpoint_paths(preset, checkpoint)
    else:
        resolve_checkpoint_files(preset.files, checkpoint, preset.name)


def takes_diffusers_dit(preset) -> bool:
    """Whether ``--checkpoint`` may be a diffusers Wan DiT folder for ``preset``: its backbone's DiT is a
    causal Wan 2.1 text-to-video one (``dit_model_type: t2v``: Self-Forcing, LongLive)."""
    return getattr(preset.backbone, "dit_model_type", None) == "t2v"


def diffusers_checkpoint_paths(preset, folder: str | Path) -> dict:
    """The roles of a text-to-video preset whose ``--checkpoint`` holds its DiT in diffusers' format:
    ``dit`` -> the checked :class:`~worldtrace_cli.model.diffusers_folder.DiffusersDiT` (``folder`` itself or
    ``folder/transformer``: config, shards, every tensor's name and shape, torch-free), and each other file
    the preset reads (``vae``, ``text_encoder``, ``tokenizer``, ``lora``; ``clip`` optional) at its
    path in ``folder``, else a pipeline folder's own (``vae/diffusion_pytorch_model.safetensors``,
    ``text_encoder/``, ``tokenizer/``). A preset with random weights takes its DiT alone from the folder.

    Raises:
        CheckpointError: not a folder, not a diffusers DiT folder (for a preset with random weights),
            the DiT refused (:func:`~worldtrace_cli.model.diffusers_folder.check_diffusers_dit`: one line
            naming the file and field, shard or tensor), or the other files missing (one line).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"--checkpoint {folder}: not a folder")
    dit_folder = diffusers_dit_folder(folder)
    if dit_folder is None:
        raise CheckpointError(f"--checkpoint {folder}: not a diffusers Wan DiT folder (transformer/config.json, or "
                              f"config.json beside diffusion_pytorch_model*.safetensors); preset {preset.name} has "
                              f"random weights and takes only its DiT from --checkpoint")
    paths: dict = {"dit": check_diffusers_dit(dit_folder, preset.dit, preset.name)}
    missing = []
    for role, rel in preset.files.items():
        if role == "dit":
            continue
        path = folder / rel
        if not path.exists() and role in DIFFUSERS_ALTERNATIVES and (folder / DIFFUSERS_ALTERNATIVES[role]).exists():
            path = folder / DIFFUSERS_ALTERNATIVES[role]
        if path.exists():
            paths[role] = path
        elif role not in LINGBOT_OPTIONAL_ROLES:
            missing.append(rel + (f" (or {DIFFUSERS_ALTERNATIVES[role]})" if role in DIFFUSERS_ALTERNATIVES else ""))
    if missing:
        raise CheckpointError(f"--checkpoint {folder}: the DiT is {dit_folder.relative_to(folder.parent)} (diffusers), "
                              f"but missing {', '.join(missing)} (preset {preset.name} reads them too)")
    return paths


GPU_MEMORY_BOUND = 192 * 2**30  # bytes: the largest single GPU's memory today (192 GB class); a bound, not a query


def dit_parameters_lower_bound(dit) -> int:
    """A lower bound on a DiT configuration's parameter count, from its widths alone (no torch):
    per block the self-attention's and cross-attention's q, k, v, o (8 dim^2) and the FFN
    (2 dim ffn_dim). mg2-universal: 1.39 B of its 1.62 B; LingBot-World fast 14.1 B of 18.5 B;
    loopworld 4.2 M of 5.8 M."""
    return int(dit.num_layers) * (8 * int(dit.dim) ** 2 + 2 * int(dit.dim) * int(dit.ffn_dim))


def physical_memory_bytes() -> int | None:
    """This machine's RAM in bytes (``os.sysconf``), or None where the OS does not say."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def nvidia_present() -> bool:
    """Whether this machine has an NVIDIA GPU driver loaded (its control device node), without torch."""
    import os

    return os.path.exists("/dev/nvidiactl")


def check_model_size(preset, device: str = "auto", dtype: str = "auto") -> None:
    """Refuse a preset whose DiT cannot fit before anything is allocated (a preset YAML with
    ``dim: 1000000000`` was an allocator traceback): the weights' lower bound
    (:func:`dit_parameters_lower_bound`, 4 bytes each in float32, 2 in bf16) against the memory the
    run has: this machine's RAM on a CPU (``--device cpu``, or ``auto`` without an NVIDIA device
    node), else the larger of the RAM and :data:`GPU_MEMORY_BOUND` (GPU memory is not queried without torch).

    Raises:
        InputError: one line naming the preset, its widths, the estimate and the memory (exit 2).
    """
    params = dit_parameters_lower_bound(preset.dit)
    ram = physical_memory_bytes()
    gpu = device == "cuda" or (device == "auto" and nvidia_present())
    per_param = 2 if dtype == "bf16" or (dtype == "auto" and gpu) else 4
    need = params * per_param
    have = max(ram or 0, GPU_MEMORY_BOUND) if gpu else ram
    if have and need > have:
        where = (f"this machine's {ram / 1e9:.1f} GB of RAM and any single GPU's ({GPU_MEMORY_BOUND / 1e9:.0f} GB)"
                 if gpu else f"this machine's {have / 1e9:.1f} GB of RAM")
        raise InputError(f"preset {preset.name}: dit: dim {preset.dit.dim}, ffn_dim {preset.dit.ffn_dim}, "
                         f"{preset.dit.num_layers} layers: at least {params:.3g} parameters, {need / 1e9:.3g} GB in "
                         f"{'bf16' if per_param == 2 else 'float32'}, more than {where}")


def check_weight_hooks(weights_dtype: str, offload: str, compile_mode: str) -> None:
    """Refuse fp8 weight storage or block offloading (diffusers' hooks, docs/gpu-memory.md) with ``--compile``:
    not measured together yet. ``auto`` values are not refused (``--offload auto`` never chooses blocks
    with ``--compile``). Called by the input checks before torch loads and by the loader
    (``PipelineBase.from_config``).

    Raises:
        InputError: one line naming both flags.
    """
    for flag, value, default in (("--weights-dtype", weights_dtype, "auto"), ("--offload", offload, "text")):
        if value not in (default, "auto") and compile_mode != "none":
            raise InputError(f"{flag} {value} with --compile {compile_mode}: the hooks are not measured under "
                             f"torch.compile yet; run one of them")

