"""One agent run, turn by turn: what each request added to the conversation, what it cost, what broke.

A turn's "new messages" are the messages after the longest prefix it shares with the previous
request of the same session; when a turn drops earlier messages (the agent compacted or rewrote its
history) that is shown too, since it explains sudden changes in prompt tokens. The turns come from
the store (`BrowseQueries.load_session`), as it holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.browse.turns import TurnDelta, summarize, turn_delta
from tapfix.proxy.store.pages import SessionTurns
from tapfix.proxy.store.turns import messages_of, parse_json, role_of
from tapfix.proxy.telemetry.answer import usage_counts


@dataclass
class Turn:
    number: int
    row: dict[str, Any]
    delta: TurnDelta | None
    added: list[tuple[str, str]]  # (role, text) of the new messages
    changes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def repairs(self) -> list[dict[str, Any]]:
        return [c for c in self.changes if c["stage"] == "toolcalls"]

    @property
    def cached_tokens(self) -> int | None:
        """Prompt tokens the engine said it served from its prefix cache, beside the turn's prefix break."""
        usage = self.row.get("usage")
        return usage_counts(usage if isinstance(usage, dict) else None).cached


@dataclass
class SessionView:
    session: dict[str, Any]
    turns: list[Turn]
    first_number: int
    later: int | str | None  # the cursor for the next page of turns (SQLite: a rowid; PostgreSQL: an id)
    total: int


def session_view(stored: SessionTurns) -> SessionView:
    """The page from the store's rows (each with its `request` body, None when unreadable) in turn order,
    their change rows, and the request of the turn before the first one."""
    previous = messages_of(parse_json(stored.previous)) if stored.continues else None
    turns = []
    for i, row in enumerate(stored.rows):
        row["flags"] = orjson.loads(row["flags"]) if row["flags"] else []
        row["tool_calls"] = orjson.loads(row["tool_calls"]) if row["tool_calls"] else []
        messages = messages_of(parse_json(row.pop("request")))
        delta = turn_delta(previous, messages) if messages else None
        added = [(role_of(m), summarize(m)) for m in (delta.added if delta else [])][-20:]
        turns.append(Turn(stored.first_number + i, row, delta, added, stored.changes.get(row["id"], [])))
        previous = messages or previous
    return SessionView(stored.session, turns, stored.first_number, stored.later, stored.total)
