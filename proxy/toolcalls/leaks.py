"""Tool calls that leaked as the model's raw markup into `content` or the reasoning field (no parser,
or the parser gave up), read through the registry of formats (`formats/`).

This module holds no format's syntax: every format reads its own markup, and the rules every format
shares (offered names, the call position: `formats/placement.py`) are the registry's. What is decided
here is where in a message the search runs and what the caller is told:
- content: every markup in call position that reads as calls (prose before and after it stays content);
- reasoning: only the markup that comes last in the reasoning (the caller checks that no content or
  call followed in the turn);
- while streaming: whether the text so far must be held (`hold_verdict`), and whether held text has
  settled as text and can go out (`settled`); what the text already sent leaves open is a
  `blocks.Context` the caller keeps.
A pinned format arms only itself; `foreign_markup` says whether another registered format's markup
would have been a call, so it can be flagged while it passes through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tapfix.proxy.toolcalls.formats import Formats, XmlArgs, armed
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.formats.registry import ANCHOR_LIMIT
from tapfix.proxy.toolcalls.schema import ToolSchemas

UNPINNED = "unpinned_tool_format"  # markup of a registered format other than the pinned one
LEAKED_INTO_REASONING = "leaked_into_reasoning"
_LOOK_LIMIT = 2048  # held text up to this long is read for its containers on every delta


@lru_cache(maxsize=64)
def formats_for(pinned: str | None) -> Formats:
    """The armed formats of a stage: every registered one, or only the pinned one (UnknownFormat lists
    the registered names). Cached: a stage per request must not compile the opener regex again."""
    return armed(pinned)


@dataclass(slots=True)
class Leak:
    start: int  # where the first leaked markup starts in the text
    end: int  # where the last one ends (the rest is ordinary content)
    calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, raw arguments) when confirmed
    names: list[str] = field(default_factory=list)  # names seen, confirmed or not
    regions: list[tuple[int, int]] = field(default_factory=list)  # each markup's span (prose between stays)
    formats: list[str] = field(default_factory=list)  # the registered format of each region

    @property
    def confirmed(self) -> bool:
        return bool(self.calls)


def hold_verdict(
    text: str, at_start: bool, schemas: ToolSchemas, formats: Formats, context: Context | None = None
) -> str:
    """'leak' (hold and look again as more comes), 'maybe' (hold a little longer) or 'no'.

    An opener in call position that may still read as calls holds (`Formats.place`, not final); text
    that may be the start of one holds until the next delta says, unless it stands inside a container;
    a message that starts like a marker-less format's markup holds at most `ANCHOR_LIMIT` characters,
    and is let go as soon as its first value reads whole and names no offered tool. `context`: what the
    content sent before `text` left open."""
    if formats.has_opener(text) and not formats.place(text, schemas.names, False, context, final=False).text_only:
        return "leak"
    if at_start and formats.anchored:
        head = text.lstrip()
        if head[:1] and head[0] in formats.anchor_heads and len(text) <= ANCHOR_LIMIT:
            if not any(c in text for c in "}])"):
                return "maybe"
            found = formats.find(text, schemas.names, at_start=True)
            if found is None:
                return "maybe"
            return "leak" if found.confirmed else "no"
    if k := formats.start_len(text):
        # Inside a container the start can't become a call: no hold. (Held text past a few KB is held on
        # without looking: reading it again on every delta would cost quadratic time.)
        if len(text) > _LOOK_LIMIT or not (context or Context()).point(text[:-k]).container:
            return "maybe"
    return "no"


def settled(text: str, schemas: ToolSchemas, formats: Formats, context: Context | None) -> bool:
    """Whether held text (no marker-less head at its start) can go out: nothing in it may still become a
    call, and its end can't start an opener."""
    if formats.may_start(text):
        return False
    return formats.place(text, schemas.names, False, context, final=False).text_only


def find_leak(
    text: str, schemas: ToolSchemas, at_start: bool, formats: Formats | None = None, context: Context | None = None
) -> Leak | None:
    """Every leaked markup of `text` in call position with its calls when they check out; or the first
    markup that doesn't (unconfirmed: its names, from its start to the end of the text). `context`: what
    the content before `text` left open (it was sent already)."""
    formats = formats or formats_for(None)
    placement = formats.place(text, schemas.names, at_start, context)
    confirmed = [f for f in placement.calls if f.confirmed]
    if not confirmed:
        if placement.calls:
            first = placement.calls[0]
            names = [n for n in first.names if n]
            return Leak(first.markup.start, len(text), names=names, formats=[first.fmt.name])
        return Leak(placement.stray, len(text)) if placement.stray is not None else None
    leak = Leak(confirmed[0].markup.start, confirmed[0].markup.end)
    for found in confirmed:
        lo, hi = found.markup.start, found.markup.end
        leak.calls += found.calls
        leak.names += [n for n, _ in found.calls]
        leak.regions.append((lo, hi))
        leak.formats.append(found.fmt.name)
        leak.end = hi
    if not text[leak.end :].strip():
        leak.end = len(text)
        leak.regions[-1] = (leak.regions[-1][0], len(text))
    return leak


def find_reasoning_leak(
    text: str, schemas: ToolSchemas, formats: Formats, context: Context | None = None
) -> Leak | None:
    """The markup that comes last in the reasoning, in call position, when it reads as offered calls (only
    whitespace after it); earlier markup in the reasoning is the model thinking about a call, not making it."""
    placement = formats.place(text, schemas.names, False, context)
    found = next((f for f in reversed(placement.calls) if f.confirmed), None)
    if found is None or text[found.markup.end :].strip():
        return None
    lo = found.markup.start
    names = [n for n, _ in found.calls]
    return Leak(lo, len(text), list(found.calls), names, [(lo, len(text))], [found.fmt.name])


def foreign_markup(
    text: str, schemas: ToolSchemas, at_start: bool, pinned: Formats, context: Context | None = None
) -> Leak | None:
    """With a format pinned: markup of another registered format that would have been a call."""
    leak = find_leak(text, schemas, at_start, formats_for(None), context)
    if leak is None or not leak.confirmed or set(leak.formats) <= set(pinned.names):
        return None
    return leak


def is_xml_args(args: Any) -> bool:
    return isinstance(args, XmlArgs)
