"""Original Wan 2.1 DiT state dicts (the official ``WanModel`` / Self-Forcing ``CausalWanModel`` names, which
worldtrace's :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT` keeps) <-> diffusers ``WanTransformer3DModel``.

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
renames the same way; ``tests/test_diffusers_hook.py`` checks both agree key for key.
"""

from __future__ import annotations

import re

import torch

_BLOCK = {"modulation": "scale_shift_table", "norm3": "norm2", "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2"}
_ATTN = {"self_attn": "attn1", "cross_attn": "attn2"}
_PROJ = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "norm_q": "norm_q", "norm_k": "norm_k"}
_TOP = {"patch_embedding": "patch_embedding", "text_embedding.0": "condition_embedder.text_embedder.linear_1",
        "text_embedding.2": "condition_embedder.text_embedder.linear_2",
        "time_embedding.0": "condition_embedder.time_embedder.linear_1",
        "time_embedding.2": "condition_embedder.time_embedder.linear_2",
        "time_projection.1": "condition_embedder.time_proj", "head.head": "proj_out",
        "head.modulation": "scale_shift_table"}
_PARAM = re.compile(r"^(.*)\.(weight|bias)$")


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
        if key.endswith(".modulation") and rest == "modulation":
            return f"blocks.{i}.scale_shift_table"
        if rest in _BLOCK:
            return f"blocks.{i}.{_BLOCK[rest]}.{leaf}"
        a = re.match(r"^(self_attn|cross_attn)\.(q|k|v|o|norm_q|norm_k)$", rest)
        if a:
            return f"blocks.{i}.{_ATTN[a.group(1)]}.{_PROJ[a.group(2)]}.{leaf}"
    raise ValueError(f"state dict key {key!r}: not a Wan 2.1 t2v DiT parameter (wan_keys maps the t2v layout)")


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
    """The inverse of :func:`wan_to_diffusers` (a diffusers t2v state dict -> the original names).

    Raises:
        ValueError: a key that no original t2v name maps to."""
    blocks = sorted({int(k.split(".")[1]) for k in state_dict if k.startswith("blocks.")})
    names = list(_TOP) + [f"blocks.{i}.{part}" for i in blocks for part in
                          ["ffn.0", "ffn.2", "norm3"] + [f"{a}.{p}" for a in _ATTN for p in _PROJ]]
    inverse = {wan_key_to_diffusers(f"{n}.{leaf}"): f"{n}.{leaf}" for n in names for leaf in ("weight", "bias")}
    inverse["scale_shift_table"] = "head.modulation"
    inverse.update({f"blocks.{i}.scale_shift_table": f"blocks.{i}.modulation" for i in blocks})
    unknown = [k for k in state_dict if k not in inverse]
    if unknown:
        raise ValueError(f"state dict key {unknown[0]!r}: not a diffusers WanTransformer3DModel t2v parameter")
    return {inverse[k]: v for k, v in state_dict.items()}


def wan_transformer_kwargs(dim: int, ffn_dim: int, num_heads: int, num_layers: int, in_dim: int = 16,
                           out_dim: int = 16, freq_dim: int = 256, eps: float = 1e-6, text_dim: int = 4096) -> dict:
    """``WanTransformer3DModel(**kwargs)`` of an original Wan 2.1 t2v config (its ``config.json`` keys:
    ``dim``, ``ffn_dim``, ``num_heads``, ``num_layers``, ``in_dim``, ``out_dim``, ``freq_dim``, ``eps``):
    patch (1, 2, 2), the cross-attention norm on, q/k RMSNorm across heads.

    Raises:
        ValueError: ``dim`` not divisible by ``num_heads``."""
    if dim % num_heads:
        raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
    return {"patch_size": (1, 2, 2), "num_attention_heads": num_heads, "attention_head_dim": dim // num_heads,
            "in_channels": in_dim, "out_channels": out_dim, "text_dim": text_dim, "freq_dim": freq_dim,
            "ffn_dim": ffn_dim, "num_layers": num_layers, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
            "eps": eps}


def wan_transformer_from_original(state_dict: dict[str, torch.Tensor], config: dict, dtype: torch.dtype = torch.float32,
                                  device: str | torch.device = "cpu"):
    """A diffusers ``WanTransformer3DModel`` in eval mode holding an original Wan 2.1 t2v state dict
    (strictly: every parameter, no extra), from the original ``config.json`` dict (``dim``, ``ffn_dim``,
    ``num_heads``, ``num_layers``, ``in_dim``, ``out_dim``, ``freq_dim``, ``eps``; other keys ignored).

    Raises:
        ValueError: a config without those keys, a key outside the layout, or missing / unexpected parameters."""
    from diffusers import WanTransformer3DModel

    need = ("dim", "ffn_dim", "num_heads", "num_layers")
    if any(k not in config for k in need):
        raise ValueError(f"config: needs {', '.join(need)} (the original config.json), got {sorted(config)}")
    kwargs = wan_transformer_kwargs(**{k: config[k] for k in
                                       ("dim", "ffn_dim", "num_heads", "num_layers", "in_dim", "out_dim", "freq_dim", "eps")
                                       if k in config})
    model = WanTransformer3DModel(**kwargs)
    missing, unexpected = model.load_state_dict(wan_to_diffusers(state_dict), strict=False)
    if missing or unexpected:
        raise ValueError(f"state dict: missing {missing[:3]}, unexpected {unexpected[:3]} for {kwargs}")
    model = model.to(device=device) if dtype == torch.float32 else model.to(device=device, dtype=dtype)
    return model.eval().requires_grad_(False)


__all__ = ["diffusers_to_wan", "wan_key_to_diffusers", "wan_to_diffusers", "wan_transformer_from_original",
           "wan_transformer_kwargs"]
