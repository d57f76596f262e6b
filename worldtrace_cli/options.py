"""Click options shared by several commands (kept apart from ``cli.py`` so that command modules
such as ``compare`` and ``loopbench.cli`` can import them without an import cycle)."""

from __future__ import annotations

import click


SEED = click.IntRange(0, 2**63 - 1)  # noise seeds (torch generators take 64-bit seeds)


def device_options(command):
    """``--device auto|cuda|cpu`` and ``--dtype auto|bf16|fp32`` (parameters ``device``, ``dtype``),
    the same for every command that runs the model (:func:`~worldtrace_cli.rollout.resolve_device`,
    :func:`~worldtrace_cli.rollout.resolve_dtype`)."""
    command = click.option("--dtype", type=click.Choice(["auto", "bf16", "fp32"]), default="auto", show_default=True,
                           help="auto = bf16 on cuda, fp32 on cpu.")(command)
    return click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
                        help="auto = cuda when available, else cpu (loopbench under torchrun: the LOCAL_RANK GPU).")(command)


def speed_options(command):
    """The speed settings shared by generate, compare, loopbench run and bench speed (click options
    ``--rope-precision``, ``--compile``, ``--overlap-decode`` -> parameters ``rope_precision``,
    ``compile_mode``, ``overlap_decode``); :func:`speed_config` turns them into RunConfig fields."""
    options = [
        click.option("--rope-precision", type=click.Choice(["float32", "float64"]), default="float32",
                     show_default=True,
                     help="dtype of the RoPE tables and rotation; float64 is MG2's own arithmetic (both replay "
                          "the official fixtures within 4e-6)."),
        click.option("--compile", "compile_mode", type=click.Choice(["none", "default", "reduce-overhead",
                                                                     "max-autotune"]),
                     default="none", show_default=True,
                     help="torch.compile the DiT blocks (the first chunk of a process pays tens of seconds of "
                          "compilation); reduce-overhead and max-autotune add CUDA graphs on a GPU."),
        click.option("--overlap-decode", is_flag=True,
                     help="Decode each chunk while the next one is generated (side CUDA stream; worker thread "
                          "on CPU, where it does not pay)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def speed_config(rope_precision: str, compile_mode: str, overlap_decode: bool) -> dict:
    """:func:`speed_options` values as RunConfig keyword arguments."""
    return {"rope_precision": rope_precision, "compile": compile_mode, "overlap_decode": overlap_decode}
