"""A turn that `max_tokens` ended (finish `length`, `max_tokens`, an incomplete response): was it cut
inside a call, or before the next one?

Two questions, asked only of such a turn, over the text the model wrote (content, reasoning, or what
followed the last structured call):

- `cut_markup`: does the text end inside a call written as a format's markup? A registered opener (the
  whole opener: a piece of one is also how prose ends, `I want to`), or a marker-less format's head at
  the start of the content, followed by text that the format reads as a call of an offered tool once
  the rest arrives. The rest is derived from the format's own rendering (`ToolFormat.render`), never
  from a list kept here: what follows the place the text stopped at in a rendered call, what follows
  a string value, or the open JSON closed and what the format writes after its arguments. Whether the
  markup stands where a call may stand is `Formats.find`'s rule, asked of the completed text, so a
  cut example in prose stays prose exactly as the complete one would.
- `length_signs`: with complete calls, is there a sign that more was coming? An opener of a further
  call (complete or cut) and any other text or argument bytes after the last complete call are text
  after it; a calls section the format closes, left open, is markup its format reads as not closed.
  The finish rewrite (`length` → `tool_calls`) would remove the only sign that later calls were lost,
  so any of these makes the turn the retryable error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from tapfix.proxy.toolcalls.defects import MISSING_LAST_CHUNK
from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.formats.registry import Formats
from tapfix.proxy.toolcalls.plan_types import Fatal
from tapfix.proxy.toolcalls.schema import ToolSchemas

# The arguments a format renders for the completions: a plain value, and one with the characters that
# make some formats write a value otherwise (CDATA, escapes).
_PROBE_KEY = "qx"
_PROBES = ("VALUE", 'V"<\n>V')
_ALIGN = 3  # characters of the text's end a completion must continue
_MAX_STARTS = 16  # opener positions tried in one text
_WINDOW = 512  # characters around an opener a format's `claims` may look at
_LITERALS = ("true", "false", "null", "True", "False", "None")
_LITERAL_END = re.compile(r"(?:^|[\s,:=\[(])(t|tr|tru|f|fa|fal|fals|n|nu|nul|T|Tr|Tru|F|Fa|Fal|Fals|N|No|Non)$")


@dataclass(frozen=True, slots=True)
class Cut:
    at: int  # where the cut markup starts in the text
    format: str  # the registered format it reads as, once completed
    name: str  # the offered tool it calls


@dataclass(frozen=True, slots=True)
class Last:
    end: int  # where the last complete markup ends
    closed: bool  # its format's end marker was seen
    format: str


def cut_markup(
    text: str, schemas: ToolSchemas, formats: Formats, at_start: bool, start: int = 0, context: Context | None = None
) -> Cut | None:
    """A call written as markup, from `start` on, that runs to the end of `text` and reads as a call of an
    offered tool once the rest arrives: the model was writing it when the turn ended. `context`: what the
    text before `text` left open (`blocks.Context`: a fence, a `<think>`, an unfinished sentence)."""
    offered = schemas.names
    if not offered or not text[start:].strip():
        return None
    for at, fmts in _starts(text, formats, at_start, start):
        tail = text[at:]
        closing: dict[tuple[str, ...], tuple[str, str]] = {}  # the tail's open JSON closed, per string syntax
        for fmt in fmts:
            for name in _names(tail, offered):
                keys = _spelled(tail, list(schemas.properties(name) or ()))
                for rest in _completions(fmt, name, keys, tail, closing):
                    if not _claimed(fmt, text, at, rest):  # what follows the opener: no parse of what can't be
                        continue
                    if _reads_as_call(fmt, tail + rest, offered) and _counts(
                        text, at, rest, offered, formats, at_start, context
                    ):
                        return Cut(at, fmt.name, name)
    return None


def last_markup(
    text: str, offered: list[str], formats: Formats, at_start: bool, start: int = 0, context: Context | None = None
) -> Last | None:
    """The last markup from `start` on in call position that reads as offered calls (`Formats.place`, as
    the leak readers use it): where it ends and whether its format saw its end marker."""
    placed = [f for f in formats.place(text, offered, at_start, context).calls if f.confirmed]
    last = max((f for f in placed if f.markup.start >= start), key=lambda f: f.markup.end, default=None)
    if last is None:
        return None
    return Last(last.markup.end, last.markup.closed, last.fmt.name)


@dataclass(frozen=True, slots=True)
class Sign:
    reason: str  # what says the turn was cut
    name: str | None = None  # the tool of the call it cut, when markup names it


def length_signs(
    text: str,
    schemas: ToolSchemas,
    formats: Formats,
    at_start: bool,
    after_calls: bool,
    start: int = 0,
    context: Context | None = None,
) -> Sign | None:
    """Why a turn that `max_tokens` ended must not pass as complete, judged on `text` from `start` on (the
    content, or what followed the last structured call when `after_calls`); None when nothing says so.
    `context`: what the text before `text` left open.

    With markup that reads as calls: its section left open, or text after it. With calls before `text`:
    any text. With no call at all: markup cut short (`cut_markup`)."""
    offered = schemas.names
    found = formats.has_opener(text) or at_start
    last = last_markup(text, offered, formats, at_start, start, context) if found else None
    if last is not None:
        if not last.closed:
            return Sign(f"the {last.format} markup of the last call was left open")
        if text[last.end :].strip():
            return Sign(f"text after the last complete call: {quote(text[last.end :])}")
        return None
    if after_calls and text[start:].strip():
        return Sign(f"text after the last complete call: {quote(text[start:])}")
    return cut_sign(text, schemas, formats, at_start, start, context)


def turn_sign(
    text: str,
    schemas: ToolSchemas,
    formats: Formats,
    last_call: str | None = None,
    reasoning: str | None = None,
    context: Context | None = None,
    at_start: bool = True,
    reasoning_context: Context | None = None,
) -> Sign | None:
    """A turn that `max_tokens` ended: why it was cut inside or after its calls, or None.

    `text`: what the model wrote after its last structured call (`last_call`, that call's name), or the
    whole turn's text when it made none (`context`: what the content before `text` left open, a
    `blocks.Context`; `at_start`: `text` starts the content); `reasoning`: the reasoning, when it was
    searched for the turn's call (`reasoning_context`: what the reasoning before it left open)."""
    if last_call is not None:
        sign = length_signs(text, schemas, formats, at_start=False, after_calls=True)
        return Sign(sign.reason, sign.name or last_call) if sign is not None else None
    if text.strip():
        return length_signs(text, schemas, formats, at_start, after_calls=False, context=context)
    return reasoning_sign(reasoning, schemas, formats, reasoning_context) if reasoning else None


def reasoning_sign(text: str, schemas: ToolSchemas, formats: Formats, context: Context | None = None) -> Sign | None:
    """The reasoning of a turn `max_tokens` ended, searched for the turn's call (nothing visible followed
    it): the markup it ends with left open, or markup cut short. `context`: what the reasoning before
    `text` left open."""
    read = last_markup(text, schemas.names, formats, at_start=False, context=context)
    if read is not None and not text[read.end :].strip():  # the call the reasoning ends with
        return None if read.closed else Sign(f"the {read.format} markup of the last call was left open")
    return cut_sign(text, schemas, formats, at_start=False, context=context)


def cut_off(sign: Sign) -> Fatal:
    """The unrecoverable verdict of a turn `max_tokens` ended where `sign` says it cut a call."""
    return Fatal(sign.name or "?", f"max_tokens reached: {sign.reason}", MISSING_LAST_CHUNK)


def cut_sign(
    text: str, schemas: ToolSchemas, formats: Formats, at_start: bool, start: int = 0, context: Context | None = None
) -> Sign | None:
    cut = cut_markup(text, schemas, formats, at_start, start, context)
    if cut is None:
        return None
    return Sign(f"a call of {cut.name!r} written as {cut.format} markup was cut off", cut.name)


def quote(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "…")


# -- where a cut call may start -------------------------------------------------------------------------
def _starts(text: str, formats: Formats, at_start: bool, start: int) -> list[tuple[int, list[ToolFormat]]]:
    """Where a cut call may start: a marker-less format's head at the start of the content, and whole
    openers (the first and the last few: a call held from its opener, or the last thing written)."""
    out: list[tuple[int, list[ToolFormat]]] = []
    if at_start and start == 0 and formats.anchored:
        lead = len(text) - len(text.lstrip())
        if text[lead : lead + 1] in formats.anchor_heads:
            out.append((lead, list(formats.anchored)))
    if formats.opener_re is not None:
        found = [(m.start(), formats.by_opener[m.group()]) for m in formats.opener_re.finditer(text, start)]
        half = _MAX_STARTS // 2
        out += found if len(found) <= _MAX_STARTS else found[:half] + found[-half:]
    return out


def _spelled(tail: str, words: list[str]) -> list[str]:
    """The words (offered names, property names) the tail spells whole, or ends with the start of
    (longest first): the completions need no other, since the rest of the markup doesn't depend on them."""
    out = [w for w in words if w in tail or any(_ends_with_start(tail, w[:k]) for k in range(1, len(w)))]
    return sorted(out, key=len, reverse=True)


def _ends_with_start(text: str, start: str) -> bool:
    """`text` ends with `start`, not in the middle of a word (`what` doesn't end with the start of `tool`)."""
    return text.endswith(start) and (len(text) == len(start) or not text[-len(start) - 1].isalnum())


def _names(tail: str, offered: list[str]) -> list[str]:
    """The offered names a call in the tail may have: those it spells (whole or cut); when none, the cut came
    before the name, where every name reads alike, so one stands for all."""
    return _spelled(tail, offered) or offered[:1]


# -- what the rest of a cut call may be -----------------------------------------------------------------
def _completions(
    fmt: ToolFormat, name: str, keys: list[str], tail: str, closing: dict[tuple[str, ...], tuple[str, str]]
) -> Iterator[str]:
    """The rest of a call the text stopped inside of, from the format's renderings of a call of `name` (with
    each property the tail spells, with two properties, and two calls: what separates members and calls):

    - what follows the same last characters in a rendering (the text stopped in the opener, the name, the
      framing, between calls);
    - what follows a word of the rendering (it stopped inside a key or a parameter's name);
    - what follows a string value of one of the tool's properties (inside a value at the arguments' top
      level, in any syntax: some formats close a value with its property's name);
    - the open JSON (or Python literal) closed, then what the format writes after its last bracket."""
    rendered = _render(fmt, name, {_PROBE_KEY: _PROBES[0]})
    if rendered is None:
        return
    seen: set[str] = set()

    def fresh(rest: str) -> bool:
        new = rest not in seen
        seen.add(rest)
        return new

    probed: list[tuple[Any, str | None]] = [
        (probe, _render(fmt, name, {key: probe})) for key in [*keys, _PROBE_KEY] for probe in _PROBES
    ]
    probed.append((_PROBES[0], _render(fmt, name, {_PROBE_KEY: _PROBES[0], _PROBE_KEY * 2: _PROBES[0]})))
    probed.append((_PROBES[0], _render(fmt, name, {_PROBE_KEY: _PROBES[0]}, twice=True)))
    probed.append((None, _render(fmt, name, {_PROBE_KEY: 1})))  # a value that isn't a string
    renders = [(probe, whole) for probe, whole in probed if whole is not None]
    for probe, whole in renders:  # the commonest cut: inside a value
        at = whole.rfind(probe) if isinstance(probe, str) else -1
        if at >= 0 and fresh(whole[at + len(probe) :]):
            yield whole[at + len(probe) :]
    quotes = _quotes(rendered, _PROBES[0])
    if quotes not in closing:
        closure = _close_open(tail, quotes) or ""
        closing[quotes] = (closure, closure[len(closure.rstrip("}])")) :])  # all of it; its brackets
    closed, brackets_closed = closing[quotes]
    for probe, whole in renders:
        at = whole.rfind(probe) if isinstance(probe, str) else -1
        if at >= 0 and closed and fresh(closed + whole[at + len(probe) :]):
            yield closed + whole[at + len(probe) :]  # JSON inside a value the format frames (DSML, XML)
    brackets = max(rendered.rfind(c) for c in "}])")
    after = rendered[brackets + 1 :] if brackets >= 0 else ""
    if (closed or after) and fresh(closed + after):
        yield closed + after
    member = _member(rendered, quotes)  # inside a key at any depth: its value, then what closes
    if member:
        done = member + brackets_closed + after
        if fresh(done):
            yield done
    ends = [tail[-_ALIGN:]] + ([tail[-1]] if not tail[-1].isalnum() and not tail[-1].isspace() else [])
    for _, whole in renders:
        for k in _cut_points(whole, tuple(ends)):
            if fresh(whole[k:]):
                yield whole[k:]


def _render(fmt: ToolFormat, name: str, args: dict[str, Any], twice: bool = False) -> str | None:
    """The format's markup of a call of `name` (two calls with `twice`: what separates calls)."""
    return _rendered(fmt, name, tuple(args.items()), twice)


@lru_cache(maxsize=1024)
def _rendered(fmt: ToolFormat, name: str, args: tuple[tuple[str, Any], ...], twice: bool) -> str | None:
    try:
        return fmt.render([(name, dict(args))] * (2 if twice else 1))
    except (ValueError, NotImplementedError, TypeError, KeyError):
        return None


def _cut_points(whole: str, ends: tuple[str, ...]) -> list[int]:
    """Where in a rendering the text may have stopped: after the same last characters, or inside a word."""
    return sorted({k for end in ends for k in _ends_at(whole, end)} | set(_word_ends(whole)))


@lru_cache(maxsize=4096)
def _ends_at(whole: str, end: str) -> tuple[int, ...]:
    return tuple(k for k in range(1, len(whole)) if whole[:k].endswith(end))


@lru_cache(maxsize=1024)
def _word_ends(whole: str) -> tuple[int, ...]:
    return tuple(
        k for k in range(1, len(whole)) if whole[k - 1].isalnum() and not whole[k].isalnum() and not whole[k].isspace()
    )


def _close_open(text: str, quotes: tuple[str, ...] = ('"', "'")) -> str | None:
    """What closes the JSON (or Python literal, or a format's own value syntax) open at the end of `text`:
    the open string (and an escape it stopped inside), a literal or a value for a key or a `:` left
    waiting, the open brackets. `quotes`: what delimits a string (a format may write its own, `<|"|>`).
    None: nothing is open."""
    stack: list[str] = []
    keys: list[bool] = []  # per open bracket: an object that expects a key next
    quote = ""
    escaped = after_key = False
    last_end = 0
    for m in _tokens(quotes).finditer(text):
        token, last_end = m.group(), m.end()
        after_key = False
        opened = next((q for q in quotes if token.startswith(q) and len(token) >= len(q)), "")
        if opened and token not in "{}[]():,=":
            closed = any(m.group(f"c{k}") is not None for k in range(len(quotes)))
            if not closed:
                quote = opened
                escaped = len(opened) == 1 and (len(token) - len(token.rstrip("\\"))) % 2 == 1
                after_key = bool(keys) and keys[-1]  # still inside the key
                break
            after_key = bool(keys) and keys[-1]
        elif token in "{[(":
            stack.append(token)
            keys.append(token == "{")
        elif token in "}])" and stack and "{[(".index(stack[-1]) == "}])".index(token):
            stack.pop()
            keys.pop()
        elif token in ":," and keys:
            keys[-1] = token == "," and stack[-1] == "{"
    rest_text = text[last_end:]
    if not quote and rest_text.strip():
        after_key = False
    stripped = text.rstrip()
    last = stripped[-1:] if not quote else ""
    literal = None if quote else _LITERAL_END.search(text[-8:])
    rest = ""
    if literal is not None:  # a literal cut short: `tr` of `true`
        word = literal.group(1)
        last, rest = "", next(w[len(word) :] for w in _LITERALS if w.startswith(word))
    if not stack and not quote:
        return rest or None
    rest += ("\\" if escaped else "") + quote
    if after_key:
        rest += ": null"
    elif not quote and last == ":":
        rest += " null"
    elif not quote and last == "=":
        rest += "None"
    elif not quote and last == "," and stack[-1] != "(":
        rest += ' "": null' if stack[-1] == "{" else " null"
    return rest + "".join("}])"["{[(".index(c)] for c in reversed(stack))


@lru_cache(maxsize=16)
def _tokens(quotes: tuple[str, ...]) -> re.Pattern[str]:
    """The tokens `_close_open` reads: whole strings (to their closing delimiter, `cK` when it came, or the
    end of the text), brackets and separators; everything else is skipped in C."""
    strings = []
    for k, q in enumerate(quotes):
        e = re.escape(q)
        body = f"(?:\\\\.|[^\\\\{e}])*" if len(q) == 1 else f"(?:(?!{e}).)*"
        end = "\\\\?\\Z" if len(q) == 1 else "\\Z"  # the text may stop inside an escape
        strings.append(f"{e}{body}(?:(?P<c{k}>{e})|{end})")
    return re.compile("|".join(strings) + r"|[{}\[\]():,=]", re.S)


def _member(rendered: str, quotes: tuple[str, ...]) -> str:
    """What follows the probe's key in a rendering, through its value and the value's closing delimiter:
    `": "VALUE"` in JSON, `:<|"|>VALUE<|"|>` in Gemma 4's syntax ("" when the format writes no such thing)."""
    key, value = rendered.find(_PROBE_KEY), rendered.rfind(_PROBES[0])
    if key < 0 or value < key:
        return ""
    end = value + len(_PROBES[0])
    quote = next((q for q in quotes if rendered.startswith(q, end)), "")
    return rendered[key + len(_PROBE_KEY) : end + len(quote)]


def _quotes(rendered: str, value: str) -> tuple[str, ...]:
    """How the format delimits a string value, read off its rendering of one (`"` in JSON, `<|"|>` in
    Gemma 4's syntax); JSON's and Python's quotes when it writes none (XML-style values)."""
    at = rendered.find(value)
    left, right = rendered[:at], rendered[at + len(value) :]
    common = max((k for k in range(1, 8) if left.endswith(right[:k]) and k <= len(right)), default=0)
    delimiter = right[:common]
    if at < 0 or not delimiter or delimiter.isspace() or any(c.isalnum() for c in delimiter):
        return ('"', "'")
    return (delimiter,)


def _claimed(fmt: ToolFormat, text: str, at: int, rest: str) -> bool:
    """`fmt.claims` on the completed text, around the opener (a format looks a few characters either side)."""
    lo = max(0, at - _WINDOW)
    near = text[lo:] + rest if len(text) - at <= _WINDOW else text[lo : at + _WINDOW]
    try:
        return fmt.claims(near, at - lo)
    except (ValueError, IndexError):
        return False


def _reads_as_call(fmt: ToolFormat, markup: str, offered: list[str]) -> bool:
    """The cheap check first: the format alone reads the completed markup as offered calls, to its end."""
    try:
        read = fmt.parse(markup, 0)
    except (ValueError, IndexError, RecursionError, KeyError, TypeError):
        return False
    return read is not None and _offered(read, offered) and read.end >= len(markup.rstrip())


def _offered(read: Markup, offered: list[str]) -> bool:
    if not read.calls:
        return False
    return all(n in offered if n is not None else len(offered) == 1 for n, _ in read.calls)


def _counts(
    text: str, at: int, rest: str, offered: list[str], formats: Formats, at_start: bool, context: Context | None
) -> bool:
    """Whether the completed markup at `at` is a call where it stands (`Formats.place`'s rule,
    `placement.py`: a call position, every decoy with it): a call in call position that holds `at` and
    reaches into the completion. (A completion may render a further call after it: that one standing at
    block level says nothing about the markup that was cut, in a container or not.)"""
    placed = formats.place(text + rest, offered, at_start, context).calls
    return any(f.confirmed and f.markup.start <= at < f.markup.end and f.markup.end > len(text) for f in placed)
