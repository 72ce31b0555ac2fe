"""Where markup is a call: the position half of "what counts as a call" (docs/formats.md).

Markup that reads as calls is a call only in a call position:
1. at block level: not inside any container `blocks.Context` knows (a fence of backticks or tildes, an
   indented code line, `<pre>`/`<code>`, inline code, quotes, a list item, a table row, a blockquote, a
   `<think>` that closes after it);
2. nothing but whitespace, special tokens (`<|im_end|>`) or further markup follows it on the line it
   ends on: markup followed by more prose on its line is part of a sentence;
3. when the prose before it in its paragraph doesn't end a sentence (`Never let a model emit` …), nothing
   but whitespace, special tokens, lone tags or further markup follows it to the end of its paragraph
   (a blank line, or the end of the text).
Markup separated only by whitespace and special tokens (no blank line) is one run, judged as one. A
fence format's markup (```` ```tool_code ````) counts only as the last thing in the text.

`place` walks the text once, left to right, reading the structure as it goes; while streaming
(`final=False`) it says whether everything in the text is settled as text, so held text goes out as soon
as it can't become a call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat
from tapfix.proxy.toolcalls.formats.blocks import SPECIAL, TAGS_ONLY, Context, Point

_MAX_MARKUPS = 256  # markups placed in one text: more is not a model's turn


@dataclass(slots=True)
class Found:
    """Markup a format read: its calls naming offered tools (all of them when confirmed), every name."""

    fmt: ToolFormat
    markup: Markup
    calls: list[tuple[str, Any]] = field(default_factory=list)  # offered names only, when confirmed
    names: list[str | None] = field(default_factory=list)  # every name the markup held

    @property
    def confirmed(self) -> bool:
        return bool(self.calls) and len(self.calls) == len(self.markup.calls)


class Formats(Protocol):
    """What placing needs of the registry's `Formats`: where markup may start and what reads there."""

    starts: frozenset[str]

    def candidates(self, text: str, at_start: bool) -> list[tuple[int, list[ToolFormat]]]: ...

    def read_at(
        self, text: str, at: int, fmts: list[ToolFormat], offered: list[str], final: bool = True
    ) -> tuple[Found | None, int | None]: ...

    def opener_at(self, text: str, at: int) -> bool: ...


@dataclass(slots=True)
class Placement:
    """What `place` found: the markups in call position (confirmed or not), in order; `stray`: where the
    first opener in call position that reads as no markup starts; `settled`: nothing may still become a
    call (always True for a final reading)."""

    calls: list[Found] = field(default_factory=list)
    stray: int | None = None
    settled: bool = True

    @property
    def text_only(self) -> bool:
        """Nothing in the text is or may still become a call: held text can go out as it came."""
        return self.settled and not self.calls


def place(
    formats: Formats, text: str, offered: list[str], at_start: bool, context: Context | None, final: bool
) -> Placement:
    """The markups of `text` in call position. `context`: what the text before it left open (None: it is
    the whole text); `final`: the text is complete (else what may still change is unsettled)."""
    out = Placement()
    ctx = context.copy() if context is not None else Context()
    candidates = formats.candidates(text, at_start)
    by_pos = {at: fmts for at, fmts in candidates}
    fed = pos = 0
    for at, fmts in candidates:
        if at < pos:
            continue
        ctx.feed(text[fed:at])
        fed = at
        point = ctx.point()
        if point.container:
            continue
        if point.think:
            if text.find("</think>", at) >= 0:
                continue  # thinking about a call
            if not final:
                out.settled = False
                return out
        found, rejected = formats.read_at(text, at, fmts, offered, final)
        if found is None:
            if rejected is not None:
                pos = rejected  # a fence format's block with text after it: an example
            elif formats.opener_at(text, at):  # (a marker-less head that doesn't read is no markup)
                if not final:
                    out.settled = False  # an opener that may still read as calls
                    return out
                if out.stray is None:
                    out.stray = at
            continue
        run, end = _run(formats, text, at, found, ctx, by_pos, offered, final)
        verdict = _verdict(formats, text, end, point, by_pos, offered, final)
        if verdict == "open":
            out.settled = False
            return out
        if verdict == "call":
            out.calls += run
            fed = _trim(text, end)  # the whitespace a format read past is read as text: a blank line ends
            ctx.skip(text[at:fed])  # the paragraph, a newline the line
        pos = end
        if len(out.calls) >= _MAX_MARKUPS:
            break
    return out


def _run(
    formats: Formats,
    text: str,
    at: int,
    first: Found,
    ctx: Context,
    by_pos: dict[int, list[ToolFormat]],
    offered: list[str],
    final: bool,
) -> tuple[list[Found], int]:
    """The markup at `at` and what follows it separated only by whitespace and special tokens, no blank line."""
    run, end = [first], first.markup.end
    while len(run) < _MAX_MARKUPS:
        tail = _trim(text, end)
        nxt = _next_token(text, tail)
        fmts = by_pos.get(nxt) if nxt is not None else None
        if nxt is None or fmts is None:
            break
        probe = ctx.copy().skip(text[at:tail]).feed(text[tail:nxt])
        if probe.point().container:
            break
        found, _ = formats.read_at(text, nxt, fmts, offered, final)
        if found is None:
            break
        run.append(found)
        end = found.markup.end
    return run, end


def _next_token(text: str, pos: int) -> int | None:
    """Where the next thing after `pos` starts, past whitespace and special tokens; None past a blank line."""
    newlines = 0
    while pos < len(text):
        ch = text[pos]
        if ch == "\n":
            newlines += 1
            if newlines > 1:
                return None
            pos += 1
        elif ch in " \t\r":
            pos += 1
        elif ch == "<" and (m := SPECIAL.match(text, pos)):
            pos, newlines = m.end(), 0
        else:
            return pos
    return None


def _trim(text: str, end: int) -> int:
    """A markup's end without the whitespace its format read past."""
    while end > 0 and text[end - 1] in " \t\r\n":
        end -= 1
    return end


def _verdict(
    formats: Formats,
    text: str,
    end: int,
    point: Point,
    by_pos: dict[int, list[ToolFormat]],
    offered: list[str],
    final: bool,
) -> str:
    """'call', 'text' or 'open' (the text may still go either way) for the run that ends at `end`."""
    end = _trim(text, end)
    eol = text.find("\n", end)
    prose = _prose(formats, text[end : eol if eol >= 0 else len(text)], final)
    if prose is not None:
        return prose
    if eol < 0:
        return "call" if final else "open"
    if point.ended:
        return "call"
    pos = eol + 1  # rule 3: the rest of the paragraph
    while True:
        nl = text.find("\n", pos)
        line = text[pos : nl if nl >= 0 else len(text)]
        if not line.strip():
            return "open" if nl < 0 and not final else "call"
        start = pos + len(line) - len(line.lstrip())
        fmts = by_pos.get(start)
        found = formats.read_at(text, start, fmts, offered, final)[0] if fmts is not None else None
        if found is not None:
            after = _trim(text, found.markup.end)
            nl = text.find("\n", after)
            prose = _prose(formats, text[after : nl if nl >= 0 else len(text)], final)
        else:
            prose = None if TAGS_ONLY.fullmatch(line) else _prose(formats, line, final)
        if prose is not None:
            return prose
        if nl < 0:
            return "call" if final else "open"
        pos = nl + 1


def _prose(formats: Formats, rest: str, final: bool) -> str | None:
    """None when text after markup is no prose (whitespace, special tokens, further markup: an opener,
    read or not, since a damaged call is no sentence); else 'text', or 'open' while a stream may still
    make it something else. A stream decides only on a word (a letter or digit first): punctuation may
    still be markup going on (`; {` of a second call), a `<` a tag, `Actio` an opener."""
    tail = SPECIAL.sub("", rest).strip()
    if not tail or formats.opener_at(tail, 0):
        return None
    if final:
        return "text"
    return "text" if tail[0].isalnum() and tail not in formats.starts else "open"
