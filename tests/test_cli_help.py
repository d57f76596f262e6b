"""One help text per option name (issue 68): every command that takes ``--seed`` (``--output``, ``--chunks``,
...) says the same of it, from cli/shared_options.py's HELP with the command's default and note filled in;
and the README stays a front page (detail lives in docs/)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]

# option names two commands may describe in their own words, each with why (keep this tiny)
ALLOWED: dict[str, str] = {}


def commands(group: click.Group, path: tuple[str, ...] = ()):
    """Every leaf command of ``group`` as (its path, the command)."""
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from commands(command, path + (name,))
        else:
            yield " ".join(path + (name,)), command


def option_texts(group: click.Group) -> dict[str, dict[str, str]]:
    """option name (its longest spelling) -> {command path: its help template, else its help as written}."""
    from worldtrace_cli.cli.shared_options import long_name

    texts: dict[str, dict[str, str]] = defaultdict(dict)
    for path, command in commands(group):
        for param in command.params:
            if isinstance(param, click.Option):
                texts[long_name(param.opts)][path] = getattr(param, "template", None) or param.help or ""
    return texts


def diverging(group: click.Group) -> dict[str, dict[str, str]]:
    """The option names that two commands of ``group`` describe with different texts."""
    return {name: by_command for name, by_command in option_texts(group).items()
            if len(set(by_command.values())) > 1 and name not in ALLOWED}


def test_every_option_name_has_one_help_text():
    from worldtrace_cli.cli import main

    bad = diverging(main)
    assert not bad, "\n".join(f"{name}: " + "; ".join(f"{path}: {text[:60]!r}" for path, text in sorted(texts.items()))
                              for name, texts in sorted(bad.items()))


def test_the_check_fails_for_a_command_that_words_a_shared_option_its_own_way():
    """A new ``@click.option("--seed", help="other words")`` beside the shared ones is caught."""
    from worldtrace_cli.cli import main
    from worldtrace_cli.cli.shared_options import option

    group = click.Group("g", commands=dict(main.commands))
    group.add_command(click.command("odd")(click.option("--seed", type=int, help="other words")(lambda seed: None)))
    assert "--seed" in diverging(group)
    same = click.Group("h", commands=dict(main.commands))
    same.add_command(click.command("fine")(option("--seed", type=int, note="the test's noise")(lambda seed: None)))
    assert "--seed" not in diverging(same)


def test_every_shared_text_is_used_and_every_filled_text_reads_whole():
    """Each HELP entry is some command's option, and no filled text keeps a placeholder."""
    from worldtrace_cli.cli import main
    from worldtrace_cli.cli.shared_options import HELP

    texts = option_texts(main)
    assert sorted(set(HELP) - set(texts)) == []
    for path, command in commands(main):
        for param in command.params:
            if getattr(param, "template", None):
                assert "{" not in param.help and "}" not in param.help and " ;" not in param.help, (path, param.help)


def test_the_readme_is_a_front_page():
    """README.md stays short (issue 68: <= 250 lines); detail goes to docs/."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)


def test_every_help_example_is_a_line_of_its_own():
    """A docstring's ``\\`` at a line's end joins two example lines into one (a string continuation,
    not the shell's): no example line of any command's help holds two commands or a run of spaces
    before an option (the continued line's indent)."""
    import re

    from worldtrace_cli.cli import main

    joined = {}
    for path, command in commands(main):
        ctx = click.Context(command, info_name=f"worldtrace {path}")
        for line in command.get_help(ctx).splitlines():
            if line.strip().startswith(("worldtrace ", "torchrun ")) and (
                    line.count("worldtrace ") > 1 or re.search(r"\S {4,}--?[a-z]", line)):
                joined[path] = line.strip()
    assert not joined, joined
