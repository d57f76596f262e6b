"""Loading LingBot-World DiT weights (spec §13): a diffusers model folder or a single state-dict file.

The causal-fast release is a diffusers folder (``transformers/`` under the checkpoint root, spec §13):
``config.json`` plus one ``diffusion_pytorch_model.safetensors`` or shards listed in
``diffusion_pytorch_model.safetensors.index.json``. Keys have no prefix. Loading is strict: a missing,
unexpected or mis-shaped key is a one-line :class:`~worldtrace_cli.errors.CheckpointError` naming it
(:func:`~worldtrace_cli.model.checkpoint.check_state_dict`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...errors import CheckpointError
from ..weights import check_state_dict, read_json, read_state_dict
from .config import LingbotConfig
from .dit import LingbotDiT

DIT_SUBFOLDER = "transformers"  # v2 causal-fast (spec §13)
_INDEX = "diffusion_pytorch_model.safetensors.index.json"


def weight_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a diffusers model folder: the shards of its index, else the single
    ``*.safetensors`` file.

    Raises:
        CheckpointError: no folder, no weights, several unindexed files, or a shard the index names
            that is absent.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: LingBot DiT folder not found")
    if (folder / _INDEX).is_file():
        shards = sorted(set(read_json(folder / _INDEX).get("weight_map", {}).values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if not shards or missing:
            raise CheckpointError(f"{folder / _INDEX}: shards missing: {', '.join(missing) or 'empty weight_map'}")
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise CheckpointError(f"{folder}: expected one .safetensors file or {_INDEX}, found {len(files)} files")
    return files


def read_lingbot_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a folder (:func:`weight_files`) or of one ``.safetensors``/``.pt`` file."""
    path = Path(path)
    sd: dict[str, torch.Tensor] = {}
    for file in (weight_files(path) if path.is_dir() else [path]):
        sd.update(read_state_dict(file))
    return sd


def load_lingbot_dit(folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                     weights: str | Path | None = None) -> LingbotDiT:
    """Build a :class:`LingbotDiT` from ``folder/config.json`` and load its weights strictly.

    Args:
        folder: diffusers model folder (``config.json`` and weights), e.g. ``<ckpt>/transformers``;
            or a config JSON file, with ``weights`` then required.
        dtype: parameter dtype (bf16 files upcast exactly into float32).
        device: where the model lives.
        weights: a weights file or folder to use instead of ``folder``'s own.
    Returns:
        the model in eval mode.
    Raises:
        CheckpointError: unreadable or unknown config, missing weights, or a state dict that does not
            match the config (one line naming the keys).
    """
    folder = Path(folder)
    config = folder if folder.is_file() else folder / "config.json"
    if weights is None and folder.is_file():
        raise CheckpointError(f"{folder}: a config file needs a weights file or folder")
    cfg = LingbotConfig.from_dict(read_json(config), str(config))
    source = Path(weights) if weights is not None else folder
    sd = read_lingbot_state_dict(source)
    with torch.device("meta"):
        model = LingbotDiT(cfg)
    check_state_dict(model, sd, str(source))
    model.load_state_dict(sd, strict=True, assign=True)
    return model.to(device=device, dtype=dtype).eval()
