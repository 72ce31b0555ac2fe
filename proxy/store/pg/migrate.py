"""Applying the PostgreSQL migration set (store/pg/schema.py), and knowing whose database it is.

Every migration runs in one transaction with the record of it in `tapfix_migrations`, under an
advisory lock: several tapfix instances starting at once against one database migrate it once,
the others wait and then find nothing to do; a failure leaves nothing half-applied (PostgreSQL's
DDL is transactional). As on SQLite (store/sqlite/database.py), a migration this tapfix doesn't know
means a newer tapfix migrated the database: refused, naming it.

Tables live in the connection's current schema (`public` unless the URL says otherwise, e.g.
`?options=-csearch_path%3Dtapfix`), so a database shared with other applications can give tapfix
a schema of its own.

psycopg is imported by the caller, never here: this module needs only a connection.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.pg.schema import MIGRATIONS

if TYPE_CHECKING:
    import psycopg

MIGRATIONS_TABLE = "tapfix_migrations"  # spelled out in the queries below (psycopg wants literal SQL)
MIGRATE_LOCK = 0x7461706669780000
KNOWN = frozenset(name for name, _ in MIGRATIONS)


def applied(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """The migrations recorded in this database, in the order they were applied ([] for none)."""
    table = conn.execute("select to_regclass(%s)", (MIGRATIONS_TABLE,)).fetchone()
    if table is None or table[0] is None:
        return []
    return [str(r[0]) for r in conn.execute("select name from tapfix_migrations order by applied_order")]


def migrate(conn: psycopg.Connection[tuple[object, ...]], where: str = "the database") -> list[str]:
    """Apply what is pending, in one transaction; the names applied now (`where`: the masked locator,
    for errors)."""
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        conn.execute(
            "create table if not exists tapfix_migrations ("
            " name text primary key, applied_order integer not null, applied_at timestamptz not null default now())"
        )
        done = applied(conn)
        unknown = [name for name in done if name not in KNOWN]
        if unknown:
            raise StoreError(
                f"{where} was migrated by a newer tapfix: migration {', '.join(unknown)} is unknown to this"
                " tapfix; upgrade tapfix to use it, or pass another --db"
            )
        now = []
        for order, (name, sql) in enumerate(MIGRATIONS, start=1):
            if name in done:
                continue
            conn.execute(sql.encode())  # several statements: psycopg allows them when no parameters are passed
            conn.execute("insert into tapfix_migrations (name, applied_order) values (%s, %s)", (name, order))
            now.append(name)
    return now


def add_days(conn: psycopg.Connection[tuple[object, ...]], now: float, ahead: int = 1) -> list[datetime.date]:
    """Make the day partitions of today (UTC) and the next `ahead` days; the days made now."""
    today = datetime.datetime.fromtimestamp(now, datetime.UTC).date()
    made = []
    with conn.transaction():
        for offset in range(ahead + 1):
            day = today + datetime.timedelta(days=offset)
            row = conn.execute("select tapfix_add_day(%s)", (day,)).fetchone()
            if row is not None and row[0]:
                made.append(day)
    return made
