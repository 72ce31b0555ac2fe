"""Numbers for the stats page: who sends what, what tapfix had to fix, how fast the models answer.

"Lacked sampling parameters" counts two ways: the proxy's `no_sampling_params` flag (set at request
time), and the search sidecar's facts (derived from the request body by the indexer), because
captures written before the flag existed, or by a proxy without a sampling policy, lack the flag.
Decode rate is completion tokens per second after the first token; when the server reported no
usage it falls back to chunks per second (most engines send one token per chunk).

Every number counts client requests: a regeneration attempt (an exchange with `attempt_of`) is one
more upstream request for the same client request, counted apart in `attempts` only, so a request
tapfix regenerated counts once, as its client-facing capture.
"""

from __future__ import annotations

import sqlite3
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tapfix.proxy.browse.filters import ERRORS
from tapfix.proxy.store.reader import has_attempts

if TYPE_CHECKING:
    from tapfix.proxy.browse.filters import Filters
    from tapfix.proxy.browse.fts import SearchIndex


class SqliteSource(Protocol):
    """What SQLite's `compute_stats` reads: the browser's `Store` (queries.py)."""

    index: SearchIndex | None

    def conn(self) -> sqlite3.Connection: ...


@dataclass
class Stats:
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


def _pct(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def compute_stats(store: SqliteSource, f: Filters) -> Stats:
    conn = store.conn()
    where, args = f.where()
    s = Stats()
    if has_attempts(conn):
        where = [*where, "e.attempt_of is null"]  # every number is about client requests
        s.attempts = conn.execute(
            "select count(*) from exchanges a where a.attempt_of in"
            f" (select e.id from exchanges e where {' and '.join(where)})",
            args,
        ).fetchone()[0]
    cond = " where " + " and ".join(where) if where else ""
    also = " and " + " and ".join(where) if where else ""
    s.total, s.first, s.last = conn.execute(
        f"select count(*), min(started_at), max(started_at) from exchanges e{cond}", args
    ).fetchone()
    s.by_client_model = [
        dict(r)
        for r in conn.execute(
            "select e.user_agent as client, e.model as model, count(*) as requests,"
            f" sum({ERRORS}) as errors,"
            " sum(e.changes_count > 0) as changed, avg(e.first_token_ms) as ttft_ms,"
            " sum(e.prompt_tokens) as prompt_tokens, sum(e.completion_tokens) as completion_tokens"
            f" from exchanges e{cond} group by 1, 2 order by 3 desc limit 200",
            args,
        )
    ]
    s.no_sampling_flag = conn.execute(
        "select count(*) from exchanges e"
        f" where e.flags != '[]' and instr(e.flags, '\"no_sampling_params\"') > 0{also}",
        args,
    ).fetchone()[0]
    if store.index is not None:
        row = conn.execute(
            f"select count(f.lacks_sampling), sum(f.lacks_sampling) from fts.facts f"
            f" join exchanges e on e.rowid = f.rowid{cond}",
            args,
        ).fetchone()
        s.derived_over, s.no_sampling_derived = row[0], row[1] or 0
        s.no_sampling_by_client = [
            dict(r)
            for r in conn.execute(
                "select e.user_agent as client, count(f.lacks_sampling) as requests,"
                " sum(f.lacks_sampling) as lacking from fts.facts f join exchanges e on e.rowid = f.rowid"
                f"{cond} group by 1 order by 3 desc limit 50",
                args,
            )
        ]
    s.sampling_changes = [
        dict(r)
        for r in conn.execute(
            "select c.kind, c.path, count(*) as n from changes c join exchanges e on e.id = c.exchange_id"
            f" where c.stage = 'sampling'{also} group by 1, 2 order by 3 desc limit 50",
            args,
        )
    ]
    s.repairs = [
        dict(r)
        for r in conn.execute(
            "select c.kind as defect, count(*) as changes, count(distinct c.exchange_id) as exchanges"
            " from changes c join exchanges e on e.id = c.exchange_id"
            f" where c.stage = 'toolcalls'{also} group by 1 order by 2 desc",
            args,
        )
    ]
    s.flags = [
        (r[0], r[1])
        for r in conn.execute(
            f"select j.value, count(*) from exchanges e, json_each(e.flags) j where e.flags != '[]'{also}"
            " group by 1 order by 2 desc",
            args,
        )
    ]
    for ttft, duration, tokens, chunks in conn.execute(
        "select e.first_token_ms, e.duration_ms, e.completion_tokens, e.chunk_count from exchanges e"
        f" where e.first_token_ms is not null{also}",
        args,
    ):
        s.ttft_ms.append(ttft)
        produced = tokens or chunks
        if duration and produced and duration - ttft > 1:
            s.decode_rate.append(produced / ((duration - ttft) / 1000))
    s.ttft_summary, s.rate_summary = s.summary(s.ttft_ms), s.summary(s.decode_rate)
    return s
