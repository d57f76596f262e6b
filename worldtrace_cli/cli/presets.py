"""``worldtrace presets``: the built-in model presets."""

from __future__ import annotations

import click


@click.command("presets")
@click.option("--backbones", is_flag=True,
              help="Print the registered backbones and what each takes (a Markdown table) instead.")
def list_presets(backbones):
    """List the built-in model presets: name, trajectory mode, pixel size, backbone, weights, description.

    The backbone column is the preset's registry row (docs/architecture.md, section 1b): what its runs
    take (a start image, a prompt, camera files) and whether it runs live follow from it. Weights:
    ``random`` (seeded, no download), ``bundled`` (shipped with worldtrace) or ``checkpoint`` (needs
    ``--checkpoint DIR``, or ``--random-weights`` for a full-size run with random weights).
    """
    from ..config import load_preset, preset_names

    if backbones:
        from ..config.backbones import backbone_table, load_plugins

        broken = load_plugins(strict=False)  # the installed packages' backbones too; a broken one named, not fatal
        click.echo(backbone_table())
        for line in broken:
            click.echo(f"worldtrace: {line} (left out)", err=True)
        return
    width = max(18, *(len(n) + 1 for n in preset_names()))
    for name in preset_names():
        p = load_preset(name)
        size = f"{p.height}x{p.width}"
        click.echo(f"{name:{width}s} {p.mode:10s} {size:8s} {p.backbone.title:24s} {p.weights:10s} {p.description}")
