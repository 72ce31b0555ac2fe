"""A valid tool-call turn and the wire it goes out on, in the form the defect mutations edit.

A `Turn` is what the model meant: the offered tools (chat-shaped) and the calls with their arguments
as values. A `Wire` is that turn on its way out, in two stages, so that mutations compose without
one breaking the bookkeeping of another:

- before rendering, each call is a `Sent`: its arguments as a value, then as JSON tokens (escape
  mutations rewrite one token's raw text), then as fragments (fragment mutations add, drop and cut);
- `render` turns the calls into the surface's events (chat chunks, Responses or Messages events as
  dicts), each tagged with the call it belongs to, so index, id, name and finish mutations edit the
  events themselves; `serialize` gives the SSE bytes a server would send.

A Responses stream repeats a call's arguments, name and id in `.done`, `output_item.done` and the
final `response.completed`; `serialize` copies them from the deltas and the added item, as a server
that streamed the broken text would.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from tapfix.proxy.mock.chat import dumps
from tapfix.proxy.mock.messages import messages_events
from tapfix.proxy.mock.responses import responses_events
from tapfix.proxy.mock.surface_script import Part, Script

Surface = Literal["chat", "responses", "messages"]
TAG = "\x00call"  # the hidden key of a chat tool-call entry: (call number, role); never serialized
DIGEST = "d" * 64
CREATED = 1_760_000_000
MODEL = "mock-model"


@dataclass(frozen=True, slots=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Turn:
    tools: list[dict[str, Any]]  # chat-shaped: {"type": "function", "function": {name, parameters}}
    calls: list[Call]
    content: str = ""
    source: str = ""  # where the turn came from (a corpus case, the mock, the generator)


@dataclass(slots=True)
class Token:
    """One JSON token of a call's arguments as sent: `raw` is what goes on the wire."""

    kind: Literal["punct", "ws", "string", "scalar"]
    raw: str
    value: Any = None
    key: str | None = None  # for a value: the property it belongs to
    is_key: bool = False
    touched: str = ""  # the escape mutation that rewrote this token (one per token)


@dataclass(slots=True)
class Sent:
    """One call as the server sends it, before the surface's framing."""

    id: str
    name: str
    value: Any  # the arguments as a value (schema mutations edit it)
    separators: tuple[str, str]
    tokens: list[Token] | None = None  # escape mutations edit these
    frags: list[str] | None = None  # fragment mutations edit these
    whole: str = ""  # the text when it was first cut into fragments (what a final flush resends)
    charmap: str = ""  # per character of `whole`: o open quote, c close quote, s string content,
    # k key content, v scalar, p structural, w whitespace, x escape noise between tokens
    as_object: bool = False
    applied: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Event:
    body: Any  # the JSON payload (a dict), or None for `[DONE]`
    name: str = ""  # the SSE event name (Responses, Messages)
    call: int | None = None  # the call it belongs to (Responses, Messages)


@dataclass(slots=True)
class Wire:
    surface: Surface
    turn: Turn
    calls: list[Sent]
    finish: str = "tool_calls"  # chat vocabulary
    events: list[Event] | None = None
    expected_names: list[str] = field(default_factory=list)  # what the client must receive
    unknown: set[int] = field(default_factory=set)  # calls renamed to a tool that isn't offered
    applied: list[str] = field(default_factory=list)

    def copy(self) -> Wire:
        """A copy a mutation may edit (the turn is shared: nothing edits it)."""
        return Wire(
            self.surface,
            self.turn,
            [_copy_sent(c) for c in self.calls],
            self.finish,
            None if self.events is None else [Event(json_copy(e.body), e.name, e.call) for e in self.events],
            list(self.expected_names),
            set(self.unknown),
            list(self.applied),
        )


def json_copy(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, tuples, scalars): copy.deepcopy's memo costs
    more than every mutation together."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value  # str, numbers, None, and the tag tuples (never edited in place)


def _copy_sent(sent: Sent) -> Sent:
    tokens = None if sent.tokens is None else [dataclasses.replace(t) for t in sent.tokens]
    frags = None if sent.frags is None else list(sent.frags)
    return dataclasses.replace(sent, value=json_copy(sent.value), tokens=tokens, frags=frags, applied=set(sent.applied))


def tool_name(tool: dict[str, Any]) -> str:
    fn = tool.get("function")
    return str((fn if isinstance(fn, dict) else tool).get("name") or "")


def tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function")
    schema = (fn if isinstance(fn, dict) else tool).get("parameters")
    return schema if isinstance(schema, dict) else {}


def schema_of(turn: Turn, name: str) -> dict[str, Any]:
    return next((tool_schema(t) for t in turn.tools if tool_name(t) == name), {})


def surface_tools(turn: Turn, surface: Surface) -> list[dict[str, Any]]:
    """The turn's tools as the surface's request offers them."""
    if surface == "chat":
        return turn.tools
    if surface == "responses":
        return [{"type": "function", "name": tool_name(t), "parameters": tool_schema(t)} for t in turn.tools]
    return [{"name": tool_name(t), "input_schema": tool_schema(t)} for t in turn.tools]


def new_wire(surface: Surface, turn: Turn, rng: random.Random) -> Wire:
    seps = rng.choice(((",", ":"), (", ", ": ")))
    calls = [Sent(c.id, c.name, json_copy(c.arguments), seps) for c in turn.calls]
    return Wire(surface, turn, calls, expected_names=[c.name for c in turn.calls])


# -- JSON as tokens ---------------------------------------------------------------------------------
def _string_raw(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def tokenize(value: Any, separators: tuple[str, str]) -> list[Token]:
    comma, colon = separators
    out: list[Token] = []

    def punct(raw: str) -> None:
        out.append(Token("punct", raw[0]))
        if raw[1:]:
            out.append(Token("ws", raw[1:]))

    def emit(v: Any, key: str | None) -> None:
        if isinstance(v, dict):
            out.append(Token("punct", "{"))
            for i, (k, item) in enumerate(v.items()):
                if i:
                    punct(comma)
                out.append(Token("string", _string_raw(k), k, is_key=True))
                punct(colon)
                emit(item, k)
            out.append(Token("punct", "}"))
        elif isinstance(v, list):
            out.append(Token("punct", "["))
            for i, item in enumerate(v):
                if i:
                    punct(comma)
                emit(item, key)
            out.append(Token("punct", "]"))
        elif isinstance(v, str):
            out.append(Token("string", _string_raw(v), v, key))
        else:
            out.append(Token("scalar", json.dumps(v), v, key))

    emit(value, None)
    return out


def ensure_tokens(sent: Sent) -> list[Token]:
    if sent.tokens is None:
        sent.tokens = tokenize(sent.value, sent.separators)
    return sent.tokens


def _charmap(tokens: list[Token]) -> str:
    parts: list[str] = []
    for t in tokens:
        if t.kind == "string":
            inner = "k" if t.is_key else "s"
            parts.append("o" + inner * (len(t.raw) - 2) + "c")
        elif t.kind == "scalar":
            parts.append("v" * len(t.raw))
        elif t.kind == "punct":
            parts.append("p")
        else:
            parts.append(("x" if "\\" in t.raw else "w") * len(t.raw))
    return "".join(parts)


def split_text(text: str, rng: random.Random, most: int = 8) -> list[str]:
    """`text` in 1 to `most` fragments, cut at random points."""
    if len(text) < 2:
        return [text]
    count = rng.randint(1, min(most, len(text)))
    cuts = sorted(rng.sample(range(1, len(text)), count - 1))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def ensure_frags(sent: Sent, rng: random.Random) -> list[str]:
    if sent.frags is None:
        tokens = ensure_tokens(sent)
        sent.whole = "".join(t.raw for t in tokens)
        sent.charmap = _charmap(tokens)
        sent.frags = split_text(sent.whole, rng)
    return sent.frags


def strict_json(text: str) -> tuple[bool, Any]:
    try:
        return True, json.loads(text)
    except ValueError:
        return False, None


# -- rendering ------------------------------------------------------------------------------------
def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-defects",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def _content_pieces(text: str, rng: random.Random) -> list[str]:
    return split_text(text, rng, 3) if text else []


def _render_chat(wire: Wire, rng: random.Random) -> list[Event]:
    events = [Event(chat_chunk({"role": "assistant", "content": ""}))]
    events += [Event(chat_chunk({"content": p})) for p in _content_pieces(wire.turn.content, rng)]
    for k, sent in enumerate(wire.calls):
        frags = ensure_frags(sent, rng)
        opening: dict[str, Any] = {
            "id": sent.id,
            "type": "function",
            "index": k,
            "function": {"name": sent.name, "arguments": ""},
            TAG: (k, "open"),
        }
        if sent.as_object:
            value = json.loads("".join(frags))
            if rng.random() < 0.5:
                opening["function"]["arguments"] = value
                events.append(Event(chat_chunk({"tool_calls": [opening]})))
                continue
            events.append(Event(chat_chunk({"tool_calls": [opening]})))
            entry = {"index": k, "function": {"arguments": value}, TAG: (k, "args")}
            events.append(Event(chat_chunk({"tool_calls": [entry]})))
            continue
        events.append(Event(chat_chunk({"tool_calls": [opening]})))
        for frag in frags:
            entry = {"index": k, "function": {"arguments": frag}, TAG: (k, "args")}
            events.append(Event(chat_chunk({"tool_calls": [entry]})))
    events.append(Event(chat_chunk({}, wire.finish)))
    events.append(Event(None))
    return events


def _script(wire: Wire, rng: random.Random) -> Script:
    parts: list[Part] = []
    if wire.turn.content:
        parts.append(Part("text", _content_pieces(wire.turn.content, rng)))
    for sent in wire.calls:
        parts.append(Part("call", list(ensure_frags(sent, rng)), sent.id, sent.name))
    tokens = sum(len(p.pieces) for p in parts)
    return Script(parts, wire.finish, tokens)


def _parse_events(raw: list[bytes], calls_from: int) -> list[Event]:
    """The mock's bytes as events; a call's tag is its part's position past the text part."""
    out: list[Event] = []
    for event in raw:
        head, _, data = event.partition(b"\ndata: ")
        body = json.loads(data)
        where = body.get("output_index", body.get("index"))
        call = where - calls_from if isinstance(where, int) and where >= calls_from else None
        out.append(Event(body, head.removeprefix(b"event: ").decode(), call))
    return out


def render(wire: Wire, rng: random.Random) -> list[Event]:
    """The events of the wire (rendered once: later mutations edit them)."""
    if wire.events is None:
        if wire.surface == "chat":
            wire.events = _render_chat(wire, rng)
        else:
            script = _script(wire, rng)
            first = 1 if wire.turn.content else 0
            if wire.surface == "responses":
                req = {"tools": surface_tools(wire.turn, "responses")}
                raw = responses_events(script, req, DIGEST, CREATED, MODEL, 10)
            else:
                raw = messages_events(script, DIGEST, MODEL, 10)
            wire.events = _parse_events(raw, first)
    return wire.events


# -- serializing ----------------------------------------------------------------------------------
def _strip_tags(body: Any) -> Any:
    out = copy.copy(body)
    choices = []
    for choice in out.get("choices") or []:
        delta = choice.get("delta") or {}
        if "tool_calls" in delta:
            entries = [{k: v for k, v in e.items() if k != TAG} for e in delta["tool_calls"]]
            choice = {**choice, "delta": {**delta, "tool_calls": entries}}
        choices.append(choice)
    out["choices"] = choices
    return out


def _sync_responses(events: list[Event]) -> None:
    """Copy each call's streamed arguments, name and id into the events that repeat them."""
    deltas: dict[int, list[str]] = {}
    items: dict[int, dict[str, Any]] = {}
    for ev in events:
        if ev.call is None:
            continue
        if ev.name == "response.output_item.added":
            items[ev.call] = ev.body["item"]
        elif ev.name == "response.function_call_arguments.delta":
            deltas.setdefault(ev.call, []).append(ev.body["delta"])

    def fill(item: dict[str, Any], call: int) -> None:
        added = items.get(call, {})
        item["arguments"] = "".join(deltas.get(call, []))
        for key in ("name", "call_id"):
            if key in added:
                item[key] = added[key]
            else:
                item.pop(key, None)

    for ev in events:
        if ev.name == "response.function_call_arguments.done" and ev.call is not None:
            ev.body["arguments"] = "".join(deltas.get(ev.call, []))
            ev.body["name"] = items.get(ev.call, {}).get("name", ev.body.get("name"))
        elif ev.name == "response.output_item.done" and ev.call is not None:
            fill(ev.body["item"], ev.call)
        elif ev.name in ("response.completed", "response.incomplete"):
            calls = [i for i in ev.body["response"]["output"] if i.get("type") == "function_call"]
            for call, item in zip(sorted(items), calls, strict=False):
                fill(item, call)


def serialize(wire: Wire, rng: random.Random) -> bytes:
    events = render(wire, rng)
    if wire.surface == "chat":
        out = [
            b"data: [DONE]\n\n" if ev.body is None else b"data: " + dumps(_strip_tags(ev.body)) + b"\n\n"
            for ev in events
        ]
        return b"".join(out)
    if wire.surface == "responses":
        _sync_responses(events)
    return b"".join(b"event: " + ev.name.encode() + b"\ndata: " + dumps(ev.body) + b"\n\n" for ev in events)
