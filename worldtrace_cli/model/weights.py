"""Reading weight files safely and checking them against a module (MG2 spec §4, §15, §18): the leaf
of the model package, used by every loader (the MG2 DiT, the Wan VAE, the CLIP tower, LingBot).

Only safe formats are read: safetensors, or ``torch.load(weights_only=True)`` for ``.pt``/``.pth``.
Mismatches raise :class:`~worldtrace_cli.errors.CheckpointError` with a one-line message naming
the missing / unexpected keys and wrong shapes.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import torch
from torch import nn

from ..errors import CheckpointError

_PREFIX = "model."
_SHOWN = 4  # names listed per category in an error line


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or ``.pt``/``.pth`` (weights only, never arbitrary pickles).

    Raises:
        CheckpointError: missing file, truncated or corrupt file, or a file that is not a flat
            name -> tensor mapping.
    """
    sd = read_weights_file(path)
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: not a state dict of tensors")
    return sd


def read_weights_file(path: str | Path):
    """The object of a ``.safetensors`` file (a flat dict) or a ``.pt``/``.pth`` read with
    ``weights_only=True`` (tensors and plain containers only, memory-mapped): nested dicts such as a
    training checkpoint's ``{"generator": ...}`` come back as they are.

    Raises:
        CheckpointError: missing file, truncated or corrupt file, Python objects besides tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path))
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:  # torch's message advises weights_only=False: never for an unknown file
        raise CheckpointError(f"{path}: cannot read weights: the file holds Python objects besides tensors, which "
                              f"could run code when loaded; worldtrace reads tensors only (safetensors, or a .pth "
                              f"of plain tensors)") from None
    except Exception as exc:  # corrupt/truncated files raise many different types
        kind = "safetensors" if path.suffix == ".safetensors" else "PyTorch (.pt/.pth, zip format)"
        raise CheckpointError(f"{path}: cannot read weights: not a readable {kind} file "
                              f"({type(exc).__name__}: {_first_line(exc)[:160]})") from None
    return sd


def strip_prefix(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the ``model.`` prefix of released MG2 DiT files when every key carries it."""
    if sd and all(k.startswith(_PREFIX) for k in sd):
        return {k[len(_PREFIX):]: v for k, v in sd.items()}
    return sd


def check_state_dict(model: nn.Module, sd: dict[str, torch.Tensor], source: str) -> None:
    """Compare names and shapes of ``sd`` with ``model.state_dict()``.

    Raises:
        CheckpointError: one line listing up to four missing keys, unexpected keys and shape
            mismatches (``name [got] != [expected]``) with their counts.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    shapes = [f"{k} {list(sd[k].shape)} != {list(v.shape)}" for k, v in expected.items()
              if k in sd and tuple(sd[k].shape) != tuple(v.shape)]
    bad_dtype = [f"{k} {sd[k].dtype}" for k in expected if k in sd and not sd[k].is_floating_point()]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes),
                         ("non-float dtype", bad_dtype)):
        if items:
            more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
            parts.append(f"{len(items)} {label}: {', '.join(items[:_SHOWN])}{more}")
    if parts:
        raise CheckpointError(f"{source}: state dict does not match the model: {'; '.join(parts)}")


def read_json(path: str | Path) -> dict:
    """Read a JSON object; errors name the file and line."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def file_identity(path: str | Path, full_hash: bool = False) -> dict:
    """Name, size (bytes) and sha256 of a checkpoint file: of its first 1 MiB (the safetensors
    header and more) by default, of the whole file with ``full_hash``."""
    path = Path(path)
    h = hashlib.sha256()
    with path.open("rb") as fh:
        if full_hash:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
        else:
            h.update(fh.read(1 << 20))
    return {"file": path.name, "bytes": path.stat().st_size,
            ("sha256" if full_hash else "sha256_first_mib"): h.hexdigest()}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""


# ----------------------------------------------------------------- int8 storage of a bundle's DiT

INT8_SCALE_SUFFIX = ".int8_scale"  # the key of a quantised tensor's per-row scales: ``<key>.int8_scale``
INT8_MIN_NUMEL = 4096  # smaller tensors (biases, norms, modulation vectors) stay floating point


def quantize_int8(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Store the matrices of a state dict in int8 with one scale per output row (symmetric absmax).

    Every floating tensor with ``ndim >= 2`` and at least :data:`INT8_MIN_NUMEL` elements (linear
    weights ``[out, in]``, convolution kernels ``[out, in, ...]``) becomes ``q = round(w / s)`` in
    int8 ``[-127, 127]`` under its own key, with ``s = max|w[row]| / 127`` (float32 ``[out]``; 1 for
    an all-zero row) under ``key + ".int8_scale"``; other tensors are returned as float16. The
    rounding error of an element is at most ``s / 2``. Storage only: :func:`dequantize_int8` turns
    the file back into floating tensors before a module sees it (no int8 arithmetic anywhere).

    The scheme is the common per-channel symmetric int8 one (PyTorch's ``per_channel_symmetric``
    qscheme with the range [-127, 127], zero points 0); written out here because only its storage is
    wanted: torch's quantized tensors cannot be saved as safetensors, and nothing here computes in int8.

    Args:
        sd: name -> tensor (any dtype, any device); not modified.

    Returns a new dict (contiguous CPU tensors), about half the bytes of float16.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        value = value.detach().cpu()
        if not value.is_floating_point():
            out[key] = value.contiguous()
            continue
        if value.ndim < 2 or value.numel() < INT8_MIN_NUMEL:
            out[key] = value.half().contiguous()
            continue
        w = value.float()
        rows = w.reshape(w.shape[0], -1)
        scale = rows.abs().amax(dim=1) / 127.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        out[key] = torch.round(rows / scale[:, None]).clamp_(-127, 127).to(torch.int8).reshape(w.shape).contiguous()
        out[key + INT8_SCALE_SUFFIX] = scale.contiguous()
    return out


def dequantize_int8(sd: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """The inverse of :func:`quantize_int8`: every int8 tensor times its per-row scales, as float32.

    A state dict without ``.int8_scale`` keys is returned as it is (float16/float32 files).
    ``source`` names the file in error messages. Quantised tensors come back float32 in their stored
    shape (``q [out, ...] * scale [out]`` broadcast over the trailing dimensions); the rest unchanged.

    Raises:
        CheckpointError: a scale without its tensor, an int8 tensor without its scale, or a scale
            that is not one float per row of its tensor (the key named).
    """
    scales = {k[:-len(INT8_SCALE_SUFFIX)]: v for k, v in sd.items() if k.endswith(INT8_SCALE_SUFFIX)}
    unscaled = [k for k, v in sd.items() if v.dtype == torch.int8 and k not in scales]
    if unscaled:
        raise CheckpointError(f"{source}: int8 tensor {unscaled[0]!r} has no {unscaled[0] + INT8_SCALE_SUFFIX!r}")
    if not scales:
        return sd
    out = {k: v for k, v in sd.items() if not k.endswith(INT8_SCALE_SUFFIX)}
    for key, scale in scales.items():
        q = out.get(key)
        if q is None or q.dtype != torch.int8:
            raise CheckpointError(f"{source}: {key + INT8_SCALE_SUFFIX!r} scales "
                                  f"{'no tensor' if q is None else f'a {q.dtype} tensor'} (an int8 {key!r} expected)")
        if not scale.is_floating_point() or scale.ndim != 1 or scale.numel() != q.shape[0]:
            raise CheckpointError(f"{source}: {key + INT8_SCALE_SUFFIX!r} is {scale.dtype} {list(scale.shape)}, "
                                  f"not one float per row of {key!r} {list(q.shape)}")
        out[key] = q.float() * scale.float().reshape(-1, *([1] * (q.ndim - 1)))
    return out


__all__ = ["INT8_MIN_NUMEL", "INT8_SCALE_SUFFIX", "check_state_dict", "dequantize_int8", "file_identity",
           "quantize_int8", "read_json", "read_state_dict", "strip_prefix"]
