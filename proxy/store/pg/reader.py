"""The read side of a PostgreSQL store: what `captures list`, `show` and `export` need, with the rows
and bytes SQLite's reader (store/reader.py) gives for the same exchanges.

Why a second implementation rather than one SQL text for both: the queries differ where the two
databases do (JSON arrays are `json_each` on SQLite and `json_array_elements_text` here; timestamps
are text there and timestamptz here), and translating SQL on the fly would hide that. What must
not differ is the result, so the two are tested row for row (tests/unit/test_store_reader_backends.py);
the row decoding (`decode_row`) and the listing's shape (attempts under their parent) are shared.

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
from typing import Any

import orjson
import psycopg
from psycopg.rows import dict_row, tuple_row
from tapfix.proxy.store.choices import CHOICE_COLUMNS, choice_row
from tapfix.proxy.store.database import StoreError
from tapfix.proxy.store.pg.locator import PostgresLocator
from tapfix.proxy.store.reader import LIST_COLUMNS, CaptureFilter, CaptureNotFound, body_id_of, decode_row

_LIST = f"{LIST_COLUMNS}, attempt_of, attempt, trace_id"
_ORPHAN_OR_CLIENT = (
    "attempt_of is null or not exists (select 1 from exchanges parent where parent.id = exchanges.attempt_of)"
)
# By the full primary key or the day: PostgreSQL reads one partition of each table, not every day's.
LOAD = "select * from exchanges where id = %s and started_at = %s"
CHANGES = (
    "select stage, kind, path, before, after, reason from changes where exchange_id = %s and day = %s order by seq"
)
CHOICES = f'select {CHOICE_COLUMNS} from choices where exchange_id = %s and day = %s order by "index"'
BODY = "select tapfix_body_rebuild(%s, %s) as b"  # the one decoder of PostgreSQL's deltas (store/pg/bodies.py)
_PG_ONLY = ("search_text", "search", "commit_xid", "commit_seq")  # columns SQLite's exchanges lack


def iso(when: datetime.datetime | str | None) -> str | None:
    """A timestamptz as the SQLite store's text: `2026-01-02T03:04:05.678+00:00`."""
    if not isinstance(when, datetime.datetime):
        return when
    return when.astimezone(datetime.UTC).isoformat(timespec="milliseconds")


def filter_clauses(filters: CaptureFilter, table: str = "exchanges") -> tuple[list[str], list[Any]]:
    """`CaptureFilter.clauses` in PostgreSQL's SQL (%s parameters)."""
    where: list[str] = []
    args: list[Any] = []
    for key, value in filters._given():
        if key in ("flag", "tag"):
            where.append(f"exists (select 1 from json_array_elements_text({table}.{key}s::json) v where v = %s)")
        elif key == "session":
            where.append(f"{table}.session_id = %s")
        else:
            where.append(f"{table}.trace_id = %s")
        args.append(value.lower() if key == "trace" else value)
    return where, args


def decode(row: dict[str, Any]) -> dict[str, Any]:
    """A PostgreSQL row as `decode_row` makes a SQLite one."""
    for key in _PG_ONLY:
        row.pop(key, None)
    for key in ("started_at", "first_at", "last_at"):
        if key in row:
            row[key] = iso(row[key])
    return decode_row(row)


class PostgresReader:
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
        try:
            self.conn = psycopg.connect(
                self.locator.url,
                autocommit=True,
                row_factory=dict_row,
                application_name="tapfix reader",
                connect_timeout=5,
            )
        except psycopg.Error as e:
            raise StoreError(f"{self.locator}: can't connect ({self._said(e)})") from None
        found = self.conn.execute("select to_regclass('tapfix_migrations') as t").fetchone()
        if found is None or found["t"] is None:
            self.conn.close()
            raise StoreError(f"{self.locator}: no tapfix store there yet (a tapfix run with this --db makes it)")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PostgresReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rows(self, sql: str, args: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """The rows; a database error as a one-line `StoreError` (the password masked)."""
        try:
            return self.conn.execute(sql.encode(), args).fetchall()
        except psycopg.Error as e:
            raise StoreError(f"{self.locator}: {self._said(e)}") from None

    def _said(self, e: Exception) -> str:
        """What the server or libpq said, on one line (libpq's hints come on lines of their own), masked."""
        return self.locator.scrub(" ".join(str(e).split()))

    def list_captures(
        self,
        *,
        limit: int = 20,
        flag: str | None = None,
        tag: str | None = None,
        session: str | None = None,
        trace: str | None = None,
    ) -> list[dict[str, Any]]:
        """As store/reader.py's `list_captures`: client requests newest first, each followed by its
        attempts; the filters and `limit` are about client requests."""
        where, args = filter_clauses(CaptureFilter(flag, tag, session, trace))
        where.insert(0, f"({_ORPHAN_OR_CLIENT})")
        sql = f"select {_LIST} from exchanges where {' and '.join(where)} order by id desc"
        if limit > 0:
            sql += f" limit {int(limit)}"
        rows = [decode(row) for row in self._rows(sql, args)]
        parents = [row["id"] for row in rows if row["attempt_of"] is None]
        if not parents:
            return rows
        children: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(parents), 500):
            for row in self._rows(
                f"select {_LIST} from exchanges where attempt_of = any(%s) order by attempt_of, attempt, id",
                [parents[start : start + 500]],
            ):
                child = decode(row)
                children.setdefault(child["attempt_of"], []).append(child)
        out: list[dict[str, Any]] = []
        for row in rows:
            out.append(row)
            out.extend(children.get(row["id"], ()) if row["attempt_of"] is None else ())
        return out

    def known_flags(self) -> list[str]:
        rows = self._rows(
            "select distinct v from exchanges, json_array_elements_text(exchanges.flags::json) v"
            " where exchanges.flags <> '[]'"
        )
        return sorted(str(r["v"]) for r in rows)

    def resolve_id(self, prefix: str) -> str:
        prefix = prefix.strip().lower()
        if not prefix:
            raise CaptureNotFound("empty capture id")
        rows = self._rows(
            "select id, started_at from exchanges where id >= %s and id < %s order by id limit 3",
            (prefix, prefix + "\uffff"),
        )
        if not rows:
            raise CaptureNotFound(f"no capture with id {prefix!r} (see `tapfix captures list`)")
        if len(rows) > 1 and rows[0]["id"] != prefix:
            ids = ", ".join(r["id"] for r in rows)
            raise CaptureNotFound(f"capture id {prefix!r} is ambiguous: {ids}, ...")
        self._started[rows[0]["id"]] = rows[0]["started_at"]
        return str(rows[0]["id"])

    def _day_of(self, capture_id: str) -> datetime.date:
        """The UTC day of a capture's partitions, once its id is resolved (a look-up otherwise)."""
        if capture_id not in self._started:
            self.resolve_id(capture_id)
        return self._started[capture_id].astimezone(datetime.UTC).date()

    def load_capture(self, capture_id: str) -> dict[str, Any]:
        capture_id = self.resolve_id(capture_id)
        started = self._started[capture_id]
        capture = decode(self._rows(LOAD, (capture_id, started))[0])
        for key in ("chunk_timing",):
            if isinstance(capture.get(key), memoryview):
                capture[key] = bytes(capture[key])
        capture["change_rows"] = [
            {
                **c,
                "before": orjson.loads(c["before"]) if c["before"] else None,
                "after": orjson.loads(c["after"]) if c["after"] else None,
            }
            for c in self._rows(CHANGES, (capture_id, self._day_of(capture_id)))
        ]
        return capture

    def read_choices(self, exchange_id: str) -> list[dict[str, Any]]:
        """Every choice of an `n > 1` answer, by index, as store/choices.py's `read_choices`."""
        with self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(CHOICES.encode(), (exchange_id, self._day_of(exchange_id)))
            return [choice_row(r) for r in cur.fetchall()]

    def capture_body(self, capture: dict[str, Any], which: str) -> bytes:
        """which: request | forwarded | response | client_response — exact bytes."""
        body_id = body_id_of(capture, which)
        if body_id is None:
            if capture.get("request_body_id") is None and capture.get("request_size"):
                raise StoreError(f"capture {capture['id']} was stored without bodies (privacy mode)")
            return b""
        day = datetime.date.fromisoformat(str(capture["started_at"])[:10])  # UTC: the writer's ISO text
        row = self._rows(BODY, (body_id, day))[0]
        return bytes(row["b"]) if row["b"] is not None else b""
