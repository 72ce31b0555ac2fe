"""One agent run, turn by turn: what each request added to the conversation, what it cost, what broke.

A turn's "new messages" are the messages after the longest prefix it shares with the previous
request of the same session; when a turn drops earlier messages (the agent compacted or rewrote its
history) that is shown too, since it explains sudden changes in prompt tokens.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.browse.fts import BodyCache
from tapfix.proxy.browse.turns import TurnDelta, messages_of, parse_json, role_of, summarize, turn_delta

TURNS_PAGE = 50


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


@dataclass
class SessionView:
    session: dict[str, Any]
    turns: list[Turn]
    first_number: int
    later: int | str | None  # the cursor for the next page of turns (SQLite: a rowid; PostgreSQL: an id)
    total: int


def load_session(
    conn: sqlite3.Connection, session_id: str, *, after: int = 0, limit: int = TURNS_PAGE
) -> SessionView | None:
    """SQLite's session page; `after`: the rowid cursor of the page before (0: from the first turn)."""
    session = conn.execute("select * from sessions where id = ?", (session_id,)).fetchone()
    total = conn.execute("select count(*) from exchanges where session_id = ?", (session_id,)).fetchone()[0]
    if session is None and not total:
        return None
    info = dict(session) if session is not None else {"id": session_id}
    rows = [
        dict(r)
        for r in conn.execute(
            "select rowid as rid, id, started_at, status, model, user_agent, request_body_id, prompt_tokens,"
            " completion_tokens, first_token_ms, duration_ms, changes_count, flags, finish_reason, error,"
            " substr(content, 1, 400) as content_start, tool_calls"
            " from exchanges where session_id = ? and rowid > ? order by rowid limit ?",
            (session_id, after, limit + 1),
        )
    ]
    later = rows[limit - 1]["rid"] if len(rows) > limit else None
    rows = rows[:limit]
    earlier = conn.execute(
        "select count(*) from exchanges where session_id = ? and rowid <= ?", (session_id, after)
    ).fetchone()[0]
    bodies = BodyCache(conn)
    previous: list[Any] | None = None
    if after:
        prev = conn.execute(
            "select request_body_id from exchanges where session_id = ? and rowid <= ? order by rowid desc limit 1",
            (session_id, after),
        ).fetchone()
        previous = messages_of(parse_json(bodies.get(prev[0]))) if prev else None
    changes = _changes_of(conn, [r["id"] for r in rows])
    for row in rows:
        row["request"] = bodies.get(row["request_body_id"])
    return session_view(info, rows, changes, first_number=1 + earlier, previous=previous, later=later, total=total)


def session_view(
    info: dict[str, Any],
    rows: list[dict[str, Any]],
    changes: dict[str, list[dict[str, Any]]],
    *,
    first_number: int,
    previous: list[Any] | None,
    later: int | str | None,
    total: int,
) -> SessionView:
    """The page from one backend's rows (each with its `request` body, None when unreadable) in turn
    order, their change rows, and the messages of the turn before the first one (None: none)."""
    turns = []
    for i, row in enumerate(rows):
        row["flags"] = orjson.loads(row["flags"]) if row["flags"] else []
        row["tool_calls"] = orjson.loads(row["tool_calls"]) if row["tool_calls"] else []
        messages = messages_of(parse_json(row.pop("request")))
        delta = turn_delta(previous, messages) if messages else None
        added = [(role_of(m), summarize(m)) for m in (delta.added if delta else [])][-20:]
        turns.append(Turn(first_number + i, row, delta, added, changes.get(row["id"], [])))
        previous = messages or previous
    return SessionView(info, turns, first_number, later, total)


def _changes_of(conn: sqlite3.Connection, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    if not ids:
        return out
    marks = ",".join("?" * len(ids))
    for r in conn.execute(
        f"select exchange_id, stage, kind, path, reason from changes"
        f" where exchange_id in ({marks}) order by exchange_id, seq",
        ids,
    ):
        out.setdefault(r[0], []).append({"stage": r[1], "kind": r[2], "path": r[3], "reason": r[4]})
    return out
