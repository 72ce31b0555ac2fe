"""What the browser's queries return (store/backend.py `BrowseQueries`), on every backend: a page of the
list, of sessions, one session's turns, the stats page's numbers (the queries themselves: queries.py).

The same exchanges give the same pages on every backend (tests/unit/test_browse_backends.py). What differs,
and why:

- Order. SQLite lists by `rowid` (write order: the order exchanges completed); PostgreSQL has no
  rowid, and lists by capture id, which sorts by arrival (proxy/ids.py). Both are the newest first,
  and a page cursor (`?before=ID`) is a capture id on both; they differ only where a long request
  completed after a shorter one that arrived later.
- Search. SQLite's sidecar is FTS5 (words, "phrases", `prefix*`); PostgreSQL's matches each term as
  words in the `search` tsvector or as a substring of `search_text` (pg_trgm), so a part of a word
  or of a CJK run is found too.

Every number of the stats page counts client requests: a regeneration attempt (an exchange with
`attempt_of`) is one more upstream request for the same client request, counted apart in `attempts`
only, so a request tapfix regenerated counts once, as its client-facing capture. Decode rate is
completion tokens per second after the first token; when the server reported no usage it falls back
to chunks per second (most engines send one token per chunk).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import orjson

PAGE = 50
TURNS_PAGE = 50


@dataclass
class Page:
    rows: list[dict[str, Any]]
    older: str | None = None  # capture id to pass as ?before=
    newer: str | None = None  # capture id to pass as ?after=
    searched: bool = False
    index_behind: int = 0  # exchanges the search index has not reached yet

    @classmethod
    def of(cls, rows: list[dict[str, Any]], limit: int, before: str, after: str) -> Page:
        """A page from `limit + 1` rows fetched in the cursor's direction (oldest first for `after`)."""
        more = len(rows) > limit
        rows = rows[:limit]
        page = cls(rows)
        if after and not before:
            rows.reverse()
            page.newer = rows[0]["id"] if more and rows else None
            page.older = rows[-1]["id"] if rows else None
        else:
            page.older = rows[-1]["id"] if more else None
            page.newer = rows[0]["id"] if (before and rows) else None
        return page


@dataclass
class SessionPage:
    rows: list[dict[str, Any]] = field(default_factory=list)
    older: str | None = None

    @classmethod
    def of(cls, rows: list[dict[str, Any]], limit: int) -> SessionPage:
        """A page from `limit + 1` sessions, most recently active first."""
        return cls(rows[:limit], rows[limit - 1]["id"] if len(rows) > limit else None)

    def add_totals(self, totals: list[dict[str, Any]]) -> None:
        """Each session's totals over its exchanges (rows with its `session_id`), into its row."""
        by_session = {r["session_id"]: r for r in totals}
        for row in self.rows:
            row.update(by_session.get(row["id"], {}))


def decode_flags(row: dict[str, Any]) -> dict[str, Any]:
    """A listed row's JSON columns (`flags`, `tags`) parsed."""
    for key in ("flags", "tags"):
        if isinstance(row.get(key), str):
            row[key] = orjson.loads(row[key])
    return row


@dataclass
class SessionTurns:
    """One page of an agent run's turns, as stored: the browser makes its session page of it."""

    session: dict[str, Any]  # the `sessions` row (only its id when there is none)
    rows: list[dict[str, Any]]  # the turns in order, each with its `request` body (None when unreadable)
    changes: dict[str, list[dict[str, Any]]]  # each turn's change rows (stage, kind, path, reason), by id
    first_number: int  # the first turn's number in the run
    previous: bytes | None  # the request body of the turn before the first one (None: unreadable)
    continues: bool  # whether there is a turn before the first one
    later: int | str | None  # the cursor for the next page of turns (SQLite: a rowid; PostgreSQL: an id)
    total: int


@dataclass
class Stats:
    """The stats page's numbers. "Lacked sampling parameters" counts two ways: the proxy's
    `no_sampling_params` flag (set at request time), and facts derived from the request bodies
    (SQLite's search sidecar keeps them), because captures written before the flag existed, or by a
    proxy without a sampling policy, lack the flag."""

    total: int = 0  # client requests: a regeneration attempt is counted in `attempts`, not here
    attempts: int = 0  # regeneration attempts tapfix made upstream for those requests (issue 19)
    first: str | None = None
    last: str | None = None
    by_client_model: list[dict[str, Any]] = field(default_factory=list)
    no_sampling_flag: int = 0
    no_sampling_derived: int | None = None  # None: the search index has not run
    derived_over: int = 0
    no_sampling_by_client: list[dict[str, Any]] = field(default_factory=list)
    sampling_changes: list[dict[str, Any]] = field(default_factory=list)
    repairs: list[dict[str, Any]] = field(default_factory=list)
    flags: list[tuple[str, int]] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    decode_rate: list[float] = field(default_factory=list)
    ttft_summary: dict[str, float] = field(default_factory=dict)
    rate_summary: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def summary(values: list[float]) -> dict[str, float]:
        if not values:
            return {}
        ordered = sorted(values)
        return {
            "n": len(ordered),
            "p50": _pct(ordered, 50),
            "p90": _pct(ordered, 90),
            "p99": _pct(ordered, 99),
            "mean": statistics.fmean(ordered),
        }

    def add_timing(self, ttft: float, duration: float | None, tokens: int | None, chunks: int | None) -> None:
        """One answer's time to first token and, when it streamed long enough, its decode rate."""
        self.ttft_ms.append(ttft)
        produced = tokens or chunks
        if duration and produced and duration - ttft > 1:
            self.decode_rate.append(produced / ((duration - ttft) / 1000))

    def summarize(self) -> Stats:
        self.ttft_summary, self.rate_summary = self.summary(self.ttft_ms), self.summary(self.decode_rate)
        return self


def _pct(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
