"""What the browser reads a capture store through, on either backend (app.py `open_store` picks one).

The pages (app.py, detail.py) ask a `BrowseStore` for rows; each backend answers with its own SQL:
SQLite's in queries.py (with session_turns.py and stats.py), over thread-local read-only connections
and the search sidecar; PostgreSQL's in pg_queries.py (with pg_stats.py), over a small connection
pool and the search columns the writer maintains. The same exchanges give the same pages on both
(tests/unit/test_browse_backends.py). What differs, and why:

- Order. SQLite lists by `rowid` (write order: the order exchanges completed); PostgreSQL has no
  rowid, and lists by capture id, which sorts by arrival (proxy/ids.py). Both are the newest first,
  and a page cursor (`?before=ID`) is a capture id on both; they differ only where a long request
  completed after a shorter one that arrived later.
- Search. SQLite's sidecar is FTS5 (words, "phrases", `prefix*`); PostgreSQL's matches each term as
  words in the `search` tsvector or as a substring of `search_text` (pg_trgm), so a part of a word
  or of a CJK run is found too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from tapfix.proxy.browse.filters import Filters
    from tapfix.proxy.browse.fts import SearchIndex
    from tapfix.proxy.browse.session_turns import SessionView
    from tapfix.proxy.browse.stats import Stats
    from tapfix.proxy.store.reader import CaptureReader

T = TypeVar("T")
PAGE = 50


@dataclass
class Page:
    rows: list[dict[str, Any]]
    older: str | None = None  # capture id to pass as ?before=
    newer: str | None = None  # capture id to pass as ?after=
    searched: bool = False
    index_behind: int = 0  # exchanges the search index has not reached yet


@dataclass
class SessionPage:
    rows: list[dict[str, Any]] = field(default_factory=list)
    older: str | None = None


class BrowseStore(Protocol):
    """Every read the browser makes. `reading()` lends a `CaptureReader` (store/reader.py) for one
    request: capture detail, body downloads and bundles read through it, as `captures show` does."""

    backend: str
    index: SearchIndex | None  # SQLite's search sidecar; None when search is off, or built in (PostgreSQL)

    def reading(self) -> AbstractContextManager[CaptureReader]: ...
    def list_exchanges(
        self, f: Filters, *, before: str = "", after: str = "", limit: int = PAGE, now: float | None = None
    ) -> Page: ...
    def facets(self) -> dict[str, list[tuple[str, int]]]: ...
    def replays_of(self, capture_id: str) -> list[dict[str, Any]]: ...
    def attempts_of(self, capture_id: str) -> list[dict[str, Any]]: ...
    def session_neighbours(self, capture: Mapping[str, Any]) -> tuple[str | None, str | None]: ...
    def list_sessions(self, *, before: str = "", limit: int = PAGE) -> SessionPage: ...
    def load_session(self, session_id: str, *, after: str = "", limit: int = PAGE) -> SessionView | None:
        """One agent run, `limit` turns from the cursor `after` (the page before's `later`; '' first)."""
        ...

    def compute_stats(self, f: Filters) -> Stats: ...
    def cached(self, key: str, ttl: float, compute: Callable[[], T]) -> T: ...
    def in_thread(self, compute: Callable[[], Any]) -> None: ...
    def close(self) -> None: ...


class CachedStore:
    """Stale-while-revalidate caching of aggregates, and work on threads of its own, for either backend."""

    transient: tuple[type[Exception], ...] = ()  # what a background refresh shrugs off (the next one retries)

    def __init__(self) -> None:
        self._cache: dict[str, tuple[float, Any]] = {}
        self._refreshing: set[str] = set()

    def cached(self, key: str, ttl: float, compute: Callable[[], T]) -> T:
        """Only the very first request waits for an aggregate over the whole store; later ones get the
        last value while a thread recomputes it."""
        hit = self._cache.get(key)
        if hit is None:
            value = compute()
            self._cache[key] = (time.monotonic(), value)
            while len(self._cache) > 128:  # one entry per filter combination: keep the newest
                self._cache.pop(next(iter(self._cache)))
            return value
        if time.monotonic() - hit[0] >= ttl and key not in self._refreshing:
            self._refreshing.add(key)
            threading.Thread(target=self._refresh, args=(key, compute), daemon=True).start()
        return hit[1]  # type: ignore[no-any-return]  # one key is always computed by the same function

    def in_thread(self, compute: Callable[[], Any]) -> None:
        """Run `compute` (say, warming a cache at start) on its own thread."""
        threading.Thread(target=self._refresh, args=(None, compute), daemon=True).start()

    def _refresh(self, key: str | None, compute: Callable[[], Any]) -> None:
        try:
            value = compute()
            if key is not None:
                self._cache[key] = (time.monotonic(), value)
        except self.transient:
            pass  # keep the stale value; the next request tries again
        finally:
            if key is not None:
                self._refreshing.discard(key)
            self.thread_done()

    def thread_done(self) -> None:
        """A thread of `_refresh` ends: release what it holds."""


def newest_first(rows: list[dict[str, Any]], limit: int, *, before: str, after: str) -> Page:
    """A page from `limit + 1` rows fetched in the cursor's direction (oldest first for `after`)."""
    more = len(rows) > limit
    rows = rows[:limit]
    page = Page(rows)
    if after and not before:
        rows.reverse()
        page.newer = rows[0]["id"] if more and rows else None
        page.older = rows[-1]["id"] if rows else None
    else:
        page.older = rows[-1]["id"] if more else None
        page.newer = rows[0]["id"] if (before and rows) else None
    return page
