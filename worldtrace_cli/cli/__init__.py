"""``worldtrace`` command line (click only): one module per command; each parses its flags, calls
one job and maps errors to exit codes (:func:`~worldtrace_cli.cli.common.run_job`).

Heavy imports (torch, diffusers) happen inside commands so ``--help`` is instant. Logs go to
stderr; results go to files (and the run folder's path to stdout). Exit codes: :mod:`worldtrace_cli.errors`.
"""

from __future__ import annotations

import logging

import click

from .. import __version__
from . import bench, compare, generate, loopbench, metrics, parity, play, presets, train, world
from .common import EchoHandler


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="worldtrace")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr.")
def main(verbose: bool) -> None:
    """Long-horizon video generation with Matrix-Game-2.0 and addressable KV-cache memory.

    Generate a video from a conditioning image and a trajectory of keyboard/mouse actions,
    chunk by chunk, through a chosen KV-cache writer. Run `worldtrace COMMAND --help` for details.
    """
    logger = logging.getLogger("worldtrace")
    if not any(isinstance(h, EchoHandler) for h in logger.handlers):
        logger.addHandler(EchoHandler())
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False


for _command in (generate.generate, metrics.metrics_cmd, bench.bench, compare.compare, loopbench.loopbench,
                 train.train, world.world, presets.list_presets, parity.parity, play.play):
    main.add_command(_command)


def _verbose(ctx, param, value) -> None:
    """``COMMAND -v``: debug logging, as ``worldtrace -v COMMAND`` (runs after the group set INFO)."""
    if value:
        logging.getLogger("worldtrace").setLevel(logging.DEBUG)


def _leaf_commands(group: click.Group):
    for command in group.commands.values():
        if isinstance(command, click.Group):
            yield from _leaf_commands(command)
        else:
            yield command


for _command in _leaf_commands(main):  # -v after the command too, where users put it
    if not any("-v" in p.opts for p in _command.params):
        _command.params.append(click.Option(["-v", "--verbose"], is_flag=True, expose_value=False, callback=_verbose,
                                            help="Debug logging on stderr (as worldtrace -v COMMAND)."))
