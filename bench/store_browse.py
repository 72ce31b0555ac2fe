"""Browse latency on a filled store: list, filters, search and id look-up, SQLite and PostgreSQL alike.

Both run the browser's own query functions with the same `Filters`: SQLite proxy/browse/queries.py
(`Store`, `list_exchanges`; search through its sidecar index, built first and timed), PostgreSQL
proxy/browse/pg_queries.py (`PostgresStore`, `list_exchanges`; search on the writer's columns, the
`search` tsvector and `search_text` with pg_trgm). The id-prefix look-up is each store's reader's.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tapfix.proxy.browse.fts import SearchIndex
from tapfix.proxy.browse.queries import Filters, Store, list_exchanges
from tapfix.proxy.store.reader import resolve_id

PAGE = 50
LABELS = (
    "list, first page",
    "list, deep page (keyset, 90% down)",
    "filter by model",
    "filter by flag (0.2%)",
    "filter by session",
    "filter by time range (a 10% slice)",
    "search a word (0.1%)",
    "search a substring (0.1%)",
    "search CJK text (0.1%)",
    "id prefix look-up (14 of 16 chars)",
)


@dataclass
class Probe:
    """What the queries look for, taken from the filled store (the same on both stores)."""

    deep_id: str  # the capture 90% down the list, newest first
    model: str
    flag: str
    session: str
    since: float  # unix seconds: a tenth of the fill's time span
    until: float
    word: str
    substring: str
    cjk: str
    id_prefix: str


def timed(run: Callable[[], int], repeat: int) -> tuple[float, float, float, int]:
    """(first ms, median ms, worst ms of `repeat` more runs, rows)."""
    t = time.perf_counter()
    rows = run()
    first = (time.perf_counter() - t) * 1000
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1000)
    return first, statistics.median(times), max(times), rows


def sqlite_queries(db: Path, p: Probe) -> tuple[dict[str, Callable[[], int]], float, Callable[[], None]]:
    """The browser's own functions on a SQLite store; the seconds its search index took to build."""
    t = time.perf_counter()
    index = SearchIndex(db)
    index.catch_up(batch=2000)
    built = time.perf_counter() - t
    store = Store(db, index)

    def page(**filters: str) -> Callable[[], int]:
        return lambda: len(list_exchanges(store, Filters(**filters), limit=PAGE).rows)

    queries = {
        LABELS[0]: page(),
        LABELS[1]: lambda: len(list_exchanges(store, Filters(), before=p.deep_id, limit=PAGE).rows),
        LABELS[2]: page(model=p.model),
        LABELS[3]: page(flag=p.flag),
        LABELS[4]: page(session=p.session),
        LABELS[5]: page(since=_iso(p.since), until=_iso(p.until)),
        LABELS[6]: page(q=p.word),
        LABELS[7]: page(q=p.substring),  # FTS5 words only: no substring search on SQLite
        LABELS[8]: page(q=p.cjk),
        LABELS[9]: lambda: int(bool(resolve_id(store.conn(), p.id_prefix))),
    }

    def close() -> None:
        store.conn().close()

    return queries, built, close


def pg_queries(dsn: str, p: Probe) -> tuple[dict[str, Callable[[], int]], float, Callable[[], None]]:
    """The browser's own functions on a PostgreSQL store (proxy/browse/pg_queries.py): no index to build,
    search is the writer's columns (the `search` tsvector, `search_text` with pg_trgm)."""
    from tapfix.proxy.browse import pg_queries as browse
    from tapfix.proxy.store.pg.locator import PostgresLocator
    from tapfix.proxy.store.pg.reader import PostgresReader

    store = browse.PostgresStore(PostgresLocator.parse(dsn))
    reader = PostgresReader(dsn)  # the id-prefix look-up (the browser's exchange page resolves it so too)

    def page(**filters: str) -> Callable[[], int]:
        return lambda: len(browse.list_exchanges(store, Filters(**filters), limit=PAGE).rows)

    queries = {
        LABELS[0]: page(),
        LABELS[1]: lambda: len(browse.list_exchanges(store, Filters(), before=p.deep_id, limit=PAGE).rows),
        LABELS[2]: page(model=p.model),
        LABELS[3]: page(flag=p.flag),
        LABELS[4]: page(session=p.session),
        LABELS[5]: page(since=_iso(p.since), until=_iso(p.until)),
        LABELS[6]: page(q=p.word),
        LABELS[7]: page(q=p.substring),
        LABELS[8]: page(q=p.cjk),
        LABELS[9]: lambda: int(bool(reader.resolve_id(p.id_prefix))),
    }

    def close() -> None:
        reader.close()
        store.close()

    return queries, 0.0, close


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()


def measure(queries: dict[str, Callable[[], int]], repeat: int) -> dict[str, tuple[float, float, float, int]]:
    return {label: timed(queries[label], repeat) for label in LABELS}
