"""How one turn's conversation differs from the turn before it, and a message in a line: the session page's.

The conversation itself is read by store/turns.py (the store keeps the same text for search).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from tapfix.proxy.store.turns import text_of


@dataclass
class TurnDelta:
    """How one request's conversation differs from the previous request's in the same session."""

    kept: int  # messages shared with the previous request, in order
    dropped: int  # previous messages no longer present (history rewritten or compacted)
    added: list[Any]


def turn_delta(previous: list[Any] | None, current: list[Any]) -> TurnDelta:
    if previous is None:
        return TurnDelta(0, 0, current)
    kept = 0
    for a, b in zip(previous, current, strict=False):
        if a != b:
            break
        kept += 1
    return TurnDelta(kept, len(previous) - kept, current[kept:])


def summarize(message: Any, limit: int = 600) -> str:
    text = text_of(message, limit * 2)
    if not text and isinstance(message, dict):
        text = orjson.dumps(message).decode()[:limit]
    return text if len(text) <= limit else text[:limit] + "…"
