"""Tool calls that leaked as the model's raw markup into `content` or the reasoning field (no parser,
or the parser gave up), read through the registry of formats (`formats/`).

This module holds no format's syntax: every format reads its own markup, and the rules every format
shares (offered names, `<think>` and inline-code decoys, fences) are `formats/registry.py`'s. What is
decided here is where in a message the search runs and what the caller is told:
- content: every markup that reads as calls (prose before, between and after them stays content);
- reasoning: only the markup that comes last in the reasoning (the caller checks that no content or
  call followed in the turn);
- while streaming: whether the text so far must be held (`hold_verdict`).
A pinned format arms only itself; `foreign_markup` says whether another registered format's markup
would have been a call, so it can be flagged while it passes through.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tapfix.proxy.toolcalls.formats import Formats, Found, XmlArgs, armed
from tapfix.proxy.toolcalls.formats.registry import ANCHOR_LIMIT
from tapfix.proxy.toolcalls.schema import ToolSchemas

UNPINNED = "unpinned_tool_format"  # markup of a registered format other than the pinned one
LEAKED_INTO_REASONING = "leaked_into_reasoning"


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


def hold_verdict(text: str, at_start: bool, schemas: ToolSchemas, formats: Formats) -> str:
    """'leak' (hold to the end of the message), 'maybe' (hold a little longer) or 'no'.

    A registered opener anywhere holds to the end; text that may be the start of one holds until the
    next delta says; a message that starts like a marker-less format's markup holds at most
    `ANCHOR_LIMIT` characters, and is let go as soon as its first value reads whole and names no
    offered tool."""
    if formats.has_opener(text):
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
    if formats.may_start(text):
        return "maybe"
    return "no"


_CONTEXT_MARKS = ("<think>", "</think>", "```")


def open_context(context: str, tail: str, text: str) -> tuple[str, str]:
    """What of the content already sent still encloses what follows: an open `<think>`, an open fenced
    block (markup inside either is a decoy). Kept as the openers alone, so it stays a few bytes; `tail`
    is the end of the text sent so far when it may be the start of one of them (split across deltas)."""
    seen = tail + text
    tail = next((seen[-k:] for k in range(8, 0, -1) if any(m.startswith(seen[-k:]) for m in _CONTEXT_MARKS)), "")
    if "<think>" not in seen and "</think>" not in seen and "```" not in seen:
        return context, tail
    seen = context + seen
    think = seen.rfind("<think>") > seen.rfind("</think>")
    fences = sum(1 for line in seen.splitlines() if line.lstrip().startswith("```"))
    return ("<think>" if think else "") + ("\n```\n" if fences % 2 else ""), tail


def find_leak(
    text: str, schemas: ToolSchemas, at_start: bool, formats: Formats | None = None, context: str = ""
) -> Leak | None:
    """Every leaked markup of `text` with its calls when they check out; or the first markup that
    doesn't (unconfirmed: its names, from its start to the end of the text). `context`: what
    `open_context` kept of the content before `text` (it was sent already; only what it encloses counts)."""
    if context:
        whole = find_leak(context + text, schemas, False, formats)
        return _shifted(whole, len(context)) if whole is not None else None
    formats = formats or formats_for(None)
    offered = schemas.names
    leak: Leak | None = None
    pos = 0
    while pos < len(text):
        found = formats.find(text[pos:], offered, at_start=at_start and pos == 0)
        if found is None or not found.confirmed:
            if leak is None and found is not None:
                start = found.markup.start
                return Leak(start, len(text), names=[n for n in found.names if n], formats=[found.fmt.name])
            if leak is None and (m := _first_opener(text, formats)) is not None:
                return Leak(m, len(text))  # a markup that doesn't read: its start, no names
            break
        lo, hi = pos + found.markup.start, pos + found.markup.end
        if leak is None:
            leak = Leak(lo, hi)
        leak.calls += found.calls
        leak.names += [n for n, _ in found.calls]
        leak.regions.append((lo, hi))
        leak.formats.append(found.fmt.name)
        leak.end = hi
        pos = max(hi, pos + 1)
    if leak is not None and not text[leak.end :].strip():
        leak.end = len(text)
        leak.regions[-1] = (leak.regions[-1][0], len(text))
    return leak


def _shifted(leak: Leak, by: int) -> Leak | None:
    regions = [(lo - by, hi - by) for lo, hi in leak.regions if lo >= by]
    if leak.start < by:
        return None
    return Leak(leak.start - by, leak.end - by, leak.calls, leak.names, regions, leak.formats)


def find_reasoning_leak(text: str, schemas: ToolSchemas, formats: Formats) -> Leak | None:
    """The markup that comes last in the reasoning, when it reads as offered calls (only whitespace
    after it); earlier markup in the reasoning is the model thinking about a call, not making it."""
    last: tuple[int, Found] | None = None
    pos = 0
    while pos < len(text):
        found = formats.find(text[pos:], schemas.names, at_start=False)
        if found is None:
            break
        if found.confirmed:
            last = (pos, found)
        pos += max(found.markup.end if found.confirmed else found.markup.start + 1, 1)
    if last is None:
        return None
    pos, found = last
    lo, hi = pos + found.markup.start, pos + found.markup.end
    if text[hi:].strip():
        return None
    names = [n for n, _ in found.calls]
    return Leak(lo, len(text), list(found.calls), names, [(lo, len(text))], [found.fmt.name])


def foreign_markup(text: str, schemas: ToolSchemas, at_start: bool, pinned: Formats) -> Leak | None:
    """With a format pinned: markup of another registered format that would have been a call."""
    leak = find_leak(text, schemas, at_start, formats_for(None))
    if leak is None or not leak.confirmed or set(leak.formats) <= set(pinned.names):
        return None
    return leak


def _first_opener(text: str, formats: Formats) -> int | None:
    m = formats.opener_re.search(text) if formats.opener_re is not None else None
    return m.start() if m is not None else None


def is_xml_args(args: Any) -> bool:
    return isinstance(args, XmlArgs)
