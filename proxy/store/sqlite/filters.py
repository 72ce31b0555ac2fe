"""The browser's filters (store/filters.py) in SQLite's SQL: `where(f)`, each condition the shape an index
of the SQLite schema serves (every single-column index ends in the rowid, store/sqlite/browse.py)."""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.store.filters import Filters, parse_time


def where(f: Filters, now: float | None = None) -> tuple[list[str], list[Any]]:
    """The filters in SQLite's SQL (qmark parameters), each condition the shape an index serves."""
    where, args = f.alike()
    if f.client:  # a prefix: "opencode" matches "opencode/0.4.1 ai-sdk/..."; served by the index
        where.append("e.user_agent >= ? and e.user_agent < ?")
        args += [f.client, f.client + "\U0010ffff"]
    for column, value in (("flags", f.flag), ("tags", f.tag)):
        if value:  # values are identifiers: their quoted JSON form can only match an element
            where.append(f"e.{column} != '[]' and instr(e.{column}, ?) > 0")
            args.append(orjson.dumps(value).decode())
    if f.changes:
        where.append("e.changes_count > 0")
    if f.repairs:
        where.append(
            "e.changes_count > 0 and exists (select 1 from changes c"
            " where c.exchange_id = e.id and c.stage = 'toolcalls')"
        )
    for value, op in ((f.since, ">="), (f.until, "<")):
        if value:
            where.append(f"e.ts {op} ?")
            args.append(parse_time(value, now))
    return where, args
