"""Reasoning replay on the Responses surface: a `reasoning` input item, put before the items of a reply the
client resent without one (issue 36; the rules of a match are reasoning_replay.py's).

A Responses reply is a run of input items: the assistant's message, its function calls. Only engines that
turn a reasoning input item into the history message's reasoning get one:
- vLLM 0.32 `vllm/entrypoints/openai/responses/utils.py` `_construct_message_from_response_item`: a
  `reasoning` item becomes an assistant message's `reasoning` (from `content[0].text`; `summary` only with
  a warning), and the message and function calls after it merge into that message;
- llama.cpp `tools/server/server-chat.cpp` (the Responses-to-chat conversion): a `reasoning` item with a
  `summary` array and `content[0].text` becomes the message's `reasoning_content`, the items after it merge.
Other engines (SGLang's Responses input handling was not verified) are left as the client sent them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from tapfix.proxy.jsonbody import canonical_arguments
from tapfix.proxy.jsonsplice import SpliceError, top_level_item_spans
from tapfix.proxy.request.reasoning_replay import (
    Call,
    Client,
    Replayed,
    TurnSource,
    matching_turn,
    replayed_change,
    text_of,
)

ITEM_ENGINES = frozenset({"vllm", "llamacpp"})  # engines whose Responses input takes a reasoning item
_CALLS = ("function_call", "custom_tool_call")


def is_reply_item(item: Any) -> bool:
    """An item of the assistant's reply: its message, a function call, a reasoning item."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    return kind in (*_CALLS, "reasoning") or (kind in (None, "message") and item.get("role") == "assistant")


def reply_runs(items: Sequence[Any]) -> list[tuple[int, int]]:
    """(first, past the last) of each run of reply items that more of the conversation follows."""
    runs, start = [], None
    for i, item in enumerate(items):
        if is_reply_item(item):
            start = i if start is None else start
        elif start is not None:
            runs.append((start, i))
            start = None
    return runs


def _sent(items: Sequence[Any]) -> tuple[str, tuple[Call, ...]]:
    text = "".join(text_of(i.get("content")) for i in items if i.get("type") in (None, "message")).strip()
    calls = tuple(
        (
            str(i.get("call_id") or ""),
            str(i.get("name") or ""),
            canonical_arguments(i.get("arguments", i.get("input"))),
        )
        for i in items
        if i.get("type") in _CALLS
    )
    return text, calls


def reasoning_item(capture_id: str, reasoning: str) -> dict[str, Any]:
    """The item both engines read: `content[0].text` the reasoning, `summary` present (llama.cpp needs it)."""
    return {
        "type": "reasoning",
        "id": f"rs_{capture_id}",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": reasoning}],
    }


def replay_responses(
    body: bytes,
    parsed: dict[str, Any],
    source: TurnSource,
    client: Client,
    session: str | None,
    engine: str | None,
) -> Replayed | None:
    """`input` with a reasoning item before each resent reply tapfix answered with reasoning; None: nothing
    changed or missed (or the engine takes no reasoning item). Raises SpliceError when `body` isn't `parsed`."""
    items = parsed.get("input")
    if engine not in ITEM_ENGINES or not isinstance(items, list):
        return None
    runs = [(a, b) for a, b in reply_runs(items) if not any(items[k].get("type") == "reasoning" for k in range(a, b))]
    if not runs:
        return None
    found: Mapping[int, Sequence[Any]] = source.candidates(parsed, "responses", [a for a, _ in runs])
    inserts: list[tuple[int, dict[str, Any]]] = []
    out = Replayed(body, parsed)
    for start, end in runs:
        text, calls = _sent(items[start:end])
        turn = matching_turn(text, calls, start, found.get(start, ()), client, session)
        if turn is None:
            out.missed += 1
            continue
        inserts.append((start, reasoning_item(turn.capture_id, turn.reasoning)))
        out.replayed += 1
        out.changes.append(replayed_change(f"$.input[{start + len(inserts) - 1}]", turn))
    if not inserts:
        return out if out.missed else None
    out.body = _insert_items(body, inserts, parsed)
    new_items = list(items)
    for shift, (index, item) in enumerate(inserts):
        new_items.insert(index + shift, item)
    out.parsed = {**parsed, "input": new_items}
    return out


def _insert_items(body: bytes, inserts: Sequence[tuple[int, dict[str, Any]]], parsed: dict[str, Any]) -> bytes:
    """Each item before the `input` item at its index, joined by the separator the array already uses. `parsed`:
    the body's parse."""
    _, spans = top_level_item_spans(body, ("input",), parsed)
    items = spans.get("input")
    if items is None:
        raise SpliceError("no input array")
    out, pos = [], 0
    for index, item in inserts:
        if not 0 < index < len(items):
            raise SpliceError(f"no item before input[{index}]")
        start = items[index][0]
        separator = body[items[index - 1][1] : start]
        out += [body[pos:start], orjson.dumps(item), separator]
        pos = start
    out.append(body[pos:])
    return b"".join(out)
