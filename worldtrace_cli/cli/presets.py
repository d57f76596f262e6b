"""``worldtrace presets``: the built-in model presets."""

from __future__ import annotations

import click


@click.command("presets")
def list_presets():
    """List the built-in model presets."""
    from ..config import load_preset, preset_names

    for name in preset_names():
        p = load_preset(name)
        click.echo(f"{name:18s} {p.mode:10s} {p.height}x{p.width}  {p.description}")
