"""Browse latency on a filled store: list, filters, search and id look-up, SQLite and PostgreSQL alike.

Both run the browser's own queries (the store's `BrowseQueries`, proxy/store/backend.py) with the same
`Filters`: on SQLite, search goes through its sidecar index, built first and timed (proxy/store/sqlite/
search_index.py); on PostgreSQL through the writer's columns, the `search` tsvector and `search_text`
with pg_trgm (proxy/store/pg/browse.py). The id-prefix look-up is each store's reader's.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from tapfix.proxy.store.filters import Filters
from tapfix.proxy.store.locator import StoreLocator

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


def queries(db: str, p: Probe) -> tuple[dict[str, Callable[[], int]], float, Callable[[], None]]:
    """The browser's own queries on the store `db` (a SQLite path or a postgresql:// URL); the seconds its
    search index took to build (SQLite's sidecar; PostgreSQL has none to build)."""
    store = StoreLocator.resolve(db, postgres=True).backend()
    t = time.perf_counter()
    browse = store.browse(background=False)
    browse.catch_up()
    built = time.perf_counter() - t
    reader = store.reader()  # the id-prefix look-up (the browser's exchange page resolves it so too)

    def page(**filters: str) -> Callable[[], int]:
        return lambda: len(browse.list_exchanges(Filters(**filters), limit=PAGE).rows)

    queries = {
        LABELS[0]: page(),
        LABELS[1]: lambda: len(browse.list_exchanges(Filters(), before=p.deep_id, limit=PAGE).rows),
        LABELS[2]: page(model=p.model),
        LABELS[3]: page(flag=p.flag),
        LABELS[4]: page(session=p.session),
        LABELS[5]: page(since=_iso(p.since), until=_iso(p.until)),
        LABELS[6]: page(q=p.word),
        LABELS[7]: page(q=p.substring),  # FTS5 words only: no substring search on SQLite
        LABELS[8]: page(q=p.cjk),
        LABELS[9]: lambda: int(bool(reader.resolve_id(p.id_prefix))),
    }

    def close() -> None:
        reader.close()
        browse.close()

    return queries, built, close


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()


def measure(queries: dict[str, Callable[[], int]], repeat: int) -> dict[str, tuple[float, float, float, int]]:
    return {label: timed(queries[label], repeat) for label in LABELS}
