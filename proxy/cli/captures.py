"""`tapfix captures list | tail | show | export | purge | copy | stats`: the store from the terminal (`tail`
in tail.py, `purge` in purge.py, `copy` in copy.py, `stats` in stats.py).

Read-only except `purge` and `copy`'s target; each opens the store through its `StoreLocator`, so an unusable `--db`
is one line. Imports stay light (click, orjson, the store) so listing starts fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import orjson
from tapfix.proxy.cli.copy import copy
from tapfix.proxy.cli.listing import filter_options, json_row, marked
from tapfix.proxy.cli.options import db_option, json_option
from tapfix.proxy.cli.purge import purge
from tapfix.proxy.cli.stats import stats
from tapfix.proxy.cli.tail import tail
from tapfix.proxy.cli.user_errors import UserError, reported
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.reader import CaptureFilter, CaptureReader


def _reader(db: StoreLocator) -> CaptureReader:
    """The store's reader: list, show and export read through it, whichever backend it is."""
    with reported(StoreError):
        return db.backend().reader()


@click.group()
def captures() -> None:
    """List, follow, show, export, purge, copy and count captured exchanges.

    \b
    Example:
      tapfix captures list --limit 5
      tapfix captures show 01J9Z3 --json
    """


@captures.command("list")
@db_option()
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True, help="0 = all")
@json_option("one JSON object a line")
@filter_options
def captures_list(db: StoreLocator, limit: int, as_json: bool, filters: CaptureFilter) -> None:
    """Captured exchanges, newest first.

    Regeneration attempts follow the client request they were made for, marked `↳N`
    (attempt N); --limit and the filters count client requests. In --json every row has `attempt_of`
    (the parent's id, null for a client request) and `attempt` (1 for a client request, 2...N+1).

    \b
    Example:
      tapfix captures list --flag runaway_length --limit 0 --json
    """
    reader = _reader(db)
    with reported(StoreError):
        rows = reader.list_captures(
            limit=limit,
            flag=filters.flag,
            tag=filters.tag,
            session=filters.session,
            trace=filters.trace,
            route=filters.route,
        )
    if as_json:
        out = sys.stdout.buffer
        for row in rows:
            out.write(json_row(row))
        out.flush()
        return
    from tapfix.proxy.cli.render import captures_table

    click.echo(captures_table([marked(row) for row in rows], _empty_list(reader, filters) if not rows else ""))


def _empty_list(reader: CaptureReader, filters: CaptureFilter) -> str:
    """What an empty list means: an empty store, or filters no capture matches (and what would)."""
    if not reader.list_captures(limit=1):  # unfiltered, a store with any row lists one
        return "no captures yet"
    message = f"no capture matches {filters.asked()}"
    if filters.flag:
        with reported(StoreError):
            flags = reader.known_flags()
        message += f"; flags in this store: {', '.join(flags)}" if flags else "; no capture in this store has a flag"
    return message


@captures.command("show")
@click.argument("capture_id")
@db_option()
@json_option("one JSON object: metadata, timings, flags, changes and bodies (schemas/capture.schema.json)")
def captures_show(capture_id: str, db: StoreLocator, as_json: bool) -> None:
    """A readable view of one exchange: request as sent and as forwarded, response, changes, timings.

    \b
    Example:
      tapfix captures show 01J9Z3
      tapfix captures show 01J9Z3 --json | jq '.bodies.forwarded.text | fromjson | .messages[-1]'
    """
    from tapfix.proxy.cli.show import capture_json, render_capture

    reader = _reader(db)
    with reported(StoreError):
        capture = reader.load_capture(capture_id)
        if as_json:
            sys.stdout.buffer.write(orjson.dumps(capture_json(reader, capture), option=orjson.OPT_INDENT_2) + b"\n")
            sys.stdout.buffer.flush()
            return
        click.echo(render_capture(reader, capture))


@captures.command("export")
@click.argument("capture_id")
@db_option()
@click.option("--original", "which", flag_value="request", help="the client's request body (the default)")
@click.option("--forwarded", "which", flag_value="forwarded", help="the body sent upstream")
@click.option("--response", "which", flag_value="response", help="the raw upstream response")
@click.option("--client-response", "which", flag_value="client_response", help="the bytes the client received")
@click.option(
    "--as", "as_format", type=click.Choice(["raw", "curl", "python", "bundle"]), default="raw", show_default=True
)
@click.option("-o", "output", type=click.Path(path_type=Path), help="write here instead of stdout")
def captures_export(capture_id: str, db: StoreLocator, which: str | None, as_format: str, output: Path | None) -> None:
    """Write one body's exact bytes (default: the client's request body).

    \b
    Example:
      tapfix captures export 01J9Z3 --response -o response.sse
      tapfix captures export 01J9Z3 --as curl
    """
    reader = _reader(db)
    with reported(StoreError, OSError):
        capture = reader.load_capture(capture_id)
        if as_format != "raw":
            from tapfix.proxy.replay.export import export_capture

            # A repro resends what the server got unless --original asks for the client's bytes.
            export_capture(reader, capture, as_format, output, which or "forwarded")
            return
        data = reader.capture_body(capture, which or "request")
        if output:
            _write_atomically(output, data)
            return
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"-o {path}: {e.strerror or e}") from e


captures.add_command(purge)
captures.add_command(tail)
captures.add_command(copy)
captures.add_command(stats)
