"""`tapfix captures copy --from LOCATOR --to LOCATOR`: move a store between SQLite and PostgreSQL (store/copy.py).

Registered under the `captures` group. Progress goes to stderr, the summary to stdout (`--json`: one
object). Every refusal (a clash, a schema mismatch, the same store twice) happens before anything is
written; a copy that fails half way keeps what it committed, whole captures only, for `--resume`.
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

import click
import orjson
from tapfix.proxy.cli.options import json_option
from tapfix.proxy.cli.user_errors import UserError
from tapfix.proxy.store.copy import BATCH, CopySource, CopyTarget, check_versions, copy_store
from tapfix.proxy.store.database import StoreError
from tapfix.proxy.store.locator import StoreLocator


def _source(locator: StoreLocator) -> CopySource:
    if locator.postgres is not None:
        from tapfix.proxy.store.pg.copy import PostgresSource

        return PostgresSource(locator.postgres)
    from tapfix.proxy.store.copy_sqlite import SqliteSource

    return SqliteSource(locator.path)


def _version(locator: StoreLocator) -> str | None:
    """The target's version, read-only (None: nothing there yet)."""
    if locator.postgres is not None:
        from tapfix.proxy.store.pg.copy import database_version

        return database_version(locator.postgres)
    from tapfix.proxy.store.copy_sqlite import file_version

    return file_version(locator.path)


def _target(locator: StoreLocator) -> CopyTarget:
    if locator.postgres is not None:
        from tapfix.proxy.store.pg.copy import PostgresTarget

        return PostgresTarget(locator.postgres)
    from tapfix.proxy.store.copy_sqlite import SqliteTarget

    return SqliteTarget(locator.path)


def _database_errors() -> tuple[type[Exception], ...]:
    errors: tuple[type[Exception], ...] = (sqlite3.Error, OSError)
    try:
        import psycopg
    except ImportError:
        return errors
    return (*errors, psycopg.Error)


def _scrub(text: str, *locators: StoreLocator) -> str:
    for locator in locators:
        if locator.postgres is not None:
            text = locator.postgres.scrub(text)
    return " ".join(text.split())


@click.command("copy")
@click.option(
    "--from", "source", metavar="LOCATOR", required=True, help="the store to copy: a SQLite path or postgresql://..."
)
@click.option("--to", "target", metavar="LOCATOR", required=True, help="the store to copy into (made when new)")
@click.option("--resume", is_flag=True, help="continue an interrupted copy: skip the captures the target has")
@click.option("--batch", type=click.IntRange(min=1), default=BATCH, show_default=True, help="captures per transaction")
@json_option("print the summary as one JSON object")
def copy(source: str, target: str, resume: bool, batch: int, as_json: bool) -> None:
    """Copy every capture, its bodies (byte-exact), changes, choices and sessions into another store.

    Capture ids, times, changes and sessions are kept; body ids are the target's, and the target
    stores bodies in its own encoding. The target must be empty or share no capture id with the
    source (a clash is refused, naming the first), and both must be at this tapfix's schema. At the
    end every body is read back from the target and checked by sha256 against the source.

    \b
    Example:
      tapfix captures copy --from captures/tapfix.db --to postgresql://tapfix@db/tapfix
      tapfix captures copy --from postgresql://tapfix@db/tapfix --to team.db --resume
    """
    try:
        src = StoreLocator.resolve(source, postgres=True)
        dst = StoreLocator.resolve(target, postgres=True)
    except StoreError as e:
        raise UserError(str(e)) from e
    if str(src) == str(dst) and (src.postgres is not None or src.path.resolve() == dst.path.resolve()):
        raise UserError(f"--from and --to are the same store ({src})")
    names = (str(src), str(dst))
    try:
        reader = _source(src)
    except StoreError as e:
        raise UserError(str(e)) from e
    report: Any = None
    try:
        from tapfix.proxy.store.copy_sqlite import latest_version

        check_versions(reader.version(), _version(dst), latest_version(), names)
        writer = _target(dst)
        try:
            report = copy_store(reader, writer, lambda: _source(dst), names=names, resume=resume, batch=batch)
        finally:
            writer.close()
    except StoreError as e:
        raise UserError(_scrub(str(e), src, dst)) from None
    except _database_errors() as e:
        raise UserError(
            f"copy from {src} to {dst} stopped: {_scrub(str(e), src, dst)}; what was committed is whole,"
            " run the same command with --resume to continue"
        ) from None
    finally:
        reader.close()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(vars(report)) + b"\n")
    else:
        click.echo(str(report))
