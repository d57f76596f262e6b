"""``worldtrace`` command line (click only): one module per command; each parses its flags, calls
one job and maps errors to exit codes (:func:`~worldtrace_cli.cli.common.run_job`).

Heavy imports (torch, diffusers) happen inside commands so ``--help`` is instant. Logs go to
stderr; results go to files (and the run folder's path to stdout). Exit codes: :mod:`worldtrace_cli.errors`.
"""

from __future__ import annotations

import logging

import click
from click.exceptions import NoArgsIsHelpError

from .. import __version__
from . import bench, compare, generate, loopbench, metrics, mind, parity, play, presets, train, world
from ..errors import InputError
from .common import EchoHandler


class OneLineUsageError(click.UsageError):
    """A usage error (bad or unknown option, missing argument) as one line on stderr, exit 2, like
    every other worldtrace error: ``worldtrace: error: --chunks: 0 is not in the range ... (worldtrace
    generate --help)`` instead of click's three lines of usage, hint and message."""

    def __init__(self, err: click.UsageError):
        param = getattr(err, "param", None)
        if isinstance(err, click.BadParameter) and not isinstance(err, click.MissingParameter) and param is not None:
            # name the option (its longest spelling) or the argument, then click's reason
            name = max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name
            message = f"{name}: {err.message}"
        else:  # "Missing option '--output'.", "No such option ...": click's sentence is the message
            message = err.format_message()
        super().__init__(" ".join(str(message).split()).rstrip("."), err.ctx)

    def show(self, file=None) -> None:
        where = f" (see {self.ctx.command_path} --help)" if self.ctx is not None else ""
        click.echo(f"worldtrace: error: {self.message}{where}", err=True)


class Main(click.Group):
    """The ``worldtrace`` group: click's usage errors of any command as one line
    (:class:`OneLineUsageError`)."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except NoArgsIsHelpError:
            raise
        except click.UsageError as err:
            raise OneLineUsageError(err) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (NoArgsIsHelpError, OneLineUsageError):
            raise
        except click.UsageError as err:
            raise OneLineUsageError(err) from None


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="worldtrace")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging on stderr.")
def main(verbose: bool) -> None:
    """Long-horizon video generation with addressable KV-cache memory.

    Generate a video chunk by chunk through a chosen KV-cache writer, from a trajectory of
    keyboard/mouse actions (Matrix-Game-2.0, LingBot-World, the embedded loopworld) or of prompt
    segments (Self-Forcing, LongLive); compare writers, run LoopBench, play a world live in the
    browser. `worldtrace presets` lists the models; `worldtrace COMMAND --help` for details.
    """
    logger = logging.getLogger("worldtrace")
    if not any(isinstance(h, EchoHandler) for h in logger.handlers):
        logger.addHandler(EchoHandler())
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    from ..jobs.inputs import reset_warnings

    reset_warnings()  # notes said once per command (several commands may run in one process: tests, scripts)


for _command in (generate.generate, metrics.metrics_cmd, bench.bench, compare.compare, loopbench.loopbench,
                 train.train, world.world, presets.list_presets, parity.parity, play.play, mind.mind):
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


#: Commands that split their work across torchrun's processes (generate with --fsdp / --split-heads,
#: its own check; loopbench run, a shard of the job list per process). Every other command refuses a
#: launch of more than one process: N copies would race for one output folder or print N times.
TORCHRUN_COMMANDS = frozenset({"generate", "loopbench run"})


def _refuse_torchrun(command: click.Command, name: str) -> None:
    """Wrap ``command``'s callback: launched by torchrun as WORLD_SIZE > 1 processes, it exits 2 with
    one line naming the commands that do run there (process 0 says it, the others stay quiet); torch is
    not imported. Outside torchrun (or WORLD_SIZE 1) the command runs as before."""
    callback = command.callback

    def guarded(*args, **kwargs):
        import os
        import sys

        world, rank = os.environ.get("WORLD_SIZE", "1"), os.environ.get("RANK", "0")
        if world.strip() not in ("", "0", "1"):
            if rank.strip() in ("", "0"):
                click.echo(f"worldtrace: error: worldtrace {name} does not split across processes: launched by "
                           f"torchrun as WORLD_SIZE={world} processes its copies would race for one output; run it "
                           f"without torchrun (under torchrun: generate --fsdp / --split-heads, loopbench run)",
                           err=True)
            else:  # process 0 says it: it exits first, before torchrun ends the others (engine/launch.py)
                from ..engine.launch import wait_for_process_0

                wait_for_process_0()
            sys.exit(InputError.exit_code)
        return callback(*args, **kwargs)

    command.callback = guarded


def _leaf_names(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaf_names(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


for _name, _command in _leaf_names(main):
    if _name not in TORCHRUN_COMMANDS:
        _refuse_torchrun(_command, _name)

for _command in _leaf_commands(main):  # -v after the command too, where users put it
    if not any("-v" in p.opts for p in _command.params):
        _command.params.append(click.Option(["-v", "--verbose"], is_flag=True, expose_value=False, callback=_verbose,
                                            help="Debug logging on stderr (as worldtrace -v COMMAND)."))
