"""Browse latency on a filled store: list, filters, search and id look-up, SQLite and PostgreSQL alike.

SQLite runs the browser's own query functions (proxy/browse/queries.py: `Store`, `list_exchanges`,
`Filters`; search through its sidecar index, built first and timed). PostgreSQL runs the
PostgresReader where it has the query (list, flag and session filters, id prefix) and SQL on the
columns and indexes the browser's PostgreSQL queries will use elsewhere (model, time range, the
`search` tsvector, `search_text` with pg_trgm). When the browser's PostgreSQL queries land, swap
them in at `PG_QUERIES` (one line per query): the labels stay, so the table stays comparable.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    def iso(ts: float) -> str:
        import datetime

        return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat()

    queries = {
        LABELS[0]: page(),
        LABELS[1]: lambda: len(list_exchanges(store, Filters(), before=p.deep_id, limit=PAGE).rows),
        LABELS[2]: page(model=p.model),
        LABELS[3]: page(flag=p.flag),
        LABELS[4]: page(session=p.session),
        LABELS[5]: page(since=iso(p.since), until=iso(p.until)),
        LABELS[6]: page(q=p.word),
        LABELS[7]: page(q=p.substring),  # FTS5 words only: no substring search on SQLite
        LABELS[8]: page(q=p.cjk),
        LABELS[9]: lambda: int(bool(resolve_id(store.conn(), p.id_prefix))),
    }

    def close() -> None:
        store.conn().close()

    return queries, built, close


def pg_queries(dsn: str, p: Probe) -> tuple[dict[str, Callable[[], int]], float, Callable[[], None]]:
    """PostgresReader and SQL on the search columns (see the module's docstring); no index to build."""
    from tapfix.proxy.store.pg.reader import _LIST, PostgresReader

    reader = PostgresReader(dsn)

    def sql(query: str, *args: Any) -> Callable[[], int]:
        return lambda: len(reader.conn.execute(query.encode(), args).fetchall())

    newest = f"select {_LIST} from exchanges where {{}} order by id desc limit {PAGE}"
    words = "search @@ websearch_to_tsquery('simple', %s)"
    PG_QUERIES = {  # noqa: N806 - the swap point for the browser's PostgreSQL queries
        LABELS[0]: lambda: len(reader.list_captures(limit=PAGE)),
        LABELS[1]: sql(newest.format("id < %s"), p.deep_id),
        LABELS[2]: sql(newest.format("model = %s"), p.model),
        LABELS[3]: lambda: len(reader.list_captures(limit=PAGE, flag=p.flag)),
        LABELS[4]: lambda: len(reader.list_captures(limit=PAGE, session=p.session)),
        LABELS[5]: sql(
            newest.format("started_at >= to_timestamp(%s) and started_at < to_timestamp(%s)"), p.since, p.until
        ),
        LABELS[6]: sql(newest.format(words), p.word),
        LABELS[7]: sql(newest.format("search_text ilike %s"), f"%{p.substring}%"),
        LABELS[8]: sql(newest.format("search_text ilike %s"), f"%{p.cjk}%"),
        LABELS[9]: lambda: int(bool(reader.resolve_id(p.id_prefix))),
    }
    return PG_QUERIES, 0.0, reader.close


def measure(queries: dict[str, Callable[[], int]], repeat: int) -> dict[str, tuple[float, float, float, int]]:
    return {label: timed(queries[label], repeat) for label in LABELS}
