"""The `choices` table: one row per `choices[i].index` of an answer with more than one (`n > 1`).

The exchange row (and `exchange_view`) holds choice 0; an answer with one choice has no rows here
(the exchange row is that choice), so the common case stores nothing twice. Each row's flags are
that choice's own (`empty_answer` for choice 2 alone); the exchange's flags are their union.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from tapfix.proxy.assemble import Assembled

if TYPE_CHECKING:
    from tapfix.proxy.store.sql_executor import Executes

_COLUMNS = 'exchange_id, "index", content, reasoning, tool_calls, finish_reason, flags'


def write_choices(
    conn: Executes, exchange_id: str, assembled: Assembled, store_bodies: bool, extra: dict[str, Any] | None = None
) -> None:
    """In the writer's transaction, after the exchange row; a rewritten exchange (a replay stored
    again under its id) replaces its rows. `extra`: the backend's columns of every row (a day)."""
    if not assembled.choices:
        return
    extra = extra or {}
    conn.execute("delete from choices where exchange_id = ?", (exchange_id,))
    columns = "".join(f", {name}" for name in extra)
    marks = ", ?" * (7 + len(extra))
    conn.executemany(
        f"insert into choices ({_COLUMNS}{columns}) values ({marks[2:]})",
        [
            (
                exchange_id,
                c.index,
                c.content if store_bodies else None,
                c.reasoning if store_bodies else None,
                orjson.dumps(c.tool_calls).decode() if store_bodies else None,
                c.finish_reason,
                orjson.dumps(sorted(c.flags)).decode(),
                *extra.values(),
            )
            for c in assembled.choices
        ],
    )


CHOICE_COLUMNS = '"index", content, reasoning, tool_calls, finish_reason, flags'


def choice_row(r: Any) -> dict[str, Any]:
    """A `choices` row (`CHOICE_COLUMNS`, by position) as `captures show` gives it, on either backend."""
    return {
        "index": r[0],
        "content": r[1],
        "reasoning": r[2],
        "tool_calls": orjson.loads(r[3]) if r[3] else [],
        "finish_reason": r[4],
        "flags": orjson.loads(r[5]) if r[5] else [],
    }
