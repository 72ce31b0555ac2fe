"""The browser's filters (store/filters.py) in PostgreSQL's SQL: `where(f)`, each condition the shape an
index of pg001/pg005 serves (store/pg/schema.py)."""

from __future__ import annotations

import datetime
from typing import Any, Protocol

import orjson
from tapfix.proxy.store.filters import Filters, parse_time

DAY = "(e.started_at at time zone 'UTC')::date"  # the day partition of an exchange's changes and bodies


class Rows(Protocol):
    """A PostgreSQL store's query runner (store/pg/browse.py `PostgresBrowse.rows`)."""

    def rows(self, sql: str, args: list[Any] | tuple[Any, ...] = ()) -> list[dict[str, Any]]: ...


def where(f: Filters, now: float | None = None) -> tuple[list[str], list[Any]]:
    """The filters in PostgreSQL's SQL (qmark parameters), each condition the shape an index serves."""
    clauses, args = f.alike()
    if f.client:  # a prefix, bytewise: the index on (user_agent collate "C", id)
        clauses.append('e.user_agent collate "C" >= ? and e.user_agent collate "C" < ?')
        args += [f.client, f.client + "\U0010ffff"]
    for column, value in (("flags", f.flag), ("tags", f.tag)):
        if value:  # the partial GIN index on (column::jsonb) where column <> '[]'
            clauses.append(f"e.{column} <> '[]' and e.{column}::jsonb @> ?::jsonb")
            args.append(orjson.dumps([value]).decode())
    if f.changes or f.repairs:
        clauses.append("e.changes_count > 0")
    if f.repairs:
        clauses.append(
            f"exists (select 1 from changes c where c.exchange_id = e.id and c.day = {DAY} and c.stage = 'toolcalls')"
        )
    for value, op in ((f.since, ">="), (f.until, "<")):
        if value:  # started_at, not ts: the partition key, so whole days are pruned
            clauses.append(f"e.started_at {op} ?")
            args.append(datetime.datetime.fromtimestamp(parse_time(value, now), datetime.UTC))
    return clauses, args
