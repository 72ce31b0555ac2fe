"""Read a request body as a conversation: what is new in this turn, and what one message says.

Agents resend the whole conversation every turn, so the interesting part of turn N is the messages
after turn N-1's: the last user message and the tool results. The store keeps that text for search
(SQLite's sidecar index, store/sqlite/search_index.py; PostgreSQL's search columns, store/pg/writer.py)
and the browser's session page shows it (browse/turns.py compares turns).
"""

from __future__ import annotations

from typing import Any

import orjson

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


def parse_json(body: bytes | None) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def messages_of(request: Any) -> list[Any]:
    """The conversation of a Chat Completions (`messages`), Responses (`input`) or completion request."""
    if not isinstance(request, dict):
        return []
    for key in ("messages", "input"):
        value = request.get(key)
        if isinstance(value, list):
            return value
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return []


def text_of(value: Any, limit: int = 20000) -> str:
    """The human-readable text inside one message's content (string, list of parts, tool output)."""
    parts: list[str] = []

    def walk(v: Any) -> None:
        if sum(len(p) for p in parts) > limit:
            return
        if isinstance(v, str):
            parts.append(v)
        elif isinstance(v, list):
            for item in v:
                walk(item)
        elif isinstance(v, dict):
            for key in ("text", "content", "output", "input_text", "arguments", "refusal"):
                if key in v:
                    walk(v[key])
            for call in v.get("tool_calls") or []:
                if isinstance(call, dict):
                    fn = call.get("function") or {}
                    parts.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")

    walk(value.get("content") if isinstance(value, dict) and "role" in value else value)
    if isinstance(value, dict) and value.get("tool_calls"):
        walk({"tool_calls": value["tool_calls"]})
    return "\n".join(p for p in parts if p)[:limit]


def role_of(message: Any) -> str:
    if isinstance(message, dict):
        return str(message.get("role") or message.get("type") or "?")
    return "?"


def new_in_turn(messages: list[Any]) -> list[Any]:
    """This turn's own input: the messages after the last assistant message (user text, tool results)."""
    for i in range(len(messages) - 1, -1, -1):
        if role_of(messages[i]) in ("assistant", "function_call", "reasoning"):
            return messages[i + 1 :]
    return messages[-1:] if messages and role_of(messages[-1]) != "system" else messages


def new_turn_text(request: Any) -> str:
    return "\n\n".join(text_of(m) for m in new_in_turn(messages_of(request)))


def search_document(
    messages: list[Any], content: str | None, reasoning: str | None, tool_calls: str | None
) -> tuple[str, str]:
    """What search finds an exchange by, (prompt, answer): the turn's new messages, and the answer's
    text, reasoning and tool calls. SQLite's sidecar index (store/sqlite/search_index.py) and the
    PostgreSQL writer's search columns (store/pg/writer.py) hold the same text."""
    prompt = "\n\n".join(text_of(m) for m in new_in_turn(messages))
    answer = "\n\n".join(t for t in (content, reasoning, _calls_text(tool_calls)) if t)
    return prompt, answer


def _calls_text(tool_calls: str | None) -> str:
    """An exchange's `tool_calls` column (JSON) as `name(arguments)` lines."""
    if not tool_calls:
        return ""
    try:
        calls = orjson.loads(tool_calls)
    except orjson.JSONDecodeError:
        return tool_calls
    return "\n".join(f"{c.get('name')}({c.get('arguments')})" for c in calls if isinstance(c, dict))


def lacks_sampling(request: Any) -> bool | None:
    """True when a JSON request chose none of temperature/top_p/top_k/min_p; None when not a JSON object."""
    if not isinstance(request, dict):
        return None
    return not any(request.get(k) is not None for k in SAMPLING_KEYS)
