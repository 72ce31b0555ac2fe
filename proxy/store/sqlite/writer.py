"""SQLite's side of the writer's seam (store/backend.py `WriteBackend`): one connection to a file,
`begin immediate`, `insert or replace`, zlib deltas, the session statements in SQLite's dialect, and
what SQLite's errors mean.

Why a database's refusal is told apart: its own trouble (locked, full, read-only, I/O), which one
exchange at a time would meet the same way, from an exchange's content, which it wouldn't. The
writer decides by it whether to retry, store a batch one by one, or count the batch as lost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapfix.proxy.store.sessions import SessionSQL
from tapfix.proxy.store.sql_functions import register
from tapfix.proxy.store.sqlite.bodies import BodyWriter
from tapfix.proxy.store.sqlite.database import open_for_writing

if TYPE_CHECKING:
    from tapfix.proxy.exchange import Exchange
    from tapfix.proxy.store.parts import Bodies
    from tapfix.proxy.store.retention import Retention

SQLITE_SESSION_SQL = SessionSQL(
    by_response="select session_id, coalesce(thread_id, id) from exchanges where response_id = ?"
    " and session_id is not null order by rowid desc limit 1",
    continued="with p(h, k) as (values {values})"
    " select e.session_id, coalesce(e.thread_id, e.id) from p join exchanges e on e.chain_hash = p.h"
    " left join sessions s on s.id = e.session_id"
    " where e.session_id is not null"
    " order by p.k desc, (e.client_addr is ? and e.user_agent is ?) desc,"
    " coalesce(s.tip_hash = e.chain_hash, 0) desc, e.rowid"
    " limit 1",
    continued_in="with p(h, k) as (values {values})"
    " select coalesce(e.thread_id, e.id) from p join exchanges e on e.chain_hash = p.h"
    " where e.session_id = ? order by p.k desc, e.rowid desc limit 1",
    record="insert into sessions (id, first_at, last_at, user_agent, model, exchanges, tip_hash, wants)"
    " values (?, ?, ?, ?, ?, 1, ?, ?)"
    " on conflict(id) do update set exchanges = exchanges + 1,"
    " first_at = min(first_at, excluded.first_at), last_at = max(last_at, excluded.last_at),"
    " tip_hash = case when excluded.last_at >= last_at then coalesce(excluded.tip_hash, tip_hash)"
    " else tip_hash end",
    orphan="select id, first_at, last_at, exchanges, tip_hash from sessions where wants = ? and id != ?"
    " order by (user_agent is ?) desc, first_at, id limit 1",
    adopt="update sessions set exchanges = exchanges + ?, first_at = min(first_at, ?), last_at = max(last_at, ?),"
    " tip_hash = case when ? >= last_at then coalesce(?, tip_hash) else tip_hash end where id = ?",
    any_waiting="select 1 from sessions where wants is not null limit 1",
)


def locked(e: Exception) -> bool:
    return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))


def environmental(e: Exception) -> bool:
    """The database's trouble (locked, full, read-only, I/O), not the content's."""
    text = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and any(
        word in text for word in ("locked", "busy", "full", "disk i/o", "readonly", "read-only")
    )


def cause_of(e: Exception) -> str:
    """A short name for why the database refused a write, for health's per-cause counts."""
    text = str(e).lower()
    if isinstance(e, sqlite3.OperationalError):
        for cause, words in _CAUSES:
            if any(word in text for word in words):
                return cause
    return type(e).__name__


_CAUSES = (
    ("disk_full", ("full", "too large")),
    ("locked", ("locked", "busy")),
    ("read_only", ("readonly", "read-only")),
    ("io", ("disk i/o",)),
)


class SqliteBackend:
    """A SQLite file: `begin immediate` (the write lock up front, so a batch never fails half way on
    a lock), `insert or replace`, and zlib deltas against the family's last body."""

    name = "sqlite"
    session_sql = SQLITE_SESSION_SQL
    unreachable: str | None = None

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.location = str(self.path)
        self.conn = open_for_writing(path)
        self.bodies: Bodies = BodyWriter(self.conn)
        register(self.conn)  # `tapfix_body_bytes`: the prefix tracker reads a session's earlier requests

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def begin(self) -> None:
        self.conn.execute("begin immediate")

    def commit(self) -> None:
        self.conn.execute("commit")

    def rollback(self) -> None:
        try:
            self.conn.execute("rollback")
        except sqlite3.Error:
            pass

    def locked(self, e: Exception) -> bool:
        return locked(e)

    def environmental(self, e: Exception) -> bool:
        return environmental(e)

    def outage(self, e: Exception) -> bool:
        return False

    def cause_of(self, e: Exception) -> str:
        return cause_of(e)

    def day_columns(self, ex: Exchange) -> dict[str, Any]:
        return {}

    def put_exchange(self, row: dict[str, Any], ex: Exchange) -> None:
        """A new row in one statement; a capture stored before (written again) replaced whole, with a new rowid
        (store/sqlite/tail.py), its old changes gone. Two paths so the common one is a single statement: each costs
        the writer thread a GIL hand-over besides the work (issue 34)."""
        columns = ", ".join(row)
        marks = ", ".join("?" * len(row))
        values = list(row.values())
        added = self.conn.execute(
            f"insert into exchanges ({columns}) values ({marks}) on conflict (id) do nothing", values
        ).rowcount
        if added != 1:
            self.conn.execute(f"insert or replace into exchanges ({columns}) values ({marks})", values)
            self.conn.execute("delete from changes where exchange_id = ?", (row["id"],))

    def retain(self, retention: Retention) -> None:
        from tapfix.proxy.store.sqlite.retention import purge

        retention.maybe_run(lambda age, size, now: purge(self.conn, age, size, now=now))

    def close(self) -> None:
        """Checkpoint the WAL, close."""
        self.conn.execute("pragma wal_checkpoint(truncate)")
        self.conn.close()
