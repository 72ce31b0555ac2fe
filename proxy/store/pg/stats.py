"""The stats page's numbers (store/pages.py `Stats`) in PostgreSQL's SQL, `where` from store/pg/filters.py.

One number SQLite's page has and this one lacks: "lacked sampling parameters, derived from the
request bodies" comes from SQLite's search sidecar, which PostgreSQL has no need of; the count from
the proxy's `no_sampling_params` flag is shown on both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tapfix.proxy.store.filters import ERRORS
from tapfix.proxy.store.pages import Stats
from tapfix.proxy.store.pg.filters import DAY, Rows, where
from tapfix.proxy.store.pg.reader import iso

if TYPE_CHECKING:
    from tapfix.proxy.store.filters import Filters


def compute_stats(store: Rows, f: Filters) -> Stats:
    clauses, args = where(f)
    clauses = [*clauses, "e.attempt_of is null"]  # every number is about client requests
    cond = " where " + " and ".join(clauses)
    also = " and " + " and ".join(clauses)
    s = Stats()
    s.attempts = store.rows(
        f"select count(*) as n from exchanges a where a.attempt_of in (select e.id from exchanges e{cond})", args
    )[0]["n"]
    totals = f"select count(*) as n, min(started_at) as a, max(started_at) as b from exchanges e{cond}"
    row = store.rows(totals, args)[0]
    s.total = row["n"]
    s.first, s.last = iso(row["a"]), iso(row["b"])
    s.by_client_model = store.rows(
        "select e.user_agent as client, e.model as model, count(*) as requests,"
        f" count(*) filter (where {ERRORS}) as errors,"
        " count(*) filter (where e.changes_count > 0) as changed, avg(e.first_token_ms) as ttft_ms,"
        " sum(e.prompt_tokens) as prompt_tokens, sum(e.completion_tokens) as completion_tokens"
        f" from exchanges e{cond} group by 1, 2 order by 3 desc limit 200",
        args,
    )
    s.no_sampling_flag = store.rows(
        "select count(*) as n from exchanges e"
        f""" where e.flags <> '[]' and e.flags::jsonb @> '["no_sampling_params"]'::jsonb{also}""",
        args,
    )[0]["n"]
    joined = f"from changes c join exchanges e on e.id = c.exchange_id and c.day = {DAY}"
    s.sampling_changes = store.rows(
        f"select c.kind, c.path, count(*) as n {joined} where c.stage = 'sampling'{also}"
        " group by 1, 2 order by 3 desc limit 50",
        args,
    )
    s.repairs = store.rows(
        "select c.kind as defect, count(*) as changes, count(distinct c.exchange_id) as exchanges"
        f" {joined} where c.stage = 'toolcalls'{also} group by 1 order by 2 desc",
        args,
    )
    s.flags = [
        (r["v"], r["n"])
        for r in store.rows(
            "select v, count(*) as n from exchanges e, json_array_elements_text(e.flags::json) v"
            f" where e.flags <> '[]'{also} group by 1 order by 2 desc",
            args,
        )
    ]
    for r in store.rows(
        "select e.first_token_ms as ttft, e.duration_ms as duration, e.completion_tokens as tokens,"
        f" e.chunk_count as chunks from exchanges e where e.first_token_ms is not null{also}",
        args,
    ):
        s.add_timing(r["ttft"], r["duration"], r["tokens"], r["chunks"])
    return s.summarize()
