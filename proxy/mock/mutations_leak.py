"""The leak mutation and its decoys: a valid turn's calls written as a model family's own markup
(`fmt.render(calls)`, every format of the registry `tapfix.proxy.toolcalls.formats`) into the text
instead of the structured wire, as a server without the right tool parser sends them.

`leaked_markup` (information-preserving) removes the calls from the structured wire (no tool_calls
deltas, function_call items or tool_use blocks) and writes the markup either into the content (chat
`delta.content`, Responses `output_text`, a Messages `text` block), after optional prose unless the
format is marker-less (`anchored`: only valid at the start of the content), or into the reasoning
field (chat `reasoning_content` / `reasoning`, Responses reasoning text, a Messages `thinking` block)
as the last thing of the turn, the one place markup there is a call. The text goes out in deltas cut
at hostile points: inside every marker of any registered format and next to multi-byte characters.
The finish says tool calls, as the original turn did, or `stop` / `end_turn`, as a server without a
parser sends it.

A format carries a turn only when its markup says the calls uniquely: its render doesn't raise
ValueError, a format that writes no name gets a turn offering exactly one tool, and the format's own
reading of what it rendered (pinned, `Formats.find`, XML-style values typed by the offered schema) is
the original calls. A format that can't is skipped for that turn, like a mutation that doesn't apply.

Decoys (`decoy_wire`) are the same markup where it is no call: inside a closed `<think>…</think>` of
the content, inside inline code, in the reasoning with content after it, naming a tool that isn't
offered, or as an example in prose (`mutations_prose.CONTAINERS`: the middle of a sentence, quotes, a
list item, a table cell, a blockquote, `<pre>`, an indented code block, a fence...). They must pass
byte for byte.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Final, Literal

from tapfix.proxy.mock.messages import messages_events
from tapfix.proxy.mock.mutations_prose import CONTAINERS, in_container
from tapfix.proxy.mock.mutations_text import same_value
from tapfix.proxy.mock.mutations_wire import (
    CREATED,
    DIGEST,
    MODEL,
    Event,
    Turn,
    Wire,
    _parse_events,  # the same reading of the mock's bytes the ordinary renderer uses
    chat_chunk,
    surface_tools,
    tool_name,
)
from tapfix.proxy.mock.responses import responses_events
from tapfix.proxy.mock.surface_script import Part, Script
from tapfix.proxy.toolcalls.defects import UNKNOWN_TOOL
from tapfix.proxy.toolcalls.formats import REGISTRY, ToolFormat, armed
from tapfix.proxy.toolcalls.formats.base import typed_calls
from tapfix.proxy.toolcalls.names import match_name

Where = Literal["content", "reasoning"]
DecoyKind = str  # one of DECOY_KINDS
# The markup inside a closed think, inline code, the reasoning followed by content, a name not offered,
# and an example in each container of prose.
DECOY_KINDS: Final[tuple[DecoyKind, ...]] = (
    "think",
    "inline_code",
    "reasoning_then_content",
    "unoffered_name",
    *CONTAINERS,
)
FORMATS: Final[tuple[str, ...]] = tuple(sorted(REGISTRY))
TAG: Final = "leak:"  # a leaked call's Sent.applied holds "leak:<format>:<where>"

PROSE: Final = ("Let me check.\n", "好的，我来查一下。\n", "Sure — calling the tool now.\n\n", "Reading it: ")
THOUGHTS: Final = ("The user wants this done. I'll call the tool.\n", "需要调用工具。\n", "")
_PROBE: Final = "zq_probe_tool"


@dataclass(frozen=True, slots=True)
class Leak:
    fmt: str
    where: Where


def leak_of(wire: Wire) -> Leak | None:
    """Which format and field the wire's calls leaked into (None: they didn't)."""
    for sent in wire.calls:
        for tag in sent.applied:
            if tag.startswith(TAG):
                fmt, where = tag[len(TAG) :].rsplit(":", 1)
                return Leak(fmt, "reasoning" if where == "reasoning" else "content")
    return None


# -- what a format carries --------------------------------------------------------------------------
@cache
def writes_no_name(name: str) -> bool:
    """The format's markup carries no tool name (only valid when exactly one tool is offered)."""
    fmt = REGISTRY[name]
    for args in ({}, {"a": 1}):
        try:
            return _PROBE not in fmt.render([(_PROBE, args)])
        except ValueError:
            continue
    return False


def starts_with_opener(fmt: ToolFormat, markup: str) -> bool:
    return markup.lstrip().startswith(fmt.openers) if fmt.openers else False


def typed(calls: list[tuple[str, Any]], tools: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Calls as a format reads them, with XML-style values typed by the offered schema and JSON text read."""
    return [(str(name), args) for name, args in typed_calls(list(calls), tools)]


def carried(name: str, calls: list[tuple[str, dict[str, Any]]], tools: list[dict[str, Any]]) -> str | None:
    """The markup of format `name` for `calls`, when it says them uniquely (None: it can't carry them)."""
    fmt = REGISTRY[name]
    offered = [tool_name(t) for t in tools]
    if writes_no_name(name) and len(offered) != 1:
        return None
    try:
        markup = fmt.render(calls)
    except ValueError:
        return None
    found = armed(name).find(markup, offered)
    if found is None or not found.confirmed:
        return None
    try:
        read = typed(found.calls, tools)
    except ValueError:
        return None
    same = len(read) == len(calls) and all(
        n == m and same_value(a, b) for (n, a), (m, b) in zip(read, calls, strict=True)
    )
    return markup if same else None


def _region(name: str, markup: str, offered: list[str]) -> str:
    """The part of a format's render its reader reads (without the text around it a template writes)."""
    calls = armed(name).place(markup, offered).calls
    return markup[calls[0].markup.start : calls[-1].markup.end].strip() if calls else markup


def narrowed(turn: Turn) -> Turn | None:
    """The turn offering only the one tool all its calls name (a format without names can carry it)."""
    names = {c.name for c in turn.calls}
    if len(names) != 1:
        return None
    tools = [t for t in turn.tools if tool_name(t) in names]
    return Turn(tools[:1], turn.calls, turn.content, turn.source + " (one tool)") if tools else None


# -- hostile deltas ---------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _markers() -> tuple[str, ...]:
    """Every registered opener, and the multi-character tokens formats end their markup with."""
    found = {o for f in REGISTRY.values() for o in f.openers if len(o) > 1}
    return tuple(sorted(found, key=len, reverse=True))


def small_pieces(text: str, rng: random.Random) -> list[str]:
    """`text` cut into deltas of 1 to 6 characters: every marker is split somewhere."""
    out, pos = [], 0
    while pos < len(text):
        step = rng.randint(1, 6)
        out.append(text[pos : pos + step])
        pos += step
    return out


def hostile_pieces(text: str, rng: random.Random) -> list[str]:
    """`text` in deltas cut at random points, inside every registered marker it holds and next to
    multi-byte characters; a quarter of the time in deltas of 1 to 6 characters."""
    if len(text) < 2:
        return [text]
    if rng.random() < 0.25:
        return small_pieces(text, rng)
    cuts = set(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8))))
    for marker in _markers():
        at = text.find(marker)
        while at >= 0:
            cuts.add(at + rng.randint(1, len(marker) - 1))
            at = text.find(marker, at + len(marker))
    wide = [i for i, ch in enumerate(text) if ord(ch) > 0x7F]
    for i in rng.sample(wide, min(len(wide), 3)):
        cuts.add(i + rng.randint(0, 1))
    points = sorted(c for c in cuts if 0 < c < len(text))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


# -- rendering the text-only turn -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Text:
    """What one text field of the turn carries, in delta order."""

    kind: Literal["reasoning", "text"]
    pieces: list[str]


def text_events(wire: Wire, parts: list[Text], finish: str, rng: random.Random) -> list[Event]:
    """The surface's events for a turn of text fields only (no structured call)."""
    if wire.surface == "chat":
        field = rng.choice(("reasoning_content", "reasoning"))
        events = [Event(chat_chunk({"role": "assistant", "content": ""}))]
        for part in parts:
            key = field if part.kind == "reasoning" else "content"
            events += [Event(chat_chunk({key: p})) for p in part.pieces]
        return [*events, Event(chat_chunk({}, finish)), Event(None)]
    script = Script([Part(p.kind, list(p.pieces)) for p in parts], finish, sum(len(p.pieces) for p in parts))
    if wire.surface == "responses":
        raw = responses_events(script, {"tools": surface_tools(wire.turn, "responses")}, DIGEST, CREATED, MODEL, 10)
    else:
        raw = messages_events(script, DIGEST, MODEL, 10)
    return _parse_events(raw, len(parts))


# -- the mutation -----------------------------------------------------------------------------------
def leak_into_text(names: Sequence[str] = FORMATS) -> Callable[[random.Random, Wire], Wire | None]:
    """The leak mutation drawing its format from `names` (one per example; those that can't carry the
    turn are skipped)."""
    pool = tuple(names)

    def leaked_markup(rng: random.Random, wire: Wire) -> Wire | None:
        if not wire.calls or wire.events is not None:
            return None
        if any(s.tokens is not None or s.frags is not None or not isinstance(s.value, dict) for s in wire.calls):
            return None  # an escape or fragment mutation acted on JSON text the markup won't carry
        calls = [(s.name, s.value) for s in wire.calls]
        order = list(pool)
        rng.shuffle(order)
        for name in order:
            markup = carried(name, calls, wire.turn.tools)
            if markup is not None:
                break
        else:
            return None
        fmt = REGISTRY[name]
        reasoning_ok = not fmt.anchored
        where: Where = "reasoning" if reasoning_ok and rng.random() < 0.35 else "content"
        tail = rng.choice(("", "", "\n"))
        if where == "reasoning":
            parts = [Text("reasoning", hostile_pieces(rng.choice(THOUGHTS) + markup + tail, rng))]
        else:
            prose = "" if fmt.anchored else rng.choice(("", wire.turn.content, *PROSE))
            parts = [Text("text", hostile_pieces(prose + markup + tail, rng))]
        finish = rng.choice(("tool_calls", "stop"))
        wire.events = text_events(wire, parts, finish, rng)
        wire.finish = finish
        for sent in wire.calls:
            sent.applied.add(f"{TAG}{name}:{where}")
        return wire

    return leaked_markup


leaked_markup = leak_into_text()


# -- decoys ------------------------------------------------------------------------------------------
def _unoffered(rng: random.Random, offered: list[str]) -> str:
    while True:
        name = "zz_" + "".join(rng.choice(string.ascii_lowercase) for _ in range(6))
        if name not in offered and match_name(name, offered).kind == UNKNOWN_TOOL:
            return name


def decoy_wire(rng: random.Random, wire: Wire, name: str, kind: DecoyKind) -> Wire | None:
    """`wire` (a fresh one) as a text-only turn holding format `name`'s markup of its calls where it is
    no call (None: the format can't carry the turn, or can't be written that way)."""
    calls = [(s.name, s.value) for s in wire.calls]
    if not calls or any(not isinstance(a, dict) for _, a in calls):
        return None
    offered = [tool_name(t) for t in wire.turn.tools]
    fmt = REGISTRY[name]
    if kind == "unoffered_name":
        if writes_no_name(name):
            return None
        renamed = {n: _unoffered(rng, offered) for n, _ in calls}
        try:
            foreign = fmt.render([(renamed[n], a) for n, a in calls])
        except ValueError:
            return None
        if any(n in foreign for n in offered):
            return None  # an offered name inside the arguments: not clearly a decoy
        prose = "" if fmt.anchored else rng.choice(("", *PROSE))
        parts = [Text("text", hostile_pieces(prose + foreign, rng))]
    else:
        markup = carried(name, calls, wire.turn.tools)
        if markup is None or "think>" in markup:
            return None
        if kind in CONTAINERS:
            example = in_container(rng, kind, _region(name, markup, offered))
            if example is None:
                return None
            parts = [Text("text", hostile_pieces(example, rng))]
        elif kind == "think":
            text = "<think>" + rng.choice(THOUGHTS) + markup + "</think>" + rng.choice(("The answer is 4.", "", "\n"))
            parts = [Text("text", hostile_pieces(text, rng))]
        elif kind == "inline_code":
            if "`" in markup or "\n" in markup:
                return None
            parts = [Text("text", hostile_pieces(f"Write `{markup}` to call it.", rng))]
        else:
            reasoning = rng.choice(THOUGHTS) + markup
            parts = [
                Text("reasoning", hostile_pieces(reasoning, rng)),
                Text("text", hostile_pieces("No tool is needed: it is 4.", rng)),
            ]
    wire.events = text_events(wire, parts, "stop", rng)
    wire.finish = "stop"
    wire.calls = []
    wire.expected_names = []
    return wire
