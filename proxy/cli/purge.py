"""`tapfix captures purge`: delete old captures by age or to a size cap, optionally VACUUM.

Registered by the main CLI under the `captures` group (`captures.add_command(purge)`). Safe while
the proxy runs: SQLite's write lock serializes the purge with the capture writer, and the purge
works in small transactions. Kept here so `cli.py` stays small.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import click
import orjson
from tapfix.proxy.store.retention import PurgeReport, parse_duration, parse_size
from tapfix.proxy.store.retention import purge as purge_store
from tapfix.proxy.store.retention import vacuum as vacuum_store
from tapfix.proxy.store.writer import StoreError, default_db_path, open_for_writing


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    try:
        return None if value is None else parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    try:
        return None if value is None else parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def purge_sidecar(db: Path) -> int:
    """The browser's full-text index (`<db>.fts.sqlite`) holds prompt text too: drop purged rows."""
    sidecar = db.with_name(db.name + ".fts.sqlite")
    if not sidecar.exists():
        return 0
    conn = sqlite3.connect(str(sidecar), isolation_level=None)
    try:
        conn.execute("attach database ? as cap", (str(db),))
        removed = 0
        for table in ("doc", "facts"):
            if conn.execute("select 1 from sqlite_master where name = ?", (table,)).fetchone():
                removed += conn.execute(
                    f"delete from {table} where rowid not in (select rowid from cap.exchanges)").rowcount
        return removed
    except sqlite3.Error:
        return 0  # an index the browser can rebuild; never fail the purge over it
    finally:
        conn.close()


@click.command("purge")
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="capture database (default: $TAPFIX_DB or captures/tapfix.db)")
@click.option("--older-than", "older_than", metavar="AGE", callback=_duration,
              help="delete exchanges older than this: 7d, 12h, 30m, 90s")
@click.option("--max-size", "max_size", metavar="SIZE", callback=_size,
              help="then delete the oldest until the store uses at most this: 500M, 2G")
@click.option("--vacuum", is_flag=True, help="then give the freed space back to the disk (rewrites the file)")
@click.option("--json", "as_json", is_flag=True, help="print the report as one JSON object")
def purge(db: Path | None, older_than: float | None, max_size: int | None, vacuum: bool, as_json: bool) -> None:
    """Delete captured exchanges, their changes and the bodies nothing needs any more.

    Bodies that other kept bodies are stored as deltas of are kept until nothing depends on them.
    Safe while `tapfix run` writes to the same database.
    """
    if older_than is None and max_size is None and not vacuum:
        raise click.UsageError("give --older-than AGE and/or --max-size SIZE (and/or --vacuum)")
    path = db or default_db_path()
    if not path.exists():
        raise click.ClickException(f"no capture database at {path} (pass --db)")
    try:
        conn = open_for_writing(path)
    except StoreError as e:
        raise click.ClickException(str(e)) from e
    try:
        report = purge_store(conn, older_than, max_size) if older_than is not None or max_size is not None \
            else PurgeReport()
        if vacuum:
            vacuum_store(conn)
            report.bytes_after = conn.execute("pragma page_count").fetchone()[0] * \
                conn.execute("pragma page_size").fetchone()[0]
    except sqlite3.Error as e:
        raise click.ClickException(f"{path}: purge failed, nothing lost ({e})") from e
    finally:
        conn.close()
    sidecar_rows = purge_sidecar(path)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps({**report.as_dict(), "index_rows": sidecar_rows}) + b"\n")
    else:
        click.echo(f"{path}: {report}" + (f"; {sidecar_rows} search index row(s)" if sidecar_rows else ""))
