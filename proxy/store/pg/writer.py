"""PostgreSQL's side of the writer's seam (store/backend.py `WriteBackend`): one psycopg connection, explicit
transactions, the day partitions made ahead, search columns, and what PostgreSQL's errors mean.

- Transactions: the connection is in autocommit mode and the writer's `begin`/`commit` are sent as
  statements, so a migration or `tapfix_add_day` (their own `conn.transaction()`) never nests in a
  batch. Read committed: a batch sees other instances' committed rows (sessions join across them).
- Batches of all instances take one advisory lock (`WRITE_LOCK`) for their transaction: two
  instances writing a turn and its continuation at the same moment would each miss the other's
  uncommitted row (neither the continuation's look-up nor the parent's adoption of a waiting session
  sees it), and the agent run would stay split in two sessions. Serialized, the second sees the
  first. The price: the fleet's writes are one transaction at a time (one batch of up to 256), which
  a fleet's rate stays far below; locks per conversation hash would lift it.
- A row replaces an earlier one of its id with a delete then an insert: the primary key is
  `(id, started_at)` (a partitioned table's key must hold its partition key), so `on conflict (id)`
  can't say it.
- Text columns can't hold NUL (PostgreSQL's text rejects the byte): a NUL in any text parameter is
  stored as U+FFFD. Bodies are bytea and stay exact; JSON columns (orjson) escape NUL as `\\u0000`
  anyway, so only free text (content, reasoning, errors, user agents) is ever touched.
- Search: `search_text` is the turn's new text and its answer, the same text the SQLite browser's
  sidecar index holds (store/turns.py `search_document`), and `search` its tsvector (`simple`).
- The day's partitions (today and tomorrow, UTC) are made at start and whenever the day turns,
  before the batch's transaction; a row of a day without one (a skewed clock) lands in the default.
- A server that is down or restarting is an outage (`outage`), not a failure: the writer holds the
  exchanges and retries (store/writer.py). The connection is (re)made by `begin`, migrating and
  making the days on the first one, so tapfix can start while the server is down (`wait`).

psycopg is imported here only: this module is loaded for a `postgresql://` store alone.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import psycopg
from tapfix.proxy.store.errors import StoreError, StoreUnreachable
from tapfix.proxy.store.pg.body_writer import PostgresBodyWriter, utc_day
from tapfix.proxy.store.pg.locator import PostgresLocator
from tapfix.proxy.store.pg.migrate import add_days, migrate
from tapfix.proxy.store.pg.reader import pyformat
from tapfix.proxy.store.sessions import SessionSQL
from tapfix.proxy.store.turns import messages_of, parse_json, search_document
from tapfix.proxy.store.writer import CaptureWriter

if TYPE_CHECKING:
    from tapfix.proxy.exchange import Exchange
    from tapfix.proxy.store.parts import Bodies
    from tapfix.proxy.store.retention import Retention

SEARCH_TEXT_MAX = 100_000  # characters: a tsvector must stay under 1 MB
NUL_STANDS_FOR = "\ufffd"

POSTGRES_SESSION_SQL = SessionSQL(
    by_response="select session_id, coalesce(thread_id, id) from exchanges where response_id = ?"
    " and session_id is not null order by id desc limit 1",
    continued="with p(h, k) as (values {values})"
    " select e.session_id, coalesce(e.thread_id, e.id) from p join exchanges e on e.chain_hash = p.h"
    " left join sessions s on s.id = e.session_id"
    " where e.session_id is not null"
    " order by p.k desc, (e.client_addr is not distinct from ? and e.user_agent is not distinct from ?) desc,"
    " coalesce(s.tip_hash = e.chain_hash, false) desc, e.id"
    " limit 1",
    continued_in="with p(h, k) as (values {values})"
    " select coalesce(e.thread_id, e.id) from p join exchanges e on e.chain_hash = p.h"
    " where e.session_id = ? order by p.k desc, e.id desc limit 1",
    record="insert into sessions (id, first_at, last_at, user_agent, model, exchanges, tip_hash, wants)"
    " values (?, ?, ?, ?, ?, 1, ?, ?)"
    " on conflict (id) do update set exchanges = sessions.exchanges + 1,"
    " first_at = least(sessions.first_at, excluded.first_at), last_at = greatest(sessions.last_at, excluded.last_at),"
    " tip_hash = case when excluded.last_at >= sessions.last_at then coalesce(excluded.tip_hash, sessions.tip_hash)"
    " else sessions.tip_hash end",
    orphan="select id, first_at, last_at, exchanges, tip_hash from sessions where wants = ? and id <> ?"
    " order by (user_agent is not distinct from ?) desc, first_at, id limit 1",
    adopt="update sessions set exchanges = exchanges + ?, first_at = least(first_at, ?),"
    " last_at = greatest(last_at, ?),"
    " tip_hash = case when ? >= last_at then coalesce(?, tip_hash) else tip_hash end where id = ?",
    # `orphan`, then the exchanges moved, `adopt` and the orphan's delete, in one statement.
    adopt_waiting="with o as (select id, first_at, last_at, exchanges, tip_hash from sessions"
    " where wants = ? and id <> ? order by (user_agent is not distinct from ?) desc, first_at, id limit 1),"
    " moved as (update exchanges set session_id = ? where session_id = (select id from o)),"
    " gone as (delete from sessions where id = (select id from o))"
    " update sessions s set exchanges = s.exchanges + o.exchanges, first_at = least(s.first_at, o.first_at),"
    " last_at = greatest(s.last_at, o.last_at),"
    " tip_hash = case when o.last_at >= s.last_at then coalesce(o.tip_hash, s.tip_hash) else s.tip_hash end"
    " from o where s.id = ?",
)

# A row stored again under its id replaces the old one, its changes with it: one statement (in the
# batch's pipeline, so no round trip of its own).
_REPLACE = "with gone as (delete from changes where exchange_id = ?) delete from exchanges where id = ?"

# SQLSTATE classes and codes, https://www.postgresql.org/docs/current/errcodes-appendix.html
_LOCKED = ("40001", "40P01", "55P03")  # serialization failure, deadlock, lock not available: retry
# What a failed connection attempt says when the server answered and refused us (a wrong URL,
# password or database): no outage, waiting won't fix it. Anything else (refused, timed out, starting
# up, shutting down) is.
_REFUSED = ("does not exist", "authentication failed", "pg_hba.conf", "permission denied", "no password supplied")
WRITE_LOCK = 0x7461706669780001  # beside migrate.MIGRATE_LOCK
_OUTAGE_STATES = ("08", "57P01", "57P02", "57P03")  # connection exceptions; admin/crash shutdown; can't connect now
_CAUSES = (
    ("disk_full", ("53100",)),
    ("read_only", ("25006",)),
    ("locked", _LOCKED),
    ("unavailable", ("08", "57")),  # connection trouble, shutdown or restart
    ("resources", ("53",)),
    ("io", ("58",)),
)


def _text(value: Any) -> Any:
    return value.replace("\x00", NUL_STANDS_FOR) if isinstance(value, str) and "\x00" in value else value


class PostgresBackend:
    """The write connection of one PostgreSQL store (migrated on open); the writer thread's alone.

    `wait`: a server that can't be reached now is no error; `unreachable` says why, and the first
    `begin` that reaches it migrates. Without it (`tapfix run --strict`) it is `StoreUnreachable`."""

    name = "postgresql"
    session_sql = POSTGRES_SESSION_SQL
    _pipeline: AbstractContextManager[psycopg.Pipeline] | None = None  # the batch's, while its transaction is open

    def __init__(self, locator: PostgresLocator | str, *, wait: bool = False) -> None:
        self.locator = locator if isinstance(locator, PostgresLocator) else PostgresLocator.parse(locator)
        self.location = str(self.locator)
        self._sql: dict[str, bytes] = {}
        self._day: datetime.date | None = None
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.unreachable: str | None = None
        self.bodies: Bodies = PostgresBodyWriter(self)
        try:
            self._open()
        except psycopg.Error as e:
            said = self.locator.scrub(" ".join(str(e).split()))  # libpq's hint comes on a line of its own
            if not self.outage(e):
                raise StoreError(f"{self.locator}: can't connect ({said})") from None
            if not wait:
                raise StoreUnreachable(f"{self.locator}: can't connect ({said})") from None
            self.unreachable = said

    @property
    def conn(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None:
            raise psycopg.OperationalError(f"{self.locator}: not connected (the server was unreachable)")
        return self._conn

    def _open(self) -> None:
        """Connect; migrate and make the days on the first connection, and the days again on a new one."""
        self._conn = psycopg.connect(
            self.locator.url, autocommit=True, application_name="tapfix writer", connect_timeout=5
        )
        migrate(self._conn, str(self.locator))
        self._day = None
        self._add_days()
        self.unreachable = None

    def _add_days(self) -> None:
        now = time.time()
        if utc_day(now) != self._day:
            add_days(self.conn, now, 1)
            self._day = utc_day(now)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[tuple[Any, ...]]:
        translated = self._sql.get(sql)
        if translated is None:
            translated = self._sql[sql] = pyformat(sql)
        self._pipelined()
        return self.conn.execute(translated, [_text(p) for p in params])

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._pipelined()
            with self.conn.cursor() as cur:
                cur.executemany(pyformat(sql), [[_text(p) for p in row] for row in rows])

    def _pipelined(self) -> None:
        """Inside a batch's transaction, statements go in pipeline mode: one that returns nothing the
        writer reads (an insert, a delete, a session's count) costs no round trip of its own, it goes
        with the next one whose rows are read, or with the commit. Outside a transaction (migrations,
        the day partitions) statements run one by one as before."""
        if self._pipeline is None and self.conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            pipeline = self.conn.pipeline()
            pipeline.__enter__()
            self._pipeline = pipeline

    def _end_pipeline(self) -> None:
        """Send what is queued and read every result: an error of any statement of the batch raises here."""
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            pipeline.__exit__(None, None, None)

    def begin(self) -> None:
        if self._conn is None or self._conn.closed or self._conn.broken:  # the server restarted, or we were cut
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._open()
        self._add_days()
        self.conn.execute("begin")
        self.conn.execute("select pg_advisory_xact_lock(%s)", (WRITE_LOCK,))

    def commit(self) -> None:
        self.bodies.verify()  # type: ignore[attr-defined]  # raises BodiesMoved: the batch is written again
        self.conn.execute("commit")
        self._end_pipeline()
        self.bodies.ended(committed=True)  # type: ignore[attr-defined]

    def rollback(self) -> None:
        self.bodies.ended(committed=False)  # type: ignore[attr-defined]
        try:
            self._end_pipeline()
        except psycopg.Error:  # the error the batch is rolled back for, again
            pass
        try:
            self.conn.execute("rollback")
        except psycopg.Error:
            pass

    def locked(self, e: Exception) -> bool:
        return isinstance(e, psycopg.Error) and (e.sqlstate or "") in _LOCKED

    def outage(self, e: Exception) -> bool:
        """The server is down, restarting or out of reach, or it cut our connection: worth holding the
        exchanges and trying again on a new connection (`begin` reconnects)."""
        if not isinstance(e, psycopg.OperationalError | psycopg.InterfaceError):
            return False
        state = e.sqlstate or ""
        if state.startswith(_OUTAGE_STATES):
            return True
        if self._conn is None or self._conn.closed or self._conn.broken:
            return not state and not any(word in str(e) for word in _REFUSED)
        return False

    def environmental(self, e: Exception) -> bool:
        if isinstance(e, psycopg.InterfaceError | psycopg.OperationalError) and not isinstance(
            e, psycopg.errors.QueryCanceled
        ):
            return True
        return isinstance(e, psycopg.Error) and self.cause_of(e) != type(e).__name__

    def cause_of(self, e: Exception) -> str:
        state = getattr(e, "sqlstate", None) or ""
        for cause, prefixes in _CAUSES:
            if state and state.startswith(prefixes):
                return cause
        if isinstance(e, psycopg.InterfaceError | psycopg.OperationalError):
            return "unavailable"
        return type(e).__name__

    def day_columns(self, ex: Exchange) -> dict[str, Any]:
        return {"day": utc_day(ex.started_at)}

    def put_exchange(self, row: dict[str, Any], ex: Exchange) -> None:
        self.execute(_REPLACE, (row["id"], row["id"]))
        text = _search_text(row, ex)
        columns = ", ".join(row)
        marks = ", ".join("?" * len(row))
        self.execute(
            f"insert into exchanges ({columns}, search_text, search) values ({marks}, ?, to_tsvector('simple', ?))",
            [*row.values(), text, text or ""],
        )

    def retain(self, retention: Retention) -> None:
        """Between batches, on the writer's thread: day partitions dropped, the straddling day's rows deleted."""
        from tapfix.proxy.store.pg.retention import purge

        retention.maybe_run(lambda age, size, now: purge(self.conn, age, size, now=now))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def postgres_writer(locator: PostgresLocator | str, *, wait: bool = False, **options: Any) -> CaptureWriter:
    """A `CaptureWriter` on a PostgreSQL store (migrated, today's and tomorrow's days made; with `wait`,
    once the server can be reached). `options`: `CaptureWriter`'s (batch, retention, held bounds)."""
    return CaptureWriter(PostgresBackend(locator, wait=wait), **options)


def _search_text(row: dict[str, Any], ex: Exchange) -> str | None:
    """What search finds the exchange by; None when bodies aren't kept (`--no-bodies`)."""
    if not ex.store_bodies:
        return None
    messages = messages_of(parse_json(ex.readable_request()))
    prompt, answer = search_document(messages, row.get("content"), row.get("reasoning"), row.get("tool_calls"))
    text = f"{prompt}\n\n{answer}".strip()
    return _text(text[:SEARCH_TEXT_MAX]) or None
