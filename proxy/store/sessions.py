"""Group exchanges into agent sessions, so a whole agent run can be shown and replayed turn by turn.

The key is, in order: opencode's `x-session-id`, the Responses API's `prompt_cache_key`, else the
conversation's opening (system prompt + first user turn) from the same client and model — every
later turn of a chat resends that opening unchanged. A session idle for longer than `IDLE_GAP_S`
starts afresh even if the opening repeats (the same prompt run twice is two runs).
"""

from __future__ import annotations

import datetime
import hashlib
import re
import sqlite3
from collections import OrderedDict
from typing import Any

import orjson
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonsplice import SpliceError, array_item_spans, top_level_spans

IDLE_GAP_S = 30 * 60
_PROMPT_CACHE_KEY = re.compile(rb'"prompt_cache_key"\s*:\s*"((?:[^"\\]|\\.){1,200})"')


def _opening(body: bytes) -> bytes | None:
    """The system prompt and the turns up to the first user message, canonical. Only those values are
    parsed: the rest of a megabyte conversation is skipped by span (a full parse cost ~2 ms and ~1 MB of
    Python objects per MB of body, per turn, in the writer)."""
    try:
        spans = top_level_spans(body)
        where = spans.get("messages")
        if where is None or body[where[0]] != 0x5B:
            where = spans.get("input")
            if where is None or body[where[0]] != 0x5B:
                return None
        opening: list[Any] = [orjson.loads(body[slice(*spans["system"])])] if "system" in spans else []
        turns = 0
        for start, end in array_item_spans(body, where[0]):
            message = orjson.loads(body[start:end])
            opening.append(message)
            turns += 1
            if isinstance(message, dict) and message.get("role") == "user":
                break
    except (SpliceError, orjson.JSONDecodeError, IndexError):
        return None
    return orjson.dumps(opening, option=orjson.OPT_SORT_KEYS) if turns else None


def explicit_key(ex: Exchange) -> str | None:
    for name, value in ex.request_headers:
        if name.lower() == "x-session-id" and value:
            return value[:200]
    if ex.session_hint:
        return ex.session_hint
    match = _PROMPT_CACHE_KEY.search(ex.request[:65536]) if b"prompt_cache_key" in ex.request else None
    return match.group(1).decode(errors="replace") if match else None


class SessionTracker:
    """Lives in the writer thread: maps conversation openings to session ids."""

    def __init__(self) -> None:
        self._by_opening: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def assign(self, ex: Exchange) -> str | None:
        key = explicit_key(ex)
        if key:
            return key
        opening = _opening(ex.request) if ex.request[:1] == b"{" else None
        if opening is None:
            return None
        digest = hashlib.sha256(f"{ex.user_agent}\0{ex.model}\0".encode() + opening).hexdigest()[:16]
        known = self._by_opening.get(digest)
        if known is not None and ex.started_at - known[1] < IDLE_GAP_S:
            session_id = known[0]
        else:
            session_id = f"s-{ex.id}"
        self._by_opening[digest] = (session_id, ex.started_at)
        self._by_opening.move_to_end(digest)
        while len(self._by_opening) > 4096:
            self._by_opening.popitem(last=False)
        return session_id

    def record(self, conn: sqlite3.Connection, session_id: str | None, ex: Exchange) -> None:
        if not session_id:
            return
        when = datetime.datetime.fromtimestamp(ex.started_at, datetime.UTC).isoformat(timespec="milliseconds")
        conn.execute(
            "insert into sessions (id, first_at, last_at, user_agent, model, exchanges) values (?, ?, ?, ?, ?, 1)"
            " on conflict(id) do update set last_at = excluded.last_at, exchanges = exchanges + 1",
            (session_id, when, when, ex.user_agent, ex.model),
        )
