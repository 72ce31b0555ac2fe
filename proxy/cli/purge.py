"""`tapfix captures purge`: delete old captures by age or to a size cap, optionally VACUUM.

Registered under the `captures` group (`captures.add_command(purge)`). Safe while the proxy runs: the
store purges in small transactions beside its writer (`StoreBackend.purge`). `--max-age` and
`--max-size` are spelled as in `tapfix run` and the config's `[retention]`, and refused alike when
they would delete captures as they arrive (an age under a minute, a size under the empty store's
floor). `--dry-run` counts the same purge on a snapshot copy and deletes nothing.
"""

from __future__ import annotations

import sys

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
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.retention import LimitRefused, check_max_age


@click.command("purge")
@db_option()
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
    store = db.backend()
    try:
        report = store.purge(max_age, max_size, vacuum=vacuum, dry_run=dry_run)
    except StoreError as e:
        raise UserError(str(e)) from e
    except LimitRefused as e:  # a size under the store's floor
        raise click.BadParameter(str(e).removeprefix("--max-size "), param_hint="'--max-size'") from e
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report.as_dict()) + b"\n")
    else:
        rows = f"; {report.index_rows} search index row(s)" if report.index_rows else ""
        click.echo(f"{store.location}: {report}{rows}")
