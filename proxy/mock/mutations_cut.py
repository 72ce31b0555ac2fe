"""Defect mutations of issue 31's repair items: a finish sent twice, a call glued into the one before it,
a `max_tokens` turn with a sign that more was coming after its calls, and leaked markup cut by
`max_tokens`. Each is `(rng, wire) -> wire | None`, as in `mutations.py`.

- `finish_repeated` (chat, preserving): a second finish chunk (`stop`) after the turn's finish;
- `glued_call` (every surface, preserving): the next call's name (bare, or a `{"name": …, "arguments": …}`
  object) and arguments appended to a call's arguments, cut into fragments anywhere; the next call is
  gone from the wire. Only where the boundary is the name: both calls' arguments are strict JSON objects
  as sent, and the object form only when its keys are not the first tool's properties;
- `length_after_calls` (every surface, destroying): the turn ends by `max_tokens` with text after its calls
  (what a model that went on writing leaves);
- `leaked_markup_cut` (every surface, destroying): the calls written as a format's markup, as
  `leaked_markup` writes them, cut by `max_tokens` past the first opener, but never where the markup read so
  far is a whole markup of the first calls (a cut between calls no sign shows: the turn looks complete).
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from tapfix.proxy.mock.mutations_leak import PROSE, TAG, THOUGHTS, Text, carried, hostile_pieces, text_events
from tapfix.proxy.mock.mutations_wire import Event, Wire, chat_chunk, ensure_frags, schema_of, split_text, strict_json
from tapfix.proxy.toolcalls.formats import REGISTRY, armed

_AFTER = ("Now I will", "\n\nNext, I", "好的，接下来")
# A tokenizer's special tokens: a model writes each whole, so no max_tokens cut falls inside one.
_SPECIAL = re.compile(r"<\|[^<>\n]*?\|>|<\|\w+>|<\w+\|>|<｜[^<>\n｜]*｜>?|\]<\]\w+\[>\[|\[[A-Z_]+\]|\[unused\d+\]")


# -- a finish sent twice ---------------------------------------------------------------------------
def finish_repeated(rng: random.Random, wire: Wire) -> Wire | None:
    if not wire.calls or wire.events is None:
        return None
    at = next((k for k, ev in enumerate(wire.events) if ev.body and _finish_of(ev.body)), None)
    if at is None:
        return None
    wire.events.insert(at + 1, Event(chat_chunk({}, rng.choice(("stop", "stop", "length")))))
    return wire


def _finish_of(body: dict[str, Any]) -> str | None:
    return next((c.get("finish_reason") for c in body.get("choices") or [] if c.get("finish_reason")), None)


# -- a call glued into the one before it -----------------------------------------------------------
def glued_call(rng: random.Random, wire: Wire) -> Wire | None:
    options = []
    for k in range(len(wire.calls) - 1):
        first, second = wire.calls[k], wire.calls[k + 1]
        if first.as_object or second.as_object:
            continue
        a, b = "".join(ensure_frags(first, rng)), "".join(ensure_frags(second, rng))
        ok_a, value_a = strict_json(a)
        ok_b, value_b = strict_json(b)
        if ok_a and ok_b and isinstance(value_a, dict) and isinstance(value_b, dict):
            options.append((k, a, b))
    if not options:
        return None
    k, a, b = rng.choice(options)
    first, second = wire.calls[k], wire.calls[k + 1]
    own = set((schema_of(wire.turn, first.name).get("properties") or {}).keys())
    if rng.random() < 0.5 and not {"name", "arguments"} <= own:
        glue = json.dumps({"name": second.name, "arguments": json.loads(b)}, ensure_ascii=False)
    else:
        glue = rng.choice(("", " ", "\n")) + second.name + rng.choice(("", " ")) + b
    first.frags = split_text(a + glue, rng, 10)
    first.applied.add("glued_call")
    del wire.calls[k + 1]
    return wire


# -- max_tokens after complete calls ---------------------------------------------------------------
def length_after_calls(rng: random.Random, wire: Wire) -> Wire | None:
    if not wire.calls or wire.events is None:
        return None
    text = rng.choice(_AFTER)
    if wire.surface == "chat":
        at = next((k for k, ev in enumerate(wire.events) if ev.body and _finish_of(ev.body)), None)
        if at is None:
            return None
        wire.events.insert(at, Event(chat_chunk({"content": text})))
        wire.events[at + 1].body["choices"][0]["finish_reason"] = "length"
    elif wire.surface == "responses":
        end = next((k for k, ev in enumerate(wire.events) if ev.name == "response.completed"), None)
        if end is None:
            return None
        position = 1 + max(ev.body.get("output_index", -1) for ev in wire.events if isinstance(ev.body, dict))
        message = _message_item(position, text)
        wire.events[end:end] = _message_events(position, message, text)
        terminal = wire.events[end + len(_message_events(position, message, text))]
        terminal.name = terminal.body["type"] = "response.incomplete"
        response = terminal.body["response"]
        response.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
        response["output"] = [*response.get("output", []), message]
    else:
        end = next((k for k, ev in enumerate(wire.events) if ev.name == "message_delta"), None)
        if end is None:
            return None
        index = 1 + max(ev.body.get("index", -1) for ev in wire.events if isinstance(ev.body, dict))
        wire.events[end:end] = [
            Event(
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
                "content_block_start",
            ),
            Event(
                {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}},
                "content_block_delta",
            ),
            Event({"type": "content_block_stop", "index": index}, "content_block_stop"),
        ]
        wire.events[end + 3].body["delta"]["stop_reason"] = "max_tokens"
    wire.finish = "length"
    return wire


def _message_item(position: int, text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "id": f"msg_after_{position}",
        "type": "message",
        "role": "assistant",
        "status": "incomplete",
        "content": content,
    }


def _message_events(position: int, item: dict[str, Any], text: str) -> list[Event]:
    iid = item["id"]
    where = {"item_id": iid, "output_index": position, "content_index": 0}
    bodies = [
        (
            "response.output_item.added",
            {"output_index": position, "item": {**item, "status": "in_progress", "content": []}},
        ),
        ("response.content_part.added", {**where, "part": {"type": "output_text", "text": "", "annotations": []}}),
        ("response.output_text.delta", {**where, "delta": text}),
        ("response.output_text.done", {**where, "text": text}),
        ("response.content_part.done", {**where, "part": item["content"][0]}),
        ("response.output_item.done", {"output_index": position, "item": item}),
    ]
    return [Event({"type": kind, "sequence_number": 0, **body}, kind) for kind, body in bodies]


# -- leaked markup cut by max_tokens ---------------------------------------------------------------
def leaked_markup_cut(rng: random.Random, wire: Wire) -> Wire | None:
    if not wire.calls or wire.events is not None:
        return None
    if any(s.tokens is not None or s.frags is not None or not isinstance(s.value, dict) for s in wire.calls):
        return None
    calls = [(s.name, s.value) for s in wire.calls]
    order = sorted(REGISTRY)
    rng.shuffle(order)
    for name in order:
        markup = carried(name, calls, wire.turn.tools)
        cut = _cut_point(name, calls, markup, rng) if markup is not None else None
        if markup is not None and cut is not None:
            break
    else:
        return None
    fmt = REGISTRY[name]
    if not fmt.anchored and rng.random() < 0.3:
        parts = [Text("reasoning", hostile_pieces(rng.choice(THOUGHTS) + markup[:cut], rng))]
        where = "reasoning"
    else:
        prose = "" if fmt.anchored else rng.choice(("", wire.turn.content, *PROSE))
        parts = [Text("text", hostile_pieces(prose + markup[:cut], rng))]
        where = "content"
    wire.events = text_events(wire, parts, "length", rng)
    wire.finish = "length"
    for sent in wire.calls:
        sent.applied.add(f"{TAG}{name}:{where}")
    return wire


def _cut_point(name: str, calls: list[tuple[str, Any]], markup: str, rng: random.Random) -> int | None:
    """Where to cut the markup: past its first opener (past its first character, for a format without one),
    never where what is left reads as the whole markup of the first calls."""
    fmt = REGISTRY[name]
    found = armed(name).opener_re.search(markup) if fmt.openers else None  # type: ignore[union-attr]
    start = found.end() if found is not None else len(markup) - len(markup.lstrip()) + 1
    whole = {markup.strip()}
    for k in range(1, len(calls)):
        try:
            whole.add(fmt.render(calls[:k]).strip())
        except ValueError:
            continue
    atomic = [range(m.start() + 1, m.end()) for m in _SPECIAL.finditer(markup)]
    points = [
        k for k in range(start, len(markup)) if markup[:k].strip() not in whole and not any(k in a for a in atomic)
    ]
    return rng.choice(points) if points else None
