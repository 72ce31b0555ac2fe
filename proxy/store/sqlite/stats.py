"""The stats page's numbers (store/pages.py `Stats`) in SQLite's SQL, `where` from store/sqlite/filters.py.

"Lacked sampling parameters, derived from the request bodies" comes from the search sidecar's facts
(store/sqlite/search_index.py), attached to the connection as `fts` when search is on.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from tapfix.proxy.store.filters import ERRORS
from tapfix.proxy.store.pages import Stats
from tapfix.proxy.store.sqlite.filters import where as sqlite_where
from tapfix.proxy.store.sqlite.reader import has_attempts

if TYPE_CHECKING:
    from tapfix.proxy.store.filters import Filters


def compute_stats(conn: sqlite3.Connection, f: Filters, *, indexed: bool) -> Stats:
    """`indexed`: the search sidecar is attached as `fts` (its facts count what the flag missed)."""
    where, args = sqlite_where(f)
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
    if indexed:
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
        s.add_timing(ttft, duration, tokens, chunks)
    return s.summarize()
