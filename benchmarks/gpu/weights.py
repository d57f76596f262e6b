"""Weights files across the device machine's limits: float16 copies split into parts that come back.

    python3 benchmarks/gpu/weights.py half SRC DST [--max-mib 15]
    python3 benchmarks/gpu/weights.py join PART [PART ...] -o FILE

A file that a device call leaves under $OUT comes back only when it is at most 16 MiB (and at most 8
files come back), so ``half`` writes a float16 copy of the safetensors file SRC (floating tensors
halved; others as they are) as DST when it fits in ``--max-mib`` MiB, else as parts
``DST-part1-of-N.safetensors`` ... each holding whole tensors and at most ``--max-mib`` MiB (a
3x loopworld DiT, 17.4 M parameters, is 33 MiB in float16: three parts). ``join`` merges parts back
into one safetensors file (float16, as the parts hold), which ``worldtrace train dit --init`` and
``benchmarks/loopworld_candidate.sh`` read.

Errors: SystemExit with a one-line message for a missing file, a tensor larger than ``--max-mib``
on its own, a name held by two parts, or parts of different sets (``-of-N`` differs or a part is
missing).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MIB = 2**20


def half(src: Path, dst: Path, max_mib: float = 15.0) -> list[Path]:
    """Write the float16 copy of ``src`` (floating tensors of any dtype -> torch.float16, shapes kept;
    integer tensors unchanged) as ``dst``, or as ``dst``'s ``-partK-of-N`` parts of whole tensors of at
    most ``max_mib`` MiB (2**20 bytes) each, tensors taken in name order. ``dst``'s folder is made
    when missing.

    Returns:
        The files written, in order.
    Raises:
        SystemExit: ``src`` missing, or one tensor alone over ``max_mib``.
    """
    import torch
    from safetensors.torch import load_file, save_file

    if not src.is_file():
        sys.exit(f"{src}: no such weights file")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in load_file(str(src)).items()}
    limit = max_mib * MIB
    parts: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        n = tensors[name].numel() * tensors[name].element_size()
        if n > limit:
            sys.exit(f"{src}: tensor {name} is {n / MIB:.1f} MiB in float16, over --max-mib {max_mib}")
        if size + n > limit and parts[-1]:
            parts.append({})
            size = 0
        parts[-1][name] = tensors[name]
        size += n
    if len(parts) == 1:
        save_file(parts[0], str(dst))
        return [dst]
    stem = dst.name.removesuffix(".safetensors")
    out = [dst.with_name(f"{stem}-part{i}-of-{len(parts)}.safetensors") for i in range(1, len(parts) + 1)]
    for path, part in zip(out, parts):
        save_file(part, str(path))
    return out


def join(parts: list[Path], output: Path) -> None:
    """Merge ``parts`` (all of one ``-partK-of-N`` set written by :func:`half`, any order) into one
    safetensors file ``output``; tensors keep their names, shapes and dtypes.

    Raises:
        SystemExit: a file that is not a part, parts of different sets or a missing part, or a tensor
            name in two parts.
    """
    from safetensors.torch import load_file, save_file

    output.parent.mkdir(parents=True, exist_ok=True)
    found = {}
    for p in parts:
        m = re.search(r"-part(\d+)-of-(\d+)\.safetensors$", p.name)
        if m is None or not p.is_file():
            sys.exit(f"{p}: not a part file (NAME-partK-of-N.safetensors)")
        found[int(m.group(1))] = (int(m.group(2)), p)
    totals = {n for n, _ in found.values()}
    if len(totals) != 1 or sorted(found) != list(range(1, totals.pop() + 1)):
        sys.exit(f"parts {sorted(found)} are not one complete set (-of-N differs or a part is missing)")
    merged = {}
    for k in sorted(found):
        for name, t in load_file(str(found[k][1])).items():
            if name in merged:
                sys.exit(f"{found[k][1]}: tensor {name} is also in another part")
            merged[name] = t
    save_file(merged, str(output))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    h = sub.add_parser("half", help="float16 copy of SRC as DST, or as parts of at most --max-mib MiB")
    h.add_argument("src", type=Path)
    h.add_argument("dst", type=Path)
    h.add_argument("--max-mib", type=float, default=15.0)
    j = sub.add_parser("join", help="merge DST-partK-of-N files into one")
    j.add_argument("parts", type=Path, nargs="+")
    j.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.command == "half":
        for path in half(args.src, args.dst, args.max_mib):
            print(path)
    else:
        join(args.parts, args.output)
        print(args.output)


if __name__ == "__main__":
    main()
