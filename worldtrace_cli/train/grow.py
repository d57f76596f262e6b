"""Grow a trained DiT deeper without changing what it computes (``worldtrace train grow``).

A DiT of ``L`` blocks becomes one of ``L' > L`` blocks of the same width: old block ``j`` moves to
block ``floor(j * L' / L)`` (the first stays first, the order is kept) and every other block is a
copy of the nearest old block before it whose residual outputs are zeroed: the self-attention and
cross-attention output projections (``self_attn.o``, ``cross_attn.o``), the FFN's second linear
(``ffn.2``) and the action module's projections back into the stream (``proj_mouse``,
``proj_keyboard``). A Wan block only adds to the residual stream (MG2 spec §5 step 4: ``x + gate *
self_attn``, ``+ cross_attn``, ``+ action``, ``+ gate * ffn``), so each new block starts as the
identity and the grown DiT's outputs equal the old DiT's; its copied query/key/value and FFN input
weights are trained features, and the zeroed projections get non-zero gradients at the first step
(the "function-preserving" growth of Net2Net, Chen et al. 2016, and depth up-scaling). Everything
outside the blocks (patch and time embeddings, ``img_emb``, the head) is carried over unchanged.

Why: a larger DiT trained from random weights needs the shipped DiT's ~8,900 steps again before it
is as good (benchmarks/results/loopworld-training/scale-2026-11-26/); one grown from the shipped
DiT starts there.
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import InputError
from ..model.config import DiTConfig

# parameters of a block whose output is added to the residual stream: zeroed in a new block
RESIDUAL_OUTPUTS = ("self_attn.o.", "cross_attn.o.", "ffn.2.", "action_model.proj_mouse.",
                    "action_model.proj_keyboard.")


def block_sources(old_layers: int, new_layers: int) -> list[tuple[int, bool]]:
    """For every block of the grown DiT, ``(old block it copies, is_new)``: old block ``j`` sits at
    ``floor(j * new_layers / old_layers)``; a new block copies the nearest old block before it.

    Raises:
        ValueError: ``new_layers < old_layers`` or ``old_layers < 1``.
    """
    if old_layers < 1 or new_layers < old_layers:
        raise ValueError(f"growth goes from >= 1 block to at least as many, got {old_layers} -> {new_layers}")
    at = {j * new_layers // old_layers: j for j in range(old_layers)}
    out, last = [], 0
    for i in range(new_layers):
        if i in at:
            last = at[i]
            out.append((last, False))
        else:
            out.append((last, True))
    return out


def grow_state_dict(state: dict[str, torch.Tensor], old: DiTConfig, new: DiTConfig,
                    fresh: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict of the grown DiT (:func:`block_sources`), float32, official parameter names
    (``state``'s names and shapes are not checked here: :func:`grow_dit` checks both sides).

    Args:
        state: the trained DiT's state dict (``old``'s config; any float dtype).
        old, new: the two configurations; ``new`` may differ only in ``num_layers`` (more) and
            ``action_config.blocks``.
        fresh: a state dict of ``new``'s architecture (e.g. seeded random weights; its names and
            shapes are the grown DiT's): where a block of the grown DiT has an action module and its
            source block has none, the module's weights come from here (with its projections zeroed).
    Raises:
        InputError (one line): the configurations differ in anything else, fewer blocks, or an old
            block with an action module would land on a block without one (its contribution would be lost).
    """
    keep = ("num_layers", "action_config")
    a = {k: v for k, v in dataclasses.asdict(old).items() if k not in keep}
    b = {k: v for k, v in dataclasses.asdict(new).items() if k not in keep}
    diff = sorted(k for k in a if a[k] != b[k])
    ac_a = {k: v for k, v in dataclasses.asdict(old.action_config).items() if k != "blocks"}
    ac_b = {k: v for k, v in dataclasses.asdict(new.action_config).items() if k != "blocks"}
    diff += sorted(f"action_config.{k}" for k in ac_a if ac_a[k] != ac_b[k])
    if diff:
        raise InputError(f"growth only adds blocks: the DiTs differ in {', '.join(diff)}")
    if new.num_layers < old.num_layers:
        raise InputError(f"growth only adds blocks: {old.num_layers} -> {new.num_layers}")
    old_action, new_action = set(old.action_config.blocks), set(new.action_config.blocks)
    sources = block_sources(old.num_layers, new.num_layers)
    for i, (j, is_new) in enumerate(sources):
        if not is_new and j in old_action and i not in new_action:
            raise InputError(f"growth would drop old block {j}'s action module (it becomes block {i}, "
                             f"not in the new action_config.blocks)")
    out = {k: v.float().clone() for k, v in state.items() if not k.startswith("blocks.")}
    for i, (j, is_new) in enumerate(sources):
        src = {k[len(f"blocks.{j}."):]: v for k, v in state.items() if k.startswith(f"blocks.{j}.")}
        for name, value in src.items():
            if name.startswith("action_model.") and i not in new_action:
                continue  # a new block without an action module (its source has one): not carried
            value = value.float().clone()
            if is_new and name.startswith(RESIDUAL_OUTPUTS):
                value.zero_()
            out[f"blocks.{i}.{name}"] = value
        if i in new_action and j not in old_action:  # an action module the source block lacks
            for k, v in fresh.items():
                if k.startswith(f"blocks.{i}.action_model."):
                    name = k[len(f"blocks.{i}."):]
                    out[k] = torch.zeros_like(v, dtype=torch.float32) if name.startswith(RESIDUAL_OUTPUTS) else v.float().clone()
    return out


def grow_dit(source, target, output, dit_file=None, seed: int = 0) -> dict:
    """Write the grown DiT of preset ``target`` from preset ``source``'s DiT (``dit_file``, a
    ``dit.safetensors`` of ``train dit``; default: ``source``'s own bundled weights) to ``output``
    (float32 safetensors, official names: ``train dit --preset TARGET --init OUTPUT`` continues it).

    Args:
        source, target: :class:`~worldtrace_cli.config.Preset` of the DiT that is grown and of the grown one.
        output: path of the weights file to write (its folder is made; written atomically).
        dit_file: path of the DiT weights to grow (any float dtype), or None for ``source``'s bundle.
        seed: seeds ``target``'s random weights, used only for action modules no old block provides.

    Returns ``{"file", "blocks": [(old block copied, is_new) per block of the grown DiT], "parameters"}``.
    Raises:
        InputError: as :func:`grow_state_dict`; ``dit_file`` omitted and ``source`` has no bundled weights.
        CheckpointError: ``dit_file`` is not ``source``'s DiT, or the grown state dict does not match
            ``target``'s DiT (a block layout this module does not know), both by
            :func:`~worldtrace_cli.model.weights.check_state_dict`.
    """
    from pathlib import Path

    from ..model.checkpoint import bundle_path, split_bundle
    from ..model.dit import CausalWanDiT
    from ..model.weights import check_state_dict, read_state_dict
    from .common import save_safetensors_atomic
    from .dit import build_dit

    if dit_file is None:
        if source.weights != "bundled":
            raise InputError(f"preset {source.name} has no bundled weights: pass --dit FILE")
        path = bundle_path(source)
        state = split_bundle(read_state_dict(path), str(path))["dit"]
    else:
        state = read_state_dict(dit_file)
    check_state_dict(CausalWanDiT(source.dit), state, f"{dit_file or source.name} (preset {source.name}'s DiT)")
    model = build_dit(target, seed)
    grown = grow_state_dict(state, source.dit, target.dit, model.state_dict())
    check_state_dict(model, grown, f"the grown DiT of preset {target.name}")  # a layout growth does not know
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    save_safetensors_atomic(grown, output)
    return {"file": str(output), "blocks": block_sources(source.dit.num_layers, target.dit.num_layers),
            "parameters": sum(v.numel() for v in grown.values())}


__all__ = ["RESIDUAL_OUTPUTS", "block_sources", "grow_dit", "grow_state_dict"]
