"""A causal Wan 2.1 text-to-video DiT in diffusers' format as ``--checkpoint`` (docs/diffusers.md,
"Diffusers-format checkpoints"), checked torch-free before anything loads.

The folder is a diffusers ``WanTransformer3DModel`` as ``save_pretrained`` writes it (the converted
Self-Forcing checkpoint ``gueraf/Self-Forcing-diffusers`` has this layout): ``config.json`` and either one
``diffusion_pytorch_model.safetensors`` or shards ``diffusion_pytorch_model-0000N-of-0000M.safetensors``
listed in ``diffusion_pytorch_model.safetensors.index.json``; ``--checkpoint`` names that folder or a
pipeline folder holding it as ``transformer/``. :func:`check_diffusers_dit` reads only ``config.json``,
the index and each shard's safetensors header (its JSON table of names, dtypes, shapes and offsets), and
refuses in one line (:class:`~worldtrace_cli.errors.CheckpointError`, exit 3) naming the file and the
field: another class, an image-to-video config, sizes that are not the preset's, a missing shard, a
tensor missing, extra, mis-shaped or not floating point (by name, diffusers' and ours), a truncated file.
:func:`read_diffusers_dit` then reads the tensors (torch imported there) under our names
(:mod:`~worldtrace_cli.model.wan_keys`).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError
from .wan_keys import diffusers_key_to_wan, wan_key_to_diffusers, wan_t2v_shapes, wan_transformer_kwargs

SUBFOLDER = "transformer"  # a diffusers pipeline folder's DiT
CLASS_NAME = "WanTransformer3DModel"
SINGLE = "diffusion_pytorch_model.safetensors"
INDEX = "diffusion_pytorch_model.safetensors.index.json"
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of the float dtypes a DiT may hold
IMAGE_FIELDS = {"image_dim": "an image embedder (image-to-video)",
                "added_kv_proj_dim": "image key/value projections in the cross-attention (image-to-video)",
                "pos_embed_seq_len": "a first/last-frame position embedding (FLF2V)"}
_HEADER_LIMIT = 100 * 2**20  # bytes: a safetensors header larger than this is not one
_SHOWN = 4  # names listed per category in an error line


@dataclass(frozen=True)
class DiffusersDiT:
    """A checked diffusers DiT folder: ``folder``, its ``files`` (the shards, or the one safetensors file),
    ``names`` (our name -> (diffusers name, file)) and ``config`` (its ``config.json``)."""

    folder: Path
    files: tuple[Path, ...]
    names: dict[str, tuple[str, Path]]
    config: dict


def diffusers_dit_folder(checkpoint: str | Path) -> Path | None:
    """The diffusers DiT folder ``checkpoint`` names: ``checkpoint/transformer`` when it holds a
    ``config.json`` (a pipeline folder), ``checkpoint`` itself when it holds ``config.json`` beside
    diffusers weights (``diffusion_pytorch_model*``), else None (another layout: a repository root)."""
    folder = Path(checkpoint)
    if (folder / SUBFOLDER / "config.json").is_file():
        return folder / SUBFOLDER
    if (folder / "config.json").is_file() and any(folder.glob("diffusion_pytorch_model*")):
        return folder
    return None


def read_json_object(path: Path) -> dict:
    """A JSON object from ``path`` (torch-free).

    Raises:
        CheckpointError: missing or unreadable file, invalid JSON (the line named), not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read: {type(exc).__name__}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (safetensors dtype name, shape) of every tensor in a ``.safetensors`` file, from its header
    alone (8 bytes of little-endian length, then that many bytes of JSON); the data offsets are checked to
    lie within the file (a truncated file is refused).

    Raises:
        CheckpointError: a missing file, or one that is not a readable safetensors file (one line)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    size = path.stat().st_size
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= min(_HEADER_LIMIT, size - 8):
                raise ValueError(f"header length {n} in a file of {size} bytes")
            table = json.loads(fh.read(n))
        tensors = {}
        for name, entry in table.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            if not 0 <= start <= end <= size - 8 - n:
                raise ValueError(f"tensor {name!r} lies past the end of the file (truncated?)")
            tensors[name] = (str(entry["dtype"]), tuple(int(d) for d in entry["shape"]))
    except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    return tensors


def check_diffusers_config(path: Path, dit, preset_name: str) -> dict:
    """Check a diffusers ``config.json`` against a preset's t2v DiT sizes (``dit``: ``dim``, ``ffn_dim``,
    ``num_heads``, ``num_layers``, ``in_dim``, ``out_dim``, ``freq_dim``, ``eps``). Returns the config.

    Raises:
        CheckpointError: one line naming the file and the field: ``_class_name`` not
            ``WanTransformer3DModel``, an image-to-video field set (``image_dim``, ``added_kv_proj_dim``,
            ``pos_embed_seq_len``), a size field missing or not the preset's (every such field listed)."""
    config = read_json_object(path)
    name = config.get("_class_name")
    if name != CLASS_NAME:
        raise CheckpointError(f"{path}: _class_name {name!r} is not a Wan transformer ({CLASS_NAME}); preset "
                              f"{preset_name} reads a causal Wan 2.1 text-to-video DiT")
    for field, what in IMAGE_FIELDS.items():
        if config.get(field) is not None:
            raise CheckpointError(f"{path}: {field} {config[field]!r}: {what}; preset {preset_name} is a "
                                  f"text-to-video model ({field} null)")
    expected = wan_transformer_kwargs(dit.dim, dit.ffn_dim, dit.num_heads, dit.num_layers, dit.in_dim, dit.out_dim,
                                      dit.freq_dim, dit.eps)
    wrong = []
    for field, want in expected.items():
        got = config.get(field, "missing")
        if isinstance(want, tuple):
            same = isinstance(got, list) and tuple(got) == want
        elif isinstance(want, float):
            same = isinstance(got, (int, float)) and not isinstance(got, bool) and math.isclose(got, want, rel_tol=1e-9)
        else:
            same = type(got) is type(want) and got == want
        if not same:
            wrong.append(f"{field} {json.dumps(got) if got != 'missing' else 'missing'} "
                         f"(the preset's: {json.dumps(list(want) if isinstance(want, tuple) else want)})")
    if wrong:
        raise CheckpointError(f"{path}: does not describe preset {preset_name}'s DiT: {', '.join(wrong)}")
    return config


def weight_files(folder: Path) -> tuple[Path, ...]:
    """The safetensors files of a diffusers model folder: the shards its index lists, else its one
    ``diffusion_pytorch_model.safetensors``.

    Raises:
        CheckpointError: one line: a shard the index lists that is absent (named), an index without a
            ``weight_map``, shards without an index, a ``.bin`` folder (safetensors only), no weights."""
    index = folder / INDEX
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: no weight_map of tensor names to shard files")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            counts = [sum(1 for v in weight_map.values() if v == s) for s in missing]
            raise CheckpointError(f"{index}: shard {', '.join(missing)} missing (listed for "
                                  f"{', '.join(map(str, counts))} tensors; {len(shards) - len(missing)} of "
                                  f"{len(shards)} shards present)")
        return tuple(folder / s for s in shards)
    if (folder / SINGLE).is_file():
        return (folder / SINGLE,)
    if any(folder.glob("diffusion_pytorch_model-*-of-*.safetensors")):
        raise CheckpointError(f"{folder}: safetensors shards without their index {INDEX}")
    if any(folder.glob("diffusion_pytorch_model*.bin")):
        raise CheckpointError(f"{folder}: diffusion_pytorch_model.bin: worldtrace reads safetensors only (a .bin "
                              f"is a pickle that could run code); save the model with safe_serialization")
    raise CheckpointError(f"{folder}: no weights: expected {SINGLE} or {INDEX} beside config.json")


def _listed(items: list[str]) -> str:
    more = f" (+{len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def check_diffusers_dit(folder: Path, dit, preset_name: str) -> DiffusersDiT:
    """Check a diffusers DiT folder against a preset's t2v DiT before any tensor is read: its
    ``config.json`` (:func:`check_diffusers_config`), its weight files (:func:`weight_files`), and every
    tensor's name, dtype and shape from the safetensors headers against :func:`wan_t2v_shapes`.

    Raises:
        CheckpointError: one line naming the file and what is wrong; for the tensors: the ones missing
            (diffusers' name, ours in parentheses), unexpected (diffusers' name), of another shape
            (``name [got] != [expected]``), not floating point, named twice, or absent from the shard
            the index names."""
    folder = Path(folder)
    config = check_diffusers_config(folder / "config.json", dit, preset_name)
    files = weight_files(folder)
    found: dict[str, tuple[str, tuple[int, ...], Path]] = {}
    for file in files:
        for name, (dtype, shape) in read_safetensors_header(file).items():
            if name in found:
                raise CheckpointError(f"{file}: tensor {name} is in {found[name][2].name} too")
            found[name] = (dtype, shape, file)
    if (folder / INDEX).is_file():
        weight_map = read_json_object(folder / INDEX)["weight_map"]
        astray = [f"{k} (in {v})" for k, v in weight_map.items() if k not in found or found[k][2].name != v]
        if astray:
            raise CheckpointError(f"{folder / INDEX}: {len(astray)} tensors not in the shard it names: {_listed(astray)}")
    expected = wan_t2v_shapes(dit.dim, dit.ffn_dim, dit.num_heads, dit.num_layers, dit.in_dim, dit.out_dim, dit.freq_dim)
    names, unexpected = {}, []
    for name, (_, _, file) in found.items():
        try:
            ours = diffusers_key_to_wan(name)
        except ValueError:
            ours = None
        if ours in expected:
            names[ours] = (name, file)
        else:
            unexpected.append(name)
    missing = [f"{wan_key_to_diffusers(k)} (ours: {k})" for k in expected if k not in names]
    shapes = [f"{d} {list(found[d][1])} != {list(expected[k])}" for k, (d, _) in names.items()
              if found[d][1] != expected[k]]
    dtypes = [f"{d} {found[d][0]}" for k, (d, _) in names.items() if found[d][0] not in FLOAT_DTYPES]
    parts = [f"{len(items)} {label}: {_listed(items)}" for label, items in
             (("missing", missing), ("unexpected", unexpected), ("wrong shape", shapes), ("non-float dtype", dtypes))
             if items]
    if parts:
        raise CheckpointError(f"{folder}: does not match preset {preset_name}'s DiT: {'; '.join(parts)}")
    return DiffusersDiT(folder, files, names, config)


def read_diffusers_dit(checked: DiffusersDiT) -> dict:
    """The tensors of a checked folder (:func:`check_diffusers_dit`) under our names (the original Wan
    ones, :class:`~worldtrace_cli.model.lingbot.dit.LingbotDiT`'s), as stored (bf16 stays bf16),
    memory-mapped per file.

    Raises:
        CheckpointError: a file that cannot be read after all (one line naming it)."""
    from .weights import read_state_dict

    ours = {d: k for k, (d, _) in checked.names.items()}
    sd = {}
    for file in checked.files:
        sd.update({ours[k]: v for k, v in read_state_dict(file).items()})
    return sd


__all__ = ["CLASS_NAME", "DiffusersDiT", "INDEX", "SINGLE", "SUBFOLDER", "check_diffusers_config",
           "check_diffusers_dit", "diffusers_dit_folder", "read_diffusers_dit", "read_json_object",
           "read_safetensors_header", "weight_files"]
