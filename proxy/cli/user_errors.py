"""The one path for errors the user can fix: a message on one line, never a traceback.

- A wrong invocation (a missing or conflicting option, a value that can't be converted) is a
  `click.UsageError`: exit 2, with the usage line. click raises it for option types and ranges.
- A runtime problem with the user's input (a database that can't be opened, a config that doesn't
  validate, an id that isn't stored) is a `UserError`: `Error: …` on stderr, exit 1, or exit 2
  where a command's contract says so (`probe` and `replay`: bad input is 2, see DESIGN.md).

The group catches what a command lets through from the store (`StoreError`), so an unusable
`--db` is one line whichever command met it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click


class UserError(click.ClickException):
    exit_code = 1


class InputError(UserError):
    """Bad input where the command's exit codes give it 2, like a usage error (probe, replay)."""

    exit_code = 2


@contextmanager
def reported(*errors: type[Exception], as_error: type[UserError] = UserError) -> Iterator[None]:
    """Turn these exceptions into a `UserError` (or `InputError`) carrying their message."""
    try:
        yield
    except errors as e:
        raise as_error(str(e)) from e
