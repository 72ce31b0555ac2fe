"""Every registered tool-call format, and the rules that say when markup in text is a call.

Formats register by being listed in `formats/__init__.py`; this module indexes their openers so one
regex search finds where any of them may start, and applies the rules every format shares:

- a call counts only when the request offered tools and its name is an offered tool (a format that
  carries no name: exactly one tool was offered);
- markup counts only in a call position (`placement.py`): at block level, not inside any container
  (fences of backticks or tildes, indented code, `<pre>`/`<code>`, inline code, quotes, a list item, a
  table row, a blockquote, a `<think>` that closes after it), with no prose after it on its line, and
  none after it in its paragraph when the prose before it doesn't end a sentence;
- a fence format's markup (its call syntax is a fence, ```` ```tool_code ````) is a call only when it is
  the last thing in the text;
- markup in the reasoning field counts only when it comes last there (the caller checks that no content
  or call follows in the turn);
- markup must read completely as calls: prose that mentions a marker stays prose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.formats.placement import Found, Placement, place

ANCHOR_LIMIT = 4096  # bytes of content held at its start for a format without a marker


class UnknownFormat(ValueError):
    """A `tool_format` / `--tool-format` name that isn't registered; the message lists the names."""


class Formats:
    """The armed formats (all, or one pinned) with their openers indexed for one search."""

    def __init__(self, formats: Iterable[ToolFormat]) -> None:
        self.formats = tuple(formats)
        self.by_opener: dict[str, list[ToolFormat]] = {}
        for fmt in self.formats:
            for opener in fmt.openers:
                self.by_opener.setdefault(opener, []).append(fmt)
        openers = sorted(self.by_opener, key=len, reverse=True)
        self.opener_re = re.compile("|".join(re.escape(o) for o in openers)) if openers else None
        self.max_opener = max((len(o) for o in openers), default=0)
        self.anchored = tuple(f for f in self.formats if f.anchored)
        self.names = [f.name for f in self.formats]
        # The first character of a marker-less format's markup, from what the format renders.
        self.anchor_heads = frozenset(_head(f) for f in self.anchored) - {""}
        self.fast_bytes, self.paired_bytes = _fast_bytes(self.by_opener)
        self.starts = frozenset(o[:k] for o in openers for k in range(1, len(o)))
        self.start_ends = frozenset(s[-1] for s in self.starts)  # what a proper prefix can end with
        # The starts of word-led openers before their first punctuation (`functi`, `Actio`, ` to`): the
        # fast bytes can't see them, so the stage checks the end of a delta's text for them.
        self.word_starts = frozenset(
            o[:k].encode() for o in openers for k in range(1, min(_distinct_at(o), len(o) - 1) + 1)
        )
        self.word_ends = frozenset(s[-1] for s in self.word_starts)  # their last bytes: the one-byte first check
        self.word_reach = max((len(s) for s in self.word_starts), default=0)

    # -- holding ------------------------------------------------------------------------------------
    def may_start(self, tail: str) -> bool:
        """Whether `tail` (the end of the text so far) may be the start of a registered opener, any
        proper prefix of one: `<tool_`, `[TOOL`, and word-led ones too (`functi`, `Actio`, ` to`), since a
        piece sent before the opener completes can't be taken back and the call would be lost."""
        return self.start_len(tail) > 0

    def start_len(self, tail: str) -> int:
        """How long the end of `tail` is that may start a registered opener (`may_start`); 0: none."""
        if not tail or tail[-1] not in self.start_ends:
            return 0
        for k in range(min(self.max_opener - 1, len(tail)), 0, -1):
            start = tail[-k:]
            if start in self.starts and not (k < len(tail) and _mid_word(tail[-k - 1], start)):
                return k
        return 0

    def ends_in_word_start(self, raw: bytes) -> bool:
        """Whether the raw (JSON-escaped) end of a delta's text ends in the start of a word-led opener
        before its first punctuation (`may_start`'s rule). Those characters are never escaped, so the
        raw bytes tell; a letter before the start ends an escape (`\\nfunct`) when a backslash precedes it."""
        if not raw or raw[-1] not in self.word_ends:
            return False
        for k in range(min(self.word_reach, len(raw)), 0, -1):
            if raw[-k:] not in self.word_starts:
                continue
            before = raw[-k - 1] if k < len(raw) else 32
            if before in _ASCII_WORD and raw[-k] in _ASCII_WORD and not (k + 1 < len(raw) and raw[-k - 2] == 92):
                continue  # inside a word (`of`, `dysfunct`): an opener that is a word doesn't start there
            return True
        return False

    def has_opener(self, text: str) -> bool:
        return self.opener_re is not None and self.opener_re.search(text) is not None

    def opener_at(self, text: str, at: int) -> bool:
        """Whether a registered opener starts at `at`."""
        return self.opener_re is not None and self.opener_re.match(text, at) is not None

    # -- finding ------------------------------------------------------------------------------------
    def find(
        self, text: str, offered: list[str], at_start: bool = True, context: Context | None = None
    ) -> Found | None:
        """The first markup in call position in `text` that reads as calls (a confirmed one first).
        `context`: what the text before `text` left open (`blocks.Context`)."""
        if not offered:
            return None
        calls = self.place(text, offered, at_start, context).calls
        return next((f for f in calls if f.confirmed), calls[0] if calls else None)

    def place(
        self, text: str, offered: list[str], at_start: bool = True, context: Context | None = None, final: bool = True
    ) -> Placement:
        """Every markup of `text` in call position (`placement.py` has the rule)."""
        if not offered:
            return Placement()
        return place(self, text, offered, at_start, context, final)

    def read_at(
        self, text: str, at: int, fmts: list[ToolFormat], offered: list[str], final: bool = True
    ) -> tuple[Found | None, int | None]:
        """The markup at `at` of the first of `fmts` that reads calls there (one naming offered tools
        first), and where a fence format's block ends when it is followed by text (an example, not a call)."""
        first: Found | None = None
        rejected: int | None = None
        for fmt in fmts:
            if not fmt.claims(text, at):
                continue
            try:
                markup = fmt.parse(text, at)
            except (ValueError, IndexError, RecursionError):
                markup = None
            if markup is None or not markup.calls:
                continue
            if fmt.fence and text[markup.end :].strip():
                rejected = max(rejected or 0, markup.end)  # a fenced call is a call only as the last thing
                continue
            found = _judge(fmt, markup, offered)
            if found.confirmed:
                return found, None
            first = first or found
        return first, rejected if first is None else None

    def candidates(self, text: str, at_start: bool) -> list[tuple[int, list[ToolFormat]]]:
        """Where markup may start, in order, with the formats that may read it there."""
        out: list[tuple[int, list[ToolFormat]]] = []
        if at_start and self.anchored:
            lead = len(text) - len(text.lstrip())
            out.append((lead, list(self.anchored)))
        if self.opener_re is not None:
            for m in self.opener_re.finditer(text):
                out.append((m.start(), self.by_opener[m.group()]))
        out.sort(key=lambda c: c[0])
        return _merged(out)


def _merged(candidates: list[tuple[int, list[ToolFormat]]]) -> list[tuple[int, list[ToolFormat]]]:
    """One entry per position (the anchored formats and an opener's may start at the same one)."""
    out: list[tuple[int, list[ToolFormat]]] = []
    for at, fmts in candidates:
        if out and out[-1][0] == at:
            out[-1] = (at, out[-1][1] + [f for f in fmts if f not in out[-1][1]])
        else:
            out.append((at, fmts))
    return out


_ASCII_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def _mid_word(before: str, start: str) -> bool:
    """An opener that starts with a letter (`functools[`, `Action:`) is a word: it doesn't start right
    after an ASCII letter or digit (`of`, `dysfunct`). Text without spaces between words (CJK) may."""
    return start[0].isascii() and start[0].isalnum() and before.isascii() and before.isalnum()


def _judge(fmt: ToolFormat, markup: Markup, offered: list[str]) -> Found:
    found = Found(fmt, markup)
    for name, args in markup.calls:
        found.names.append(name)
        if name is None:
            if len(offered) != 1:
                return found
            name = offered[0]
        if name not in offered:
            return found
        found.calls.append((name, args))
    return found


def _head(fmt: ToolFormat) -> str:
    try:
        text = fmt.render([("f", {})]).lstrip()
    except (ValueError, NotImplementedError):
        return ""
    return text[:1]


_ENVELOPE = ':,"{}'  # bytes every chunk's JSON holds: useless to the fast path (and "" when none)
_ESCAPABLE = "<>&"  # characters a JSON encoder may write as \\u00XX (Go's, by default)


def _distinct_at(opener: str) -> int:
    """Where the opener's first punctuation is (what the fast path looks for); its length when none."""
    return next((k for k, ch in enumerate(opener) if not ch.isalnum() and ch not in " _" + _ENVELOPE), len(opener))


def _fast_bytes(by_opener: dict[str, list[ToolFormat]]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """What a content event must hold to possibly start an opener, for the stage's fast path.

    An opener whose first character is punctuation contributes that byte (a split opener's first piece
    holds it): `<`, `[`, `]`, a backtick, `>`..., with the escapes a server may write instead (`\\u003c`, a
    non-ASCII character's `\\uXXXX`). `[` and `]` are in every chunk's `"choices":[...]`, so for them
    the stage looks for a second one (`paired`). An opener that starts with a word or a space (` to=`,
    `Action:`) contributes its text up to its first punctuation: the same starts are seen (a piece cut
    before that punctuation already went out either way), without every `=` in prose taking the slow path."""
    plain: set[bytes] = set()
    paired: set[bytes] = set()
    for opener in by_opener:
        at = _distinct_at(opener)
        if at > 0:
            plain.add(opener[: at + 1].encode())
            continue
        c = opener[0]
        if c in "[]":
            paired.add(c.encode())
            continue
        plain.add(c.encode())
        if c in _ESCAPABLE or not c.isascii():
            plain.add(f"\\u{ord(c):04x}".encode())
            plain.add(f"\\u{ord(c):04X}".encode())
    return tuple(sorted(plain)), tuple(sorted(paired))


def markdown_table(formats: Iterable[ToolFormat]) -> str:
    """The table of docs/formats.md: one row per registered format."""
    rows = ["| name | family | openers | marker-less | fence |", "| --- | --- | --- | --- | --- |"]
    for fmt in sorted(formats, key=lambda f: f.name):
        openers = ", ".join(f"`{o}`" for o in fmt.openers).replace("|", "\\|") or "(none)"
        family = fmt.family.replace("|", "\\|")
        rows.append(
            f"| `{fmt.name}` | {family} | {openers} | {'yes' if fmt.anchored else ''} | {'yes' if fmt.fence else ''} |"
        )
    return "\n".join(rows)


def resolve(calls: list[RawCall], offered: list[str]) -> list[tuple[str, Any]] | None:
    """The calls with their offered names, or None when one isn't offered."""
    out = []
    for name, args in calls:
        if name is None and len(offered) == 1:
            name = offered[0]
        if name is None or name not in offered:
            return None
        out.append((name, args))
    return out
