"""PostgreSQL's side of `captures copy` (store/copy.py): a database read as a source, or written as a target.

Rows come out as SQLite's (store/pg/reader.py `iso` for times, PostgreSQL's own columns left out);
bodies are rebuilt in the server by `tapfix_body_rebuild`, a batch in one statement. A target is the
writer's own `PostgresBackend` (migrated on open); before each batch the day partitions its captures
go to are made, so a copied store is laid out as one its writers filled (a day without a partition
would land in the default partition, where retention must delete row by row).
"""

from __future__ import annotations

import datetime
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from tapfix.proxy.store.copy import BODY_COLUMNS, CHANGE_COLUMNS, CHOICE_COLUMNS, SESSION_COLUMNS, Capture, Key
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.pg.locator import PostgresLocator
from tapfix.proxy.store.pg.migrate import add_days, applied
from tapfix.proxy.store.pg.reader import PG_ONLY, connect, iso
from tapfix.proxy.store.pg.schema import REACHES
from tapfix.proxy.store.pg.writer import PostgresBackend

PGConn = psycopg.Connection[tuple[Any, ...]]


def pg_version(conn: PGConn, where: str) -> str | None:
    """The SQLite migration whose schema the database's last applied migration reaches (None: none)."""
    done = applied(conn)
    if not done:
        return None
    if done[-1] not in REACHES:
        raise StoreError(f"{where} was migrated by a newer tapfix (migration {done[-1]} is unknown to this one)")
    return REACHES[done[-1]]


def database_version(locator: PostgresLocator) -> str | None:
    with _connect(locator) as conn:
        return pg_version(conn, str(locator))


def _connect(locator: PostgresLocator) -> PGConn:
    conn: PGConn = connect(locator, "copy")
    return conn


def _day(started_at: str) -> datetime.date:
    return datetime.date.fromisoformat(started_at[:10])  # UTC: the writer's ISO text


class PostgresSource:
    """A PostgreSQL store read for a copy; never migrated, never written."""

    def __init__(self, locator: PostgresLocator) -> None:
        self.locator = locator
        self.conn = _connect(locator)
        if not applied(self.conn):
            self.conn.close()
            raise StoreError(f"{locator}: no tapfix store there yet (a tapfix run with this --db makes it)")

    def version(self) -> str | None:
        return pg_version(self.conn, str(self.locator))

    def count(self) -> int:
        row = self.conn.execute("select count(*) from exchanges").fetchone()
        return int(row[0]) if row else 0

    def keys(self, after: str | None, limit: int) -> list[Key]:
        rows = self.conn.execute(
            "select id, started_at from exchanges where id > %s order by id limit %s", (after or "", limit)
        )
        return [(str(r[0]), str(iso(r[1]))) for r in rows]

    def captures(self, keys: list[Key]) -> list[Capture]:
        if not keys:
            return []
        ids = [key[0] for key in keys]
        starts = sorted({key[1] for key in keys})
        days = sorted({_day(key[1]) for key in keys})
        found: dict[str, Capture] = {}
        with self.conn.cursor() as cur:
            cur.execute(
                "select * from exchanges where id = any(%s) and started_at = any(%s::timestamptz[])", (ids, starts)
            )
            names = [d.name for d in cur.description or ()]
            for values in cur.fetchall():
                row = dict(zip(names, values, strict=True))
                for key in PG_ONLY:
                    row.pop(key, None)
                row["started_at"] = iso(row["started_at"])
                if isinstance(row.get("chunk_timing"), memoryview):
                    row["chunk_timing"] = bytes(row["chunk_timing"])
                found[row["id"]] = Capture(row)
        self._bodies(list(found.values()))
        where = "where exchange_id = any(%s) and day = any(%s)"
        for exchange_id, *change in self.conn.execute(
            f"select exchange_id, {', '.join(CHANGE_COLUMNS)} from changes {where} order by exchange_id, seq",
            (ids, days),
        ):
            found[exchange_id].changes.append(tuple(change))
        for exchange_id, *choice in self.conn.execute(
            f'select exchange_id, {", ".join(CHOICE_COLUMNS)} from choices {where} order by exchange_id, "index"',
            (ids, days),
        ):
            found[exchange_id].choices.append(tuple(choice))
        return [found[i] for i in ids if i in found]

    def _bodies(self, captures: list[Capture]) -> None:
        """Every body of the batch rebuilt in the server, one statement."""
        wanted = [(c, column) for c in captures for column in BODY_COLUMNS]
        ids = [c.row[column] for c, column in wanted]
        days = [_day(c.row["started_at"]) for c, _ in wanted]
        rows = self.conn.execute(
            "select n, case when b is null then null else tapfix_body_rebuild(b, d) end"
            " from unnest(%s::bigint[], %s::date[]) with ordinality as u(b, d, n)",
            (ids, days),
        ).fetchall()
        for n, data in rows:
            capture, column = wanted[int(n) - 1]
            capture.bodies[column] = None if data is None else bytes(data)

    def sessions(self, ids: list[str] | None = None) -> list[tuple[Any, ...]]:
        select = f"select {', '.join(SESSION_COLUMNS)} from sessions"
        rows = (
            self.conn.execute(select + " order by id")
            if ids is None
            else self.conn.execute(select + " where id = any(%s)", (ids,))
        )
        return [(r[0], iso(r[1]), iso(r[2]), *r[3:]) for r in rows]

    def close(self) -> None:
        self.conn.close()


class PostgresTarget:
    """A PostgreSQL store written by its writer's backend (migrated on open)."""

    def __init__(self, locator: PostgresLocator) -> None:
        self.backend = PostgresBackend(locator)
        self._days: set[datetime.date] = set()

    def existing_ids(self) -> set[str]:
        return {str(r[0]) for r in self.backend.execute("select id from exchanges")}

    def prepare(self, captures: list[Capture]) -> None:
        for day in sorted({_day(c.row["started_at"]) for c in captures} - self._days):
            midday = datetime.datetime.combine(day, datetime.time(12), datetime.UTC).timestamp()
            add_days(self.backend.conn, midday, 0)
            self._days.add(day)

    def pipelined(self) -> AbstractContextManager[object]:
        return self.backend.conn.pipeline()

    def close(self) -> None:
        self.backend.close()
