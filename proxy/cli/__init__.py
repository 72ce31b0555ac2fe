"""The `tapfix` command line: one module per command, shared options.

`tapfix = "tapfix.proxy.cli:main"` and `python -m tapfix.proxy.cli` are the entry points other tools
call (DESIGN.md, "Command line"); the group itself lives in `main.py`.
"""

from tapfix.proxy.cli.main import main

__all__ = ["main"]
