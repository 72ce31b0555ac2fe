"""The read side of a PostgreSQL store: what `captures list`, `show` and `export` need, with the rows
and bytes SQLite's reader (store/sqlite/reader.py) gives for the same exchanges.

The reader's logic is store/reader.py's `CaptureReader` (shared with SQLite, tested row for row:
tests/unit/test_store_reader_backends.py); here is its SQL in PostgreSQL's dialect, and the connection.

- Rows come back as SQLite's do: `started_at` as the writer's ISO text (UTC, milliseconds), the
  search columns (PostgreSQL only) left out, JSON columns parsed by `decode_row`.
- Bodies are rebuilt inside the server by `tapfix_body_rebuild(body_id, day)` (store/pg/bodies.py),
  the one decoder of PostgreSQL's raw deltas, which reads the body's own day partition only.
- Once an id is resolved, its row, changes, choices and bodies are read by the full key or the day
  (`LOAD`, `CHANGES`, `CHOICES`, `BODY`), so PostgreSQL prunes to one day's partitions.
- The connection is in autocommit mode: a reader never holds a transaction open (which would hold
  back VACUUM), and it never migrates: a database without tapfix's tables is refused, naming it.
- Resolving an id or prefix uses the primary key `(id, started_at)` of each day partition (ids are
  `collate "C"`, so the range `id >= p and id < p || U+FFFF` is an index range); it can't prune
  partitions: an id's leading milliseconds are its arrival, but nothing holds `started_at` to them.

psycopg is imported here only: this module is loaded for a `postgresql://` store alone.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from tapfix.proxy.store.choices import CHOICE_COLUMNS, choice_row
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.pg.locator import PostgresLocator
from tapfix.proxy.store.reader import LIST_COLUMNS, ORPHAN_OR_CLIENT, CaptureFilter, CaptureReader, decode_row

if TYPE_CHECKING:
    from tapfix.proxy.store.volume import Dialect

LIST = f"{LIST_COLUMNS}, attempt_of, attempt, trace_id"
# By the full primary key or the day: PostgreSQL reads one partition of each table, not every day's.
LOAD = "select * from exchanges where id = ? and started_at = ?"
CHANGES = "select stage, kind, path, before, after, reason from changes where exchange_id = ? and day = ? order by seq"
CHOICES = f'select {CHOICE_COLUMNS} from choices where exchange_id = ? and day = ? order by "index"'
BODY = "select tapfix_body_rebuild(?, ?) as b"  # the one decoder of PostgreSQL's deltas (store/pg/bodies.py)
PG_ONLY = ("search_text", "search", "commit_xid", "commit_seq")  # columns SQLite's exchanges lack


def pyformat(sql: str) -> bytes:
    """qmark SQL (`?`, the style every backend's SQL is written in) as psycopg takes it (`%s`)."""
    return sql.replace("%", "%%").replace("?", "%s").encode()


def iso(when: datetime.datetime | str | None) -> str | None:
    """A timestamptz as the SQLite store's text: `2026-01-02T03:04:05.678+00:00`."""
    if not isinstance(when, datetime.datetime):
        return when
    return when.astimezone(datetime.UTC).isoformat(timespec="milliseconds")


def filter_clauses(filters: CaptureFilter, table: str = "exchanges") -> tuple[list[str], list[Any]]:
    """The filters as SQL conditions (qmark) on `table` (a name or an alias of exchanges), with their arguments."""

    def condition(key: str) -> str:
        if key in ("flag", "tag"):
            return f"exists (select 1 from json_array_elements_text({table}.{key}s::json) v where v = ?)"
        if key == "route":
            return f"({table}.route_decision::jsonb ->> 'route') = ?"
        return f"{table}.{'session_id' if key == 'session' else 'trace_id'} = ?"

    return filters.clauses(condition)


def decode(row: dict[str, Any]) -> dict[str, Any]:
    """A PostgreSQL row as `decode_row` makes a SQLite one."""
    for key in PG_ONLY:
        row.pop(key, None)
    for key in ("started_at", "first_at", "last_at"):
        if key in row:
            row[key] = iso(row[key])
    return decode_row(row)


def said(locator: PostgresLocator, e: Exception) -> str:
    """What the server or libpq said, on one line (libpq's hints come on lines of their own), masked."""
    return locator.scrub(" ".join(str(e).split()))


def connect(locator: PostgresLocator, purpose: str, **options: Any) -> psycopg.Connection[Any]:
    """An autocommit connection named for `purpose` (`application_name`), or a one-line `StoreError`."""
    try:
        return psycopg.connect(
            locator.url, autocommit=True, application_name=f"tapfix {purpose}", connect_timeout=5, **options
        )
    except psycopg.Error as e:
        raise StoreError(f"{locator}: can't connect ({said(locator, e)})") from None


class PostgresReader(CaptureReader):
    """One read-only use of a PostgreSQL store (`close()` when done)."""

    backend = "postgresql"

    def __init__(
        self, locator: PostgresLocator | str, *, conn: psycopg.Connection[dict[str, Any]] | None = None
    ) -> None:
        """`conn`: read on a connection the caller holds (the browser's pool lends one per request;
        autocommit, `dict_row`), already known to reach a tapfix store."""
        self.locator = locator if isinstance(locator, PostgresLocator) else PostgresLocator.parse(locator)
        self._started: dict[str, datetime.datetime] = {}  # resolved ids: where their rows are
        self.conn: psycopg.Connection[dict[str, Any]]
        if conn is not None:
            self.conn = conn
            return
        self.conn = connect(self.locator, "reader", row_factory=dict_row)
        found = self.conn.execute("select to_regclass('tapfix_migrations') as t").fetchone()
        if found is None or found["t"] is None:
            self.conn.close()
            raise StoreError(f"{self.locator}: no tapfix store there yet (a tapfix run with this --db makes it)")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PostgresReader:
        return self

    def rows(self, sql: str, args: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """The rows; a database error as a one-line `StoreError` (the password masked)."""
        try:
            return self.conn.execute(pyformat(sql), args).fetchall()
        except psycopg.Error as e:
            raise StoreError(f"{self.locator}: {said(self.locator, e)}") from None

    def _dict_rows(self, sql: str, args: Sequence[Any]) -> list[dict[str, Any]]:
        return self.rows(sql, list(args))

    @functools.cached_property
    def list_columns(self) -> str:
        """What `captures list` and `captures tail` select: prefix_break is null on a store no writer of pg007
        or later has migrated yet."""
        found = self.rows(
            "select 1 as f from information_schema.columns where table_name = 'exchanges'"
            " and column_name = 'prefix_break' and table_schema = current_schema()"
        )
        return f"{LIST}, {'prefix_break' if found else 'null as prefix_break'}"

    def _values(self, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        return [tuple(row.values()) for row in self.rows(sql, list(args))]

    def _volume_dialect(self) -> Dialect:
        from tapfix.proxy.store.pg.volume import volume_dialect

        return volume_dialect(self)

    def _clients(self, filters: CaptureFilter, limit: int) -> list[dict[str, Any]]:
        where, args = filter_clauses(filters)
        where.insert(0, f"({ORPHAN_OR_CLIENT})")
        sql = f"select {self.list_columns} from exchanges where {' and '.join(where)} order by id desc"
        if limit > 0:
            sql += f" limit {int(limit)}"
        return [decode(row) for row in self.rows(sql, args)]

    def _attempts(self, parents: list[str]) -> list[dict[str, Any]]:
        sql = f"select {self.list_columns} from exchanges where attempt_of = any(?) order by attempt_of, attempt, id"
        return [decode(row) for row in self.rows(sql, [parents])]

    def answered_turns(self, chains: list[str]) -> list[tuple[Any, ...]]:
        from tapfix.proxy.store.replay_turns import ANSWERED_SQL

        rows = self.rows(ANSWERED_SQL.format(marks=", ".join("?" for _ in chains)), chains)
        return [tuple(r.values()) for r in rows]

    def known_flags(self) -> list[str]:
        rows = self.rows(
            "select distinct v from exchanges, json_array_elements_text(exchanges.flags::json) v"
            " where exchanges.flags <> '[]'"
        )
        return sorted(str(r["v"]) for r in rows)

    def _ids_from(self, prefix: str) -> list[str]:
        rows = self.rows(
            "select id, started_at from exchanges where id >= ? and id < ? order by id limit 3",
            (prefix, prefix + "\uffff"),
        )
        for row in rows:
            self._started[row["id"]] = row["started_at"]
        return [str(row["id"]) for row in rows]

    def _day_of(self, capture_id: str) -> datetime.date:
        """The UTC day of a capture's partitions, once its id is resolved (a look-up otherwise)."""
        if capture_id not in self._started:
            self.resolve_id(capture_id)
        return self._started[capture_id].astimezone(datetime.UTC).date()

    def _capture(self, capture_id: str) -> dict[str, Any]:
        capture = decode(self.rows(LOAD, (capture_id, self._started[capture_id]))[0])
        if isinstance(capture.get("chunk_timing"), memoryview):
            capture["chunk_timing"] = bytes(capture["chunk_timing"])
        return capture

    def _changes(self, capture_id: str) -> list[dict[str, Any]]:
        return self.rows(CHANGES, (capture_id, self._day_of(capture_id)))

    def read_choices(self, exchange_id: str) -> list[dict[str, Any]]:
        """Every choice of an `n > 1` answer, by index, as SQLite's `read_choices`."""
        with self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(pyformat(CHOICES), (exchange_id, self._day_of(exchange_id)))
            return [choice_row(r) for r in cur.fetchall()]

    def _body(self, capture: dict[str, Any], body_id: int) -> bytes | None:
        day = datetime.date.fromisoformat(str(capture["started_at"])[:10])  # UTC: the writer's ISO text
        row = self.rows(BODY, (body_id, day))[0]
        return bytes(row["b"]) if row["b"] is not None else None
