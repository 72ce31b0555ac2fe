"""The seam between the capture writer and a database: what `CaptureWriter` needs, and SQLite's side of it.

Why a seam: the writer's logic (queue, batching, the durability window, observers, kept/lost, retries,
sessions, redaction) is the same whatever stores the rows; what differs per database is the
connection, how a transaction starts, what an error means, how a row replaces an older one of the
same id, and how bodies are deltaed. So `CaptureWriter` talks to a `WriteBackend` and has one home;
SQLite's backend is below, PostgreSQL's in store/pg/writer.py.

One parameter style for all SQL the writer and its helpers (sessions, choices) send: qmark (`?`),
SQLite's own; the PostgreSQL backend translates it once per statement text.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tapfix.proxy.store import write_errors
from tapfix.proxy.store.bodies import BodyWriter
from tapfix.proxy.store.database import open_for_writing
from tapfix.proxy.store.sessions import SQLITE_SESSION_SQL, SessionSQL
from tapfix.proxy.store.sql_executor import Executes

if TYPE_CHECKING:
    from tapfix.proxy.exchange import Exchange
    from tapfix.proxy.store.retention import Retention


class Bodies(Protocol):
    def put(self, data: bytes, family: str | None = None, *, level: int = 6, when: float | None = None) -> int: ...
    def forget(self) -> None: ...


class WriteBackend(Executes, Protocol):
    """One write connection of one store, used by the writer thread only."""

    name: str  # "sqlite" or "postgresql", for health and logs
    location: str  # the store as shown in the banner and health: a path, or a URL with its password masked
    unreachable: str | None  # why the database could not be reached at start (None: it was)
    bodies: Bodies
    session_sql: SessionSQL

    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def locked(self, e: Exception) -> bool:
        """Another writer holds what this one needs: worth a retry of the same transaction."""
        ...

    def environmental(self, e: Exception) -> bool:
        """The database's trouble, not the content's: the batch is lost whole (see store/write_errors.py)."""
        ...

    def outage(self, e: Exception) -> bool:
        """The database is down, restarting or out of reach: the writer holds the batch and tries again
        later, on a new connection (store/writer.py). Never on SQLite: a file is not restarted."""
        ...

    def cause_of(self, e: Exception) -> str: ...
    def day_columns(self, ex: Exchange) -> dict[str, Any]:
        """Columns every row of `ex` in `changes` and `choices` carries besides its own ({} on SQLite)."""
        ...

    def put_exchange(self, row: dict[str, Any], ex: Exchange) -> None:
        """The exchange's row, replacing an earlier one of the same id, and none of its old changes."""
        ...

    def retain(self, retention: Retention) -> None: ...
    def close(self) -> None: ...


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
        return write_errors.locked(e)

    def environmental(self, e: Exception) -> bool:
        return write_errors.environmental(e)

    def outage(self, e: Exception) -> bool:
        return False

    def cause_of(self, e: Exception) -> str:
        return write_errors.cause_of(e)

    def day_columns(self, ex: Exchange) -> dict[str, Any]:
        return {}

    def put_exchange(self, row: dict[str, Any], ex: Exchange) -> None:
        columns = ", ".join(row)
        marks = ", ".join("?" * len(row))
        self.conn.execute(f"insert or replace into exchanges ({columns}) values ({marks})", list(row.values()))
        self.conn.execute("delete from changes where exchange_id = ?", (row["id"],))

    def retain(self, retention: Retention) -> None:
        retention.maybe_run(self.conn)

    def close(self) -> None:
        """Checkpoint the WAL, close."""
        self.conn.execute("pragma wal_checkpoint(truncate)")
        self.conn.close()
