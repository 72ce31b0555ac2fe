"""`tapfix captures tail`: one line per exchange as the writer commits it, for a terminal or a pipe.

It only reads (the store's `Follower`, store/backend.py): a read-only connection that never migrates
or locks, polled a few times a second, so it can watch a store that `tapfix run` (one process or
several) is writing. A store that isn't there yet is waited for, as `tail -F` waits for a file: a
tail is often started before the proxy. Ctrl-C ends it with status 0; so does a reader that goes
away (`| head`): between polls it waits on its stdout, whose write end reports an error as soon as a
pipe's reader closes it, so `tail | head -1` returns when `head` does, not at the next capture.
"""

from __future__ import annotations

import os
import select
import sys
import time
from typing import IO, TYPE_CHECKING

import click
from tapfix.proxy.cli.listing import filter_options, json_row, marked
from tapfix.proxy.cli.options import db_option, json_option
from tapfix.proxy.cli.user_errors import UserError, reported
from tapfix.proxy.quantities import DURATION_EXAMPLES, is_duration, parse_duration
from tapfix.proxy.store.errors import CaptureNotFound, StoreError
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.reader import CaptureFilter

if TYPE_CHECKING:
    from tapfix.proxy.store.backend import StoreBackend
    from tapfix.proxy.store.parts import Follower

POLL_S = 0.25


class ReaderGone(Exception):
    """stdout is a pipe whose reader closed it: nothing more to say."""


@click.command("tail")
@db_option()
@click.option(
    "--since",
    metavar="AGE|ID",
    callback=lambda _ctx, _param, value: _since(value),
    help=f"start with the exchanges completed in the last AGE ({DURATION_EXAMPLES}) or after capture ID (a prefix"
    " will do); default: from now",
)
@json_option("one JSON object a line, as `captures list --json`")
@filter_options
def tail(db: StoreLocator, since: str | float | None, as_json: bool, filters: CaptureFilter) -> None:
    """Print each exchange as it completes, in the order the writer stored them.

    The columns and filters are `captures list`'s; a regeneration attempt follows its client request,
    marked `↳N`. Works while `tapfix run` writes the store (it only reads); waits for a store that
    doesn't exist yet. Ctrl-C stops it.

    \b
    Example:
      tapfix captures tail --flag regenerated
      tapfix captures tail --since 10m --json | jq -r .model
    """
    out = sys.stdout
    try:
        _follow(db, since, as_json, filters, out)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a tail ends
    except (BrokenPipeError, ReaderGone):  # the reader left: nothing more to say, and nothing to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())


def _since(value: str | None) -> str | float | None:
    """An age (seconds) when `--since` is written as one, else the capture id as given. A negative age is a
    usage error of its own, never a capture id that isn't there."""
    if value is None or not is_duration(value):
        return value
    try:
        return parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--since'") from None


def _follow(db: StoreLocator, since: str | float | None, as_json: bool, filters: CaptureFilter, out: IO[str]) -> None:
    from tapfix.proxy.cli.prefix_view import tail_mark
    from tapfix.proxy.cli.render import HEADER, capture_cells, tail_line

    store = db.backend()
    follow = _wait_for(store, since, filters, out)
    if not as_json:  # once the store is there and the start found: an error is then the only output
        _write(out, tail_line(HEADER) + "\n")
    waiting = False
    while True:
        with reported(StoreError):
            rows = follow.poll()
        if rows is None and not waiting:  # the store went away (a file deleted or replaced)
            _waiting(store)
        waiting = rows is None
        if rows:
            lines = (
                json_row(row).decode() if as_json else tail_line(capture_cells(marked(row))) + tail_mark(row) + "\n"
                for row in rows
            )
            _write(out, "".join(lines))
        _pause(out)


def _wait_for(store: StoreBackend, since: str | float | None, filters: CaptureFilter, out: IO[str]) -> Follower:
    """The store's follower from `since`, once a writer has made the store; says once on stderr that it
    is waiting."""
    told = False
    while True:
        follow = _start(store, since, filters)
        if follow is not None:
            return follow
        if not told:
            _waiting(store)
            told = True
        _pause(out)


def _waiting(store: StoreBackend) -> None:
    click.echo(f"tapfix: waiting for a capture store at {store.location} (`tapfix run` creates it)", err=True)


def _start(store: StoreBackend, since: str | float | None, filters: CaptureFilter) -> Follower | None:
    """The follower from the cursor `--since` names (an age in seconds, or a capture id)."""
    try:
        return store.tail(since, filters)
    except CaptureNotFound as e:
        if isinstance(since, str) and since.strip().replace(".", "", 1).isdigit():  # seconds without their unit
            raise UserError(f"{e}; an age for --since takes its unit: {since.strip()}s, or 10m, 12h, 7d") from e
        raise UserError(str(e)) from e
    except StoreError as e:
        raise UserError(str(e)) from e


def _pause(out: IO[str], seconds: float = POLL_S) -> None:
    """Wait `seconds` between polls, watching `out`: `ReaderGone` as soon as it is a pipe whose reader has
    closed it (poll reports POLLERR on the write end; a file or a terminal never does while it is usable)."""
    try:
        fd = out.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's buffer) or no poll(): just wait
        time.sleep(seconds)
        return
    poller.register(fd, 0)  # no events asked: only POLLERR, POLLHUP and POLLNVAL are reported
    if poller.poll(seconds * 1000):
        raise ReaderGone


def _write(out: IO[str], text: str) -> None:
    out.write(text)
    out.flush()  # a pipe is block-buffered: each exchange is news as soon as it is stored
