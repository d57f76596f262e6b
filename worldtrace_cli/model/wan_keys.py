"""Original Wan 2.1 DiT state dicts (the official ``WanModel`` / Self-Forcing ``CausalWanModel`` names, which
worldtrace's :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` keeps) <-> diffusers ``WanTransformer3DModel``;
torch-free (the input checks read a diffusers folder's names and shapes before torch loads).

The two layouts, module by module (t2v; the ``img_emb`` / ``k_img`` modules of i2v are not mapped):

============================================  ==============================================================
original                                      diffusers
============================================  ==============================================================
``patch_embedding``                           ``patch_embedding``
``text_embedding.0`` / ``.2``                 ``condition_embedder.text_embedder.linear_1`` / ``linear_2``
``time_embedding.0`` / ``.2``                 ``condition_embedder.time_embedder.linear_1`` / ``linear_2``
``time_projection.1``                         ``condition_embedder.time_proj``
``blocks.i.modulation``                       ``blocks.i.scale_shift_table``
``blocks.i.self_attn.{q,k,v,o}``              ``blocks.i.attn1.{to_q,to_k,to_v,to_out.0}``
``blocks.i.self_attn.norm_{q,k}``             ``blocks.i.attn1.norm_{q,k}``
``blocks.i.cross_attn.*``                     ``blocks.i.attn2.*`` (same renames)
``blocks.i.norm3`` (the cross-attention norm)  ``blocks.i.norm2``
``blocks.i.ffn.0`` / ``.2``                   ``blocks.i.ffn.net.0.proj`` / ``ffn.net.2``
``head.head`` / ``head.modulation``           ``proj_out`` / ``scale_shift_table``
============================================  ==============================================================

diffusers' own single-file loader (``diffusers.loaders.single_file_utils.convert_wan_transformer_to_diffusers``)
renames the same way; ``tests/test_diffusers_hook.py`` checks both agree key for key, and
``tests/test_diffusers_checkpoint.py`` that :func:`wan_t2v_shapes` is the t2v ``LingbotDiT``'s every shape.
:mod:`worldtrace_cli.integrations.wan_keys` re-exports this module with the diffusers model builder.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_BLOCK = {"modulation": "scale_shift_table", "norm3": "norm2", "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2"}
_ATTN = {"self_attn": "attn1", "cross_attn": "attn2"}
_PROJ = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "norm_q": "norm_q", "norm_k": "norm_k"}
_TOP = {"patch_embedding": "patch_embedding", "text_embedding.0": "condition_embedder.text_embedder.linear_1",
        "text_embedding.2": "condition_embedder.text_embedder.linear_2",
        "time_embedding.0": "condition_embedder.time_embedder.linear_1",
        "time_embedding.2": "condition_embedder.time_embedder.linear_2",
        "time_projection.1": "condition_embedder.time_proj", "head.head": "proj_out"}
_PARAM = re.compile(r"^(.*)\.(weight|bias)$")
_INVERSE_TOP = {v: k for k, v in _TOP.items()}
_INVERSE_BLOCK = {v: k for k, v in _BLOCK.items() if k != "modulation"}
_INVERSE_ATTN = {v: k for k, v in _ATTN.items()}
_INVERSE_PROJ = {v: k for k, v in _PROJ.items()}
TEXT_DIM = 4096  # umT5-XXL's width: the DiT's text_embedding.0 input, diffusers' ``text_dim``
PATCH = (1, 2, 2)  # Wan 2.1's patch (frames, height, width), diffusers' ``patch_size``


def wan_key_to_diffusers(key: str) -> str:
    """One original Wan 2.1 t2v parameter name -> its diffusers ``WanTransformer3DModel`` name.

    Raises:
        ValueError: a name outside the t2v layout (camera modules, i2v image modules, a typo)."""
    if key == "head.modulation":
        return "scale_shift_table"
    m = _PARAM.match(key)
    module, leaf = (m.group(1), m.group(2)) if m else (None, None)
    if module in _TOP:
        return f"{_TOP[module]}.{leaf}"
    b = re.match(r"^blocks\.(\d+)\.(.+)$", module or key)
    if b:
        i, rest = b.groups()
        if rest == "modulation" and key.endswith(".modulation"):
            return f"blocks.{i}.scale_shift_table"
        if rest in _BLOCK and leaf:
            return f"blocks.{i}.{_BLOCK[rest]}.{leaf}"
        a = re.match(r"^(self_attn|cross_attn)\.(q|k|v|o|norm_q|norm_k)$", rest)
        if a and leaf:
            return f"blocks.{i}.{_ATTN[a.group(1)]}.{_PROJ[a.group(2)]}.{leaf}"
    raise ValueError(f"state dict key {key!r}: not a Wan 2.1 t2v DiT parameter (wan_keys maps the t2v layout)")


def diffusers_key_to_wan(key: str) -> str:
    """One diffusers ``WanTransformer3DModel`` t2v parameter name -> its original Wan 2.1 name (the inverse of
    :func:`wan_key_to_diffusers`).

    Raises:
        ValueError: a name no original t2v parameter maps to (i2v ``add_k_proj`` / ``image_embedder``, a typo)."""
    if key == "scale_shift_table":
        return "head.modulation"
    m = _PARAM.match(key)
    module, leaf = (m.group(1), m.group(2)) if m else (None, None)
    if module in _INVERSE_TOP:
        return f"{_INVERSE_TOP[module]}.{leaf}"
    b = re.match(r"^blocks\.(\d+)\.(.+)$", module or key)
    if b:
        i, rest = b.groups()
        if rest == "scale_shift_table" and key.endswith(".scale_shift_table"):
            return f"blocks.{i}.modulation"
        if rest in _INVERSE_BLOCK and leaf:
            return f"blocks.{i}.{_INVERSE_BLOCK[rest]}.{leaf}"
        a = re.match(r"^(attn1|attn2)\.(to_q|to_k|to_v|to_out\.0|norm_q|norm_k)$", rest)
        if a and leaf:
            return f"blocks.{i}.{_INVERSE_ATTN[a.group(1)]}.{_INVERSE_PROJ[a.group(2)]}.{leaf}"
    raise ValueError(f"state dict key {key!r}: not a diffusers WanTransformer3DModel t2v parameter")


def wan_to_diffusers(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An original Wan 2.1 t2v state dict (keys optionally prefixed ``model.``, as Self-Forcing's
    ``.pt`` files hold them) renamed for ``WanTransformer3DModel.load_state_dict``; tensors are shared,
    not copied.

    Raises:
        ValueError: a key outside the layout (named)."""
    out = {}
    for key, value in state_dict.items():
        name = key[len("model."):] if key.startswith("model.") else key
        out[wan_key_to_diffusers(name)] = value
    return out


def diffusers_to_wan(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`wan_to_diffusers` (a diffusers t2v state dict -> the original names); tensors
    are shared, not copied.

    Raises:
        ValueError: a key that no original t2v name maps to (the first one named)."""
    return {diffusers_key_to_wan(k): v for k, v in state_dict.items()}


def wan_t2v_shapes(dim: int, ffn_dim: int, num_heads: int, num_layers: int, in_dim: int = 16, out_dim: int = 16,
                   freq_dim: int = 256, text_dim: int = TEXT_DIM) -> dict[str, tuple[int, ...]]:
    """Every parameter of a Wan 2.1 t2v DiT of these sizes, original name -> shape (the ``LingbotDiT``'s
    ``model_type: t2v`` state dict, 25 tensors a block + 13; Wan2.1-T2V-1.3B: 825), computed without torch.

    Raises:
        ValueError: ``dim`` not divisible by ``num_heads``."""
    if dim % num_heads:
        raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
    p = PATCH[0] * PATCH[1] * PATCH[2]
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (dim, in_dim, *PATCH), "patch_embedding.bias": (dim,),
        "text_embedding.0.weight": (dim, text_dim), "text_embedding.0.bias": (dim,),
        "text_embedding.2.weight": (dim, dim), "text_embedding.2.bias": (dim,),
        "time_embedding.0.weight": (dim, freq_dim), "time_embedding.0.bias": (dim,),
        "time_embedding.2.weight": (dim, dim), "time_embedding.2.bias": (dim,),
        "time_projection.1.weight": (6 * dim, dim), "time_projection.1.bias": (6 * dim,)}
    for i in range(num_layers):
        shapes[f"blocks.{i}.modulation"] = (1, 6, dim)
        for attn in _ATTN:
            for proj in ("q", "k", "v", "o"):
                shapes[f"blocks.{i}.{attn}.{proj}.weight"] = (dim, dim)
                shapes[f"blocks.{i}.{attn}.{proj}.bias"] = (dim,)
            shapes[f"blocks.{i}.{attn}.norm_q.weight"] = shapes[f"blocks.{i}.{attn}.norm_k.weight"] = (dim,)
        shapes[f"blocks.{i}.norm3.weight"] = shapes[f"blocks.{i}.norm3.bias"] = (dim,)
        shapes[f"blocks.{i}.ffn.0.weight"], shapes[f"blocks.{i}.ffn.0.bias"] = (ffn_dim, dim), (ffn_dim,)
        shapes[f"blocks.{i}.ffn.2.weight"], shapes[f"blocks.{i}.ffn.2.bias"] = (dim, ffn_dim), (dim,)
    shapes.update({"head.modulation": (1, 2, dim), "head.head.weight": (out_dim * p, dim),
                   "head.head.bias": (out_dim * p,)})
    return shapes


def wan_transformer_kwargs(dim: int, ffn_dim: int, num_heads: int, num_layers: int, in_dim: int = 16,
                           out_dim: int = 16, freq_dim: int = 256, eps: float = 1e-6, text_dim: int = TEXT_DIM) -> dict:
    """``WanTransformer3DModel(**kwargs)`` of an original Wan 2.1 t2v config (its ``config.json`` keys:
    ``dim``, ``ffn_dim``, ``num_heads``, ``num_layers``, ``in_dim``, ``out_dim``, ``freq_dim``, ``eps``):
    patch (1, 2, 2), the cross-attention norm on, q/k RMSNorm across heads; also what a diffusers t2v
    folder's ``config.json`` must say (:mod:`~worldtrace_cli.model.diffusers_folder`).

    Raises:
        ValueError: ``dim`` not divisible by ``num_heads``."""
    if dim % num_heads:
        raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
    return {"patch_size": PATCH, "num_attention_heads": num_heads, "attention_head_dim": dim // num_heads,
            "in_channels": in_dim, "out_channels": out_dim, "text_dim": text_dim, "freq_dim": freq_dim,
            "ffn_dim": ffn_dim, "num_layers": num_layers, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
            "eps": eps}


__all__ = ["PATCH", "TEXT_DIM", "diffusers_key_to_wan", "diffusers_to_wan", "wan_key_to_diffusers", "wan_t2v_shapes",
           "wan_to_diffusers", "wan_transformer_kwargs"]
