"""The parts a capture store hands out (store/backend.py `StoreBackend`), each implemented by every backend:
a writer's connection (`WriteBackend`, under the one `CaptureWriter`), a tail, the browser's queries
(and a reader: store/reader.py `CaptureReader`, whose logic is shared).

One parameter style for all SQL the writer and its helpers (sessions, choices, copy) send through a
`WriteBackend`: qmark (`?`), SQLite's own; the PostgreSQL backend translates it once per statement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from tapfix.proxy.store.pages import PAGE, TURNS_PAGE
from tapfix.proxy.store.sql_executor import Executes

if TYPE_CHECKING:
    from tapfix.proxy.exchange import Exchange
    from tapfix.proxy.store.filters import Filters
    from tapfix.proxy.store.pages import Page, SessionPage, SessionTurns, Stats
    from tapfix.proxy.store.reader import CaptureReader
    from tapfix.proxy.store.retention import Retention
    from tapfix.proxy.store.sessions import SessionSQL

T = TypeVar("T")


class Bodies(Protocol):
    def put(self, data: bytes, family: str | None = None, *, level: int = 6, when: float | None = None) -> int: ...
    def forget(self) -> None: ...
    def prefetch(self, bodies: list[bytes]) -> None: ...
    def end_batch(self) -> None: ...


class WriteBackend(Executes, Protocol):
    """One write connection of one store, used by the writer thread only (store/writer.py `CaptureWriter`).

    Why a seam: the writer's logic (queue, batching, the durability window, observers, kept/lost,
    retries, sessions, redaction) is the same whatever stores the rows; what differs per database is
    the connection, how a transaction starts, what an error means, how a row replaces an older one of
    the same id, and how bodies are deltaed."""

    name: str
    location: str
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
        """The database's trouble (locked, full, read-only, I/O), not the content's: one exchange at a
        time would meet it the same way, so the batch is lost whole."""
        ...

    def outage(self, e: Exception) -> bool:
        """The database is down, restarting or out of reach: the writer holds the batch and tries again
        later, on a new connection (store/writer.py). Never on SQLite: a file is not restarted."""
        ...

    def cause_of(self, e: Exception) -> str:
        """A short name for why the database refused a write, for health's per-cause counts."""
        ...

    def day_columns(self, ex: Exchange) -> dict[str, Any]:
        """Columns every row of `ex` in `changes` and `choices` carries besides its own ({} on SQLite)."""
        ...

    def put_exchange(self, row: dict[str, Any], ex: Exchange) -> None:
        """The exchange's row, replacing an earlier one of the same id, and none of its old changes."""
        ...

    def retain(self, retention: Retention) -> None: ...
    def close(self) -> None: ...


class Follower(Protocol):
    """`captures tail`'s side of a store: each poll gives the exchanges committed since the last one,
    in commit order, as `captures list --json` rows; None while the store is gone (a SQLite file
    deleted or replaced, until a writer makes it again)."""

    def poll(self) -> list[dict[str, Any]] | None: ...
    def close(self) -> None: ...


class BrowseQueries(Protocol):
    """Every read the browser makes (store/queries.py `BrowseBase`; store/pages.py says what differs
    between backends). `reading()` lends a `CaptureReader` for one request: the capture page, body
    downloads and bundles read through it, as `captures show` does."""

    backend: str

    def reading(self) -> AbstractContextManager[CaptureReader]: ...
    def list_exchanges(
        self, f: Filters, *, before: str = "", after: str = "", limit: int = PAGE, now: float | None = None
    ) -> Page: ...
    def facets(self) -> dict[str, list[tuple[str, int]]]: ...
    def replays_of(self, capture_id: str) -> list[dict[str, Any]]: ...
    def attempts_of(self, capture_id: str) -> list[dict[str, Any]]: ...
    def session_neighbours(self, capture: Mapping[str, Any]) -> tuple[str | None, str | None]: ...
    def list_sessions(self, *, before: str = "", limit: int = PAGE) -> SessionPage: ...
    def load_session(self, session_id: str, *, after: str = "", limit: int = TURNS_PAGE) -> SessionTurns | None:
        """One agent run, `limit` turns from the cursor `after` (the page before's `later`; '' first)."""
        ...

    def compute_stats(self, f: Filters) -> Stats: ...
    def stats_complete(self) -> bool:
        """Whether the stats page's numbers are whole yet (SQLite's derived ones wait for its index)."""
        ...

    def cached(self, key: str, ttl: float, compute: Callable[[], T]) -> T: ...
    def in_thread(self, compute: Callable[[], Any]) -> None: ...
    def start(self) -> None:
        """The browser starts serving: background work may begin."""
        ...

    def catch_up(self) -> None:
        """Search finds everything stored so far (SQLite indexes its backlog now)."""
        ...

    def close(self) -> None: ...
