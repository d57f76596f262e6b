"""``worldtrace parity``: replay an MG2, LingBot-World or Self-Forcing golden fixture folder against the
official outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .shared_options import option


@click.command("parity")
@click.argument("folder", metavar="FIXTURE_DIR", type=click.Path(path_type=Path))
@option("--rope-precision", type=click.Choice(["float32", "float64"]), default="float64", show_default=True)
@option("--compile", "compile_mode", type=click.Choice(["none", "default", "reduce-overhead", "max-autotune"]),
        default="none", show_default=True, note=" (as generate does)")
@option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--lingbot", is_flag=True,
              help="FIXTURE_DIR holds LingBot-World fixtures (the official folder, or tests/data/lingbot); "
                   "detected from its files when not given.")
def parity(folder, rope_precision, compile_mode, device, lingbot):
    """Replay FIXTURE_DIR through the product's own rollout in float32 and print the largest deviation
    per entry, last `max_abs_diff=<value>`.

    The family is read from the folder's own files: an MG2 fixture folder (tests/data/fixtures/...;
    format in FIXTURES.md), LingBot-World's (tests/data/lingbot, or the official folder: its
    tiny_run_inputs.safetensors), or Self-Forcing / LongLive's (a t2v tiny_config.json: every
    subfolder with run_config.json is a variant, replayed from its own settings whatever it is called;
    one the replay cannot reproduce is named on stderr as not replayed). Self-Forcing runs with
    float32 RoPE and no compile; --rope-precision and --compile are for MG2 and LingBot.

    Exit 0 when every entry is within its bound (1e-4; a Self-Forcing cache entry 2e-4), 1 when one
    is not (one line per such entry on stderr: the entry, its deviation, the bound), 2 for an
    unreadable folder or bad arguments.
    """
    import torch

    from ..errors import WorldtraceError
    from ..jobs.parity import TOLERANCE, compare
    from ..jobs.parity_lingbot import compare_lingbot, is_lingbot_fixture
    from ..jobs.parity_selfforcing import bound, compare_selfforcing, is_selfforcing_fixture

    if device == "cuda" and not torch.cuda.is_available():
        click.echo("worldtrace: error: --device cuda: no CUDA device is available", err=True)
        sys.exit(2)
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "no such folder"
        click.echo(f"worldtrace: error: {folder}: {what} (FIXTURE_DIR is a golden fixture folder: tests/data/fixtures)",
                   err=True)
        sys.exit(2)
    found = [name for name, present in (("Self-Forcing / LongLive", is_selfforcing_fixture(folder)),
                                        ("LingBot-World", is_lingbot_fixture(folder)),
                                        ("MG2", (folder / "tiny_outputs.safetensors").is_file())) if present]
    selfforcing = not lingbot and is_selfforcing_fixture(folder)
    lingbot = lingbot or (not selfforcing and is_lingbot_fixture(folder))
    replayed = "Self-Forcing / LongLive" if selfforcing else "LingBot-World" if lingbot else "MG2"
    if len(found) > 1:  # a folder holding two formats: say which one this replays
        click.echo(f"worldtrace: {folder} holds {' and '.join(found)} fixture files; replaying {replayed}'s"
                   + (" (--lingbot replays LingBot-World's)" if not lingbot and "LingBot-World" in found else ""),
                   err=True)
    limit = bound if selfforcing else (lambda entry: TOLERANCE)
    skipped, doc = [], "docs/selfforcing.md" if selfforcing else "docs/lingbot.md"
    try:
        if selfforcing:
            diffs, skipped = compare_selfforcing(folder, device)
        elif lingbot:
            diffs, skipped = compare_lingbot(folder, rope_precision, device, compile_mode)
        else:
            diffs = compare(folder, rope_precision, compile_mode, device)
    except WorldtraceError as exc:
        click.echo(f"worldtrace: error: {exc}", err=True)
        sys.exit(2)
    except (IndexError, KeyError, RuntimeError, ValueError, TypeError) as exc:  # a tensor that does not fit its config
        said = " ".join(str(exc).split())[:200]
        click.echo(f"worldtrace: error: {folder}: the fixture's files do not fit each other ({replayed} replay: "
                   f"{type(exc).__name__}: {said})", err=True)
        sys.exit(2)
    from ..jobs.parity import NOT_CHECKED

    unchecked = NOT_CHECKED.get(str(folder))
    if unchecked:  # stored outputs the replay has no counterpart for: named, never counted as passed
        import re
        from collections import Counter

        # one kind per chunk / step / layer number, over every variant folder ("main/...": the name after it)
        kinds = Counter(re.sub(r"(?<=[_csL])\d+(?=_|$)", "*", name.rsplit("/", 1)[-1]) for name in unchecked)
        named = [f"{k} ({n})" if n > 1 else k for k, n in sorted(kinds.items())]
        shown = [k for i, k in enumerate(named) if len(", ".join(named[:i + 1])) <= 600]
        said = ", ".join(shown) + (f" and {len(named) - len(shown)} more kinds" if len(shown) < len(named) else "")
        checks = ("every call's x0, the output latents and the last chunk's KV cache" if selfforcing
                  else "every call's x0 and the output latents")
        click.echo(f"worldtrace: not checked: {said} (stored outputs this replay does not compare: it "
                   f"checks {checks})", err=True)
    if skipped:  # variants the replay cannot reproduce: named, never passed
        click.echo(f"worldtrace: not replayed: {'; '.join(skipped)} ({doc})", err=True)
    for name, value in diffs.items():
        click.echo(f"{name}: max_abs_diff={value:.3e}")
    worst = max(diffs.values())
    click.echo(f"max_abs_diff={worst:.6e}")
    over = [(name, value) for name, value in diffs.items() if not value <= limit(name)]  # NaN is over
    for name, value in over:
        click.echo(f"worldtrace: parity: {folder}: {name} deviates by {value:.3e}, over the bound {limit(name):.0e}",
                   err=True)
    sys.exit(1 if over else 0)
