"""`tapfix captures purge`: delete old captures by age or to a size cap, optionally VACUUM.

Registered under the `captures` group (`captures.add_command(purge)`). Safe while the proxy runs:
SQLite's write lock serializes the purge with the capture writer, and the purge works in small
transactions. `--max-age` and `--max-size` are spelled as in `tapfix run` and the config's `[retention]`,
and refused alike when they would delete captures as they arrive (an age under a minute, a size under
the empty store's floor). `--dry-run` counts the same purge on a snapshot copy and deletes nothing.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import click
import orjson
from tapfix.proxy.cli.options import (
    Duration,
    db_option,
    deprecated_alias,
    json_option,
    max_age_option,
    max_size_option,
)
from tapfix.proxy.cli.user_errors import UserError
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.retention import PurgeReport, check_max_age, check_max_size, store_floor
from tapfix.proxy.store.retention import dry_run as dry_run_store
from tapfix.proxy.store.retention import purge as purge_store
from tapfix.proxy.store.retention import vacuum as vacuum_store
from tapfix.proxy.store.writer import StoreError


def purge_sidecar(db: Path) -> int:
    """The browser's full-text index (`<db>.fts.sqlite`) holds prompt text too: drop purged rows."""
    sidecar = db.with_name(db.name + ".fts.sqlite")
    if not sidecar.exists():
        return 0
    conn = sqlite3.connect(str(sidecar), isolation_level=None)
    try:
        conn.execute("attach database ? as cap", (str(db),))
        before = conn.total_changes
        for table in ("doc", "facts"):
            if conn.execute("select 1 from sqlite_master where name = ?", (table,)).fetchone():
                conn.execute(f"delete from {table} where rowid not in (select rowid from cap.exchanges)")
        return conn.total_changes - before
    except sqlite3.Error:
        return 0  # an index the browser can rebuild; never fail the purge over it
    finally:
        conn.close()


@click.command("purge")
@db_option(postgres=True)
@max_age_option("delete exchanges older than this: 7d, 12h, 30m, 90s")
@max_size_option("then delete the oldest until the store uses at most this: 500M, 2G")
@click.option(
    "--vacuum",
    is_flag=True,
    help="then give the freed space back: SQLite rewrites the file; PostgreSQL runs VACUUM (see above)",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="say what would be deleted, delete nothing (counted on a temporary copy of the store)",
)
@json_option("print the report as one JSON object")
@deprecated_alias("--older-than", "--max-age", "max_age", type=Duration())
def purge(
    db: StoreLocator, max_age: float | None, max_size: int | None, vacuum: bool, dry_run: bool, as_json: bool
) -> None:
    """Delete captured exchanges, their changes and the bodies nothing needs any more.

    Bodies that other kept bodies are stored as deltas of are kept until nothing depends on them.
    Safe while `tapfix run` writes to the same database.

    On PostgreSQL (--db postgresql://...) whole UTC days older than --max-age are dropped as
    partitions, which frees their disk at once; only the day that straddles the cutoff has rows
    deleted. --max-size drops the oldest whole days (never today's) until the tables fit. Deleted
    rows' space is reused by the same table after --vacuum (VACUUM, not FULL: it marks the space
    free and returns only trailing empty pages to the disk; VACUUM FULL would rewrite the tables
    but locks them while it runs). --dry-run is SQLite's only.

    \b
    Example:
      tapfix captures purge --max-age 7d --vacuum
      tapfix captures purge --max-size 2G --json
      tapfix captures purge --max-age 30d --dry-run
    """
    if max_age is None and max_size is None and not vacuum:
        raise click.UsageError("give --max-age AGE and/or --max-size SIZE (and/or --vacuum)")
    try:
        check_max_age(max_age)
    except ValueError as e:
        raise click.BadParameter(str(e).removeprefix("--max-age "), param_hint="'--max-age'") from e
    if db.postgres is not None:
        if dry_run:
            raise UserError(f"{db}: --dry-run is not built for PostgreSQL stores (only for SQLite files)")
        _purge_postgres(db, max_age, max_size, vacuum, as_json)
        return
    path = db.path
    if not db.exists():
        raise UserError(f"no capture database at {db} (pass --db)")
    try:  # a dry run only reads: it neither migrates nor locks the store
        conn = db.open_for_reading() if dry_run else db.open_for_writing()
    except StoreError as e:
        raise UserError(str(e)) from e
    try:
        check_max_size(max_size, store_floor(conn))
    except ValueError as e:
        conn.close()
        raise click.BadParameter(str(e).removeprefix("--max-size "), param_hint="'--max-size'") from e
    try:
        if dry_run:
            report = dry_run_store(conn, max_age, max_size)
        elif max_age is not None or max_size is not None:
            report = purge_store(conn, max_age, max_size)
        else:
            report = PurgeReport()
        if vacuum and not dry_run:
            vacuum_store(conn)
            report.bytes_after = (
                conn.execute("pragma page_count").fetchone()[0] * conn.execute("pragma page_size").fetchone()[0]
            )
    except sqlite3.Error as e:
        raise UserError(f"{path}: purge failed, nothing lost ({e})") from e
    finally:
        conn.close()
    sidecar_rows = 0 if dry_run else purge_sidecar(path)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps({**report.as_dict(), "index_rows": sidecar_rows}) + b"\n")
    else:
        click.echo(f"{path}: {report}" + (f"; {sidecar_rows} search index row(s)" if sidecar_rows else ""))


def _purge_postgres(db: StoreLocator, max_age: float | None, max_size: int | None, vacuum: bool, as_json: bool) -> None:
    """store/pg/retention.py on the store's own connection (autocommit: each step a transaction)."""
    import psycopg
    from tapfix.proxy.store.pg import retention
    from tapfix.proxy.store.pg.migrate import applied

    assert db.postgres is not None
    try:
        conn = psycopg.connect(db.postgres.url, autocommit=True, application_name="tapfix purge", connect_timeout=5)
    except psycopg.Error as e:
        raise UserError(f"{db}: can't connect ({db.postgres.scrub(' '.join(str(e).split()))})") from None
    try:
        if not applied(conn):
            raise UserError(f"{db}: no tapfix store there yet (a tapfix run with this --db makes it)")
        report = retention.purge(conn, max_age, max_size) if max_age is not None or max_size is not None else None
        report = report or PurgeReport(bytes_before=retention.used_bytes(conn))
        if vacuum:
            retention.vacuum(conn)
            report.bytes_after = retention.used_bytes(conn)
    except psycopg.Error as e:
        raise UserError(f"{db}: purge failed, nothing lost ({db.postgres.scrub(' '.join(str(e).split()))})") from None
    finally:
        conn.close()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report.as_dict()) + b"\n")
    else:
        click.echo(f"{db}: {report}")
