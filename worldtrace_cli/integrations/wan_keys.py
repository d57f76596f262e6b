"""Original Wan 2.1 DiT names <-> diffusers ``WanTransformer3DModel``: the key map lives in
:mod:`worldtrace_cli.model.wan_keys` (torch-free, the room below; the checkpoint loaders read diffusers
folders with it) and is re-exported here with :func:`wan_transformer_from_original`, which builds the
diffusers model.
"""

from __future__ import annotations

import torch

from ..model.wan_keys import (diffusers_key_to_wan, diffusers_to_wan, wan_key_to_diffusers, wan_t2v_shapes,  # noqa: F401
                              wan_to_diffusers, wan_transformer_kwargs)


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


__all__ = ["diffusers_key_to_wan", "diffusers_to_wan", "wan_key_to_diffusers", "wan_t2v_shapes", "wan_to_diffusers",
           "wan_transformer_from_original", "wan_transformer_kwargs"]
