"""``worldtrace parity``: replay an MG2, LingBot-World or Self-Forcing golden fixture folder against the
official outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("parity")
@click.argument("folder", metavar="FIXTURE_DIR", type=click.Path(path_type=Path))
@click.option("--rope-precision", type=click.Choice(["float32", "float64"]), default="float64", show_default=True,
              help="dtype of the RoPE tables and rotation (float64 is MG2's own arithmetic).")
@click.option("--compile", "compile_mode", type=click.Choice(["none", "default", "reduce-overhead", "max-autotune"]),
              default="none", show_default=True, help="torch.compile the DiT blocks, as generate does.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--lingbot", is_flag=True,
              help="FIXTURE_DIR holds LingBot-World fixtures (the official folder, or tests/data/lingbot); "
                   "detected from its files when not given.")
def parity(folder, rope_precision, compile_mode, device, lingbot):
    """Replay FIXTURE_DIR (tests/data/fixtures/...; format in FIXTURES.md; or LingBot-World fixtures:
    tests/data/lingbot, or the official folder with main/, nosink_la10/, global/; or the Self-Forcing
    / LongLive folder with sf_global/, detected from its files: the variants not replayed yet are
    named on stderr; it runs with float32 RoPE and no compile, --rope-precision and --compile are
    for MG2 and LingBot) through the product's own rollout in float32 and print the largest
    deviation per group, last `max_abs_diff=<value>`.

    Exit 0 when it is <= 1e-4, 1 above, 2 for an unreadable folder or bad arguments.
    """
    import torch

    from ..errors import WorldtraceError
    from ..jobs.parity import TOLERANCE, compare
    from ..jobs.parity_lingbot import compare_lingbot, is_lingbot_fixture
    from ..jobs.parity_selfforcing import compare_selfforcing, is_selfforcing_fixture

    if device == "cuda" and not torch.cuda.is_available():
        click.echo("worldtrace: error: --device cuda: no CUDA device is available", err=True)
        sys.exit(2)
    lingbot = lingbot or is_lingbot_fixture(folder)
    try:
        if not lingbot and is_selfforcing_fixture(folder):
            diffs, skipped = compare_selfforcing(folder, device)
            if skipped:
                click.echo(f"worldtrace: not replayed yet: {', '.join(skipped)} (docs/selfforcing.md)", err=True)
        elif lingbot:
            diffs = compare_lingbot(folder, rope_precision, device, compile_mode)
        else:
            diffs = compare(folder, rope_precision, compile_mode, device)
    except WorldtraceError as exc:
        click.echo(f"worldtrace: error: {exc}", err=True)
        sys.exit(2)
    for name, value in diffs.items():
        click.echo(f"{name}: max_abs_diff={value:.3e}")
    worst = max(diffs.values())
    click.echo(f"max_abs_diff={worst:.6e}")
    sys.exit(0 if worst <= TOLERANCE else 1)
