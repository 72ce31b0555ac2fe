"""SQLite's reader (`captures list`, `show`, `export`, the browser's capture page): `CaptureReader` over one
read-only connection. A store from before a migration is read as it is (a reader never migrates):
before m004 it has no attempts, before m005 no trace ids, before the `choices` table no choices.

A database error comes out as a `StoreError` carrying SQLite's message, as PostgreSQL's reader does.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tapfix.proxy.store.choices import CHOICE_COLUMNS, choice_row
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.reader import LIST_COLUMNS, ORPHAN_OR_CLIENT, CaptureFilter, CaptureReader, decode_row
from tapfix.proxy.store.sqlite.bodies import read_body

if TYPE_CHECKING:
    from tapfix.proxy.store.volume import Dialect

# A store from before migration m004 (a reader never migrates) has no attempts: every row is client-facing.
_NO_ATTEMPTS = "null as attempt_of, 1 as attempt"


def has_column(conn: sqlite3.Connection, column: str) -> bool:
    """Whether the store's exchanges have `column`: readers read older stores as they are."""
    return any(row[1] == column for row in conn.execute("pragma table_info(exchanges)"))


def has_attempts(conn: sqlite3.Connection) -> bool:
    """Whether the store has the attempt columns (migration m004)."""
    return has_column(conn, "attempt_of")


def attempt_columns(conn: sqlite3.Connection, table: str = "exchanges") -> str:
    """`attempt_of, attempt` for a select list, on any store."""
    return f"{table}.attempt_of, {table}.attempt" if has_attempts(conn) else _NO_ATTEMPTS


def list_columns(conn: sqlite3.Connection) -> str:
    """What `captures list` and `captures tail` select, on any store: trace_id is null before m005, prefix_break
    before m008."""
    trace = "exchanges.trace_id" if has_column(conn, "trace_id") else "null as trace_id"
    prefix = "exchanges.prefix_break" if has_column(conn, "prefix_break") else "null as prefix_break"
    return f"{LIST_COLUMNS}, {attempt_columns(conn)}, {trace}, {prefix}"


def filter_clauses(
    conn: sqlite3.Connection, filters: CaptureFilter, table: str = "exchanges"
) -> tuple[list[str], list[Any]]:
    """SQL conditions on `table` (a name or an alias of exchanges), and their arguments. On a store
    from before migration m005 a trace id (before m009 a route) matches nothing."""

    def condition(key: str) -> str | None:
        if key in ("flag", "tag"):
            return f"exists (select 1 from json_each({table}.{key}s) where value = ?)"
        if key == "session":
            return f"{table}.session_id = ?"
        if key == "route":
            route = f"json_extract({table}.route_decision, '$.route') = ?"
            return route if has_column(conn, "route_decision") else None
        return f"{table}.trace_id = ?" if has_column(conn, "trace_id") else None

    return filters.clauses(condition)


def known_flags(conn: sqlite3.Connection) -> list[str]:
    """Every flag some capture in the store carries (what `captures list --flag` can match)."""
    rows = conn.execute(
        "select distinct j.value from exchanges, json_each(exchanges.flags) j where exchanges.flags != '[]'"
    )
    return sorted(str(r[0]) for r in rows)


def read_choices(conn: sqlite3.Connection, exchange_id: str) -> list[dict[str, Any]]:
    """Every choice of an `n > 1` answer, by index; [] for a one-choice answer, or a store from before
    the table existed."""
    try:
        rows = conn.execute(
            f'select {CHOICE_COLUMNS} from choices where exchange_id = ? order by "index"',
            (exchange_id,),
        ).fetchall()
    except sqlite3.OperationalError:  # no such table: an older store, read as it is
        return []
    return [choice_row(r) for r in rows]


class SqliteReader(CaptureReader):
    """`CaptureReader` on one read-only SQLite connection (rows as `sqlite3.Row`)."""

    backend = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def _rows(self, sql: str, args: list[Any] | tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StoreError(str(e)) from e

    def _dict_rows(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        return [dict(row) for row in self._rows(sql, list(args))]

    def _values(self, sql: str, args: Sequence[Any]) -> Iterator[Sequence[Any]]:
        try:
            yield from self.conn.execute(sql, list(args))
        except sqlite3.Error as e:
            raise StoreError(str(e)) from e

    def _volume_dialect(self) -> Dialect:
        from tapfix.proxy.store.sqlite.volume import volume_dialect

        return volume_dialect(self.conn)

    def _clients(self, filters: CaptureFilter, limit: int) -> list[dict[str, Any]]:
        where, args = filter_clauses(self.conn, filters)
        if has_attempts(self.conn):
            where.insert(0, f"({ORPHAN_OR_CLIENT})")
        sql = f"select {list_columns(self.conn)} from exchanges"
        if where:
            sql += " where " + " and ".join(where)
        sql += " order by id desc"
        if limit > 0:
            sql += f" limit {int(limit)}"
        return [decode_row(dict(row)) for row in self._rows(sql, args)]

    def _attempts(self, parents: list[str]) -> list[dict[str, Any]]:
        if not has_attempts(self.conn):
            return []
        sql = (
            f"select {list_columns(self.conn)} from exchanges"
            f" where attempt_of in ({','.join('?' * len(parents))}) order by attempt_of, attempt, id"
        )
        return [decode_row(dict(row)) for row in self._rows(sql, parents)]

    def _ids_from(self, prefix: str) -> list[str]:
        sql = "select id from exchanges where id >= ? and id < ? order by id limit 3"
        return [str(r[0]) for r in self._rows(sql, (prefix, prefix + "\uffff"))]

    def _capture(self, capture_id: str) -> dict[str, Any]:
        return decode_row(dict(self._rows("select * from exchanges where id = ?", (capture_id,))[0]))

    def _changes(self, capture_id: str) -> list[dict[str, Any]]:
        sql = "select stage, kind, path, before, after, reason from changes where exchange_id = ? order by seq"
        return [dict(c) for c in self._rows(sql, (capture_id,))]

    def _body(self, capture: dict[str, Any], body_id: int) -> bytes | None:
        return read_body(self.conn, body_id)

    def answered_turns(self, chains: list[str]) -> list[tuple[Any, ...]]:
        from tapfix.proxy.store.replay_turns import ANSWERED_SQL

        return [tuple(r) for r in self._rows(ANSWERED_SQL.format(marks=", ".join("?" for _ in chains)), chains)]

    def known_flags(self) -> list[str]:
        try:
            return known_flags(self.conn)
        except sqlite3.Error as e:
            raise StoreError(str(e)) from e

    def read_choices(self, exchange_id: str) -> list[dict[str, Any]]:
        return read_choices(self.conn, exchange_id)

    def close(self) -> None:
        self.conn.close()


# The reader's methods on a connection, for scripts and tests that hold one.


def list_captures(conn: sqlite3.Connection, **filters: Any) -> list[dict[str, Any]]:
    """`CaptureReader.list_captures` (`limit` and the filters by name)."""
    return SqliteReader(conn).list_captures(**filters)


def resolve_id(conn: sqlite3.Connection, prefix: str) -> str:
    return SqliteReader(conn).resolve_id(prefix)


def load_capture(conn: sqlite3.Connection, capture_id: str) -> dict[str, Any]:
    return SqliteReader(conn).load_capture(capture_id)


def capture_body(conn: sqlite3.Connection, capture: dict[str, Any], which: str) -> bytes:
    """which: request | forwarded | response | client_response — exact bytes."""
    return SqliteReader(conn).capture_body(capture, which)
