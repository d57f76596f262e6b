"""LongLive v1.0's LoRA, merged into the DiT's weights at load (selfforcing-architecture.md §10.4).

LongLive wraps every ``nn.Linear`` of each attention block (self-attention q/k/v/o, cross-attention
q/k/v/o, ``ffn.0``, ``ffn.2``: 10 per block) with a PEFT adapter, unmerged:
``y = W x + b + (alpha / r) B (A x)``, A [r, in], B [out, r]. Merged once at load,
``W' = W + (alpha / r) B A`` gives the same function (the fixture's LoRA replays within float32
rounding: docs/selfforcing.md) at no cost per call; the shipped adapter is rank 256, alpha 256 (scale 1).
The file is ``lora.pt`` (``generator_lora`` or the state dict itself) or a safetensors file, keys
``base_model.model.blocks.{l}.{self_attn|cross_attn}.{q|k|v|o}.lora_{A|B}.weight`` and
``base_model.model.blocks.{l}.ffn.{0|2}.lora_{A|B}.weight``.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ...errors import CheckpointError
from ..weights import read_weights_file

PREFIX = "base_model.model."
_KEY = re.compile(r"^(blocks\.\d+\.(?:self_attn|cross_attn)\.[qkvo]|blocks\.\d+\.ffn\.[02])\.lora_([AB])\.weight$")
TARGETS_PER_BLOCK = 10


def read_lora(path: str | Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors of ``path`` (``generator_lora`` entry or flat; ``.pt`` read weights-only).

    Raises:
        CheckpointError: a missing or unreadable file, or no tensors.
    """
    raw = read_weights_file(path)
    sd = raw.get("generator_lora", raw) if isinstance(raw, dict) else None
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: no LoRA state dict (expected generator_lora or a flat dict of tensors)")
    return sd


@torch.no_grad()
def merge_lora(dit, lora: dict[str, torch.Tensor], alpha: float | None = None, source: str = "lora") -> int:
    """Add ``(alpha / r) B A`` to every targeted Linear's weight of ``dit`` in place (float32 product,
    cast to the weight's dtype). ``alpha`` None: r (scale 1, as shipped). Returns the number of
    targets merged (10 per block).

    Raises:
        CheckpointError: a key that is not a LongLive target, an A without its B (or the reverse),
            shapes that do not fit the layer, or blocks without an adapter (one line naming them).
    """
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in lora.items():
        m = _KEY.match(key[len(PREFIX):] if key.startswith(PREFIX) else key)
        if m is None:
            raise CheckpointError(f"{source}: unexpected LoRA key {key} (LongLive targets the blocks' attention "
                                  f"q/k/v/o and ffn.0/ffn.2)")
        pairs.setdefault(m.group(1), {})[m.group(2)] = tensor
    half = sorted(name for name, ab in pairs.items() if len(ab) != 2)
    if half:
        raise CheckpointError(f"{source}: LoRA A or B missing for {', '.join(half[:4])}")
    expected = len(dit.blocks) * TARGETS_PER_BLOCK
    if len(pairs) != expected:
        raise CheckpointError(f"{source}: {len(pairs)} LoRA targets, the DiT has {expected} (10 per block)")
    modules = dict(dit.named_modules())
    for name, ab in sorted(pairs.items()):
        layer = modules.get(name)
        a, b = ab["A"].float(), ab["B"].float()
        if layer is None or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != tuple(layer.weight.shape):
            raise CheckpointError(f"{source}: LoRA {name} A {list(a.shape)} B {list(b.shape)} does not fit the "
                                  f"layer {list(layer.weight.shape) if layer is not None else '(none)'}")
        rank = a.shape[0]
        scale = (rank if alpha is None else alpha) / rank
        delta = scale * (b.to(layer.weight.device) @ a.to(layer.weight.device))
        layer.weight.copy_((layer.weight.float() + delta).to(layer.weight.dtype))
    return len(pairs)


__all__ = ["merge_lora", "read_lora"]
