"""``python -m worldtrace_cli`` = the ``worldtrace`` command."""

from .cli import main

main()
