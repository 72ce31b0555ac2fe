"""The block structure a reader sees around a point of a model's text: whether the point is inside a
container (a fence, an indented code line, `<pre>`/`<code>`, inline code, quotes, a list item, a table
row, a blockquote) and whether the prose before it in its paragraph ended a sentence.

Tool-call markup counts only at block level (`placement.py` states the rule). The structure is read line
by line, Markdown-like, and kept as a few fields (`Context`), so a stream carries it across deltas
(`feed`) and a point inside held text reads exactly as it would in the whole text, whatever the splits:
the current line is kept as text until it ends (a long one is read in pieces cut where no token can be
cut), everything before it only as the fields.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_LIST_ITEM = re.compile(r"([-*+]|\d{1,9}[.)])([ \t]+)")
_DELIMITER_ROW = re.compile(r"\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*")
_TOKEN = re.compile(r"`+|<[^<>\n]{1,64}>")
_HTML_OPEN = re.compile(r"<(pre|code)(?:\s[^<>]*)?>", re.I)
_QUOTES = re.compile('["“”„«»「」『』‘’]')
# A special token (`<|im_end|>`, `<｜end▁of▁sentence｜>`, `<tool_call|>`, `</s>`): structure, not prose.
SPECIAL = re.compile(r"<[|｜][^<>\n]{0,48}>|<[^<>|｜\s]{1,48}[|｜]>|</s>|<eos>|<end_of_turn>|<seed:eos>")
# A line holding only tags and special tokens (`</answer>`, `<|tool_calls_section_end|>`): no prose.
TAGS_ONLY = re.compile(r"(?:\s*(?:</?[A-Za-z][\w:.-]{0,40}>|" + SPECIAL.pattern + r"))*\s*")
_TERMINATORS = frozenset(".!?。！？…｡．")
_CLOSERS = "\"'”’)]»」』*_"  # what may close a sentence after its full stop
_PAIRS = {"“": "”", "„": "“”", "«": "»", "「": "」", "『": "』", "‘": "’"}
_MAX_QUOTES = 8
_LONG_LINE = 256  # the current line is read in pieces past this (cut where no token can be)
CONTAINERS = ("fence", "html", "code", "quote", "list", "table", "inline_code", "quoted")


@dataclass(frozen=True, slots=True)
class Point:
    """Where a point stands. `container`: "" at block level, else what encloses it (one of `CONTAINERS`);
    `think`: inside an open `<think>` (markup there is a decoy when the think closes after it); `ended`:
    the paragraph before the point is empty or ends a sentence (or a special token, a closed think)."""

    container: str
    think: bool
    ended: bool


class Context:
    """What a text leaves open for what follows it; `feed` reads more text, `point` says where its end stands."""

    __slots__ = (
        "fence",
        "html",
        "think",
        "para",
        "block",
        "list_indent",
        "quotes",
        "code_run",
        "ended",
        "line",
        "kind",
    )

    def __init__(self) -> None:
        self.fence = ""  # the open fence's run (```` ``` ````, `~~~~`): lines are code up to its close
        self.html = ""  # an open <pre> or <code>: raw up to its close tag
        self.think = False  # an open <think>
        self.para = False  # a non-blank line was read since the last blank one
        self.block = ""  # the container the paragraph went into: "list", "quote" or "table"
        self.list_indent = 0  # the content column of the last list item (a list goes on past blank lines)
        self.quotes = ""  # the quotes open in the paragraph, innermost last
        self.code_run = 0  # the backtick run of an open inline code span
        self.ended = True  # the paragraph so far is empty or ends a sentence
        self.line = ""  # the current line as far as it is not read yet
        self.kind: str | None = None  # the current line's kind once a piece of it was read

    def copy(self) -> Context:
        new = Context.__new__(Context)  # every slot by name: a `point` per held delta copies one
        new.fence, new.html, new.think, new.para = self.fence, self.html, self.think, self.para
        new.block, new.list_indent, new.quotes, new.code_run = self.block, self.list_indent, self.quotes, self.code_run
        new.ended, new.line, new.kind = self.ended, self.line, self.kind
        return new

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Context) and all(getattr(self, n) == getattr(other, n) for n in Context.__slots__)

    def __repr__(self) -> str:
        return "Context(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in Context.__slots__) + ")"

    # -- reading ------------------------------------------------------------------------------------
    def feed(self, text: str) -> Context:
        """Read `text` (what follows everything read so far); returns self."""
        if not text:
            return self
        lines = (self.line + text).split("\n")
        for line in lines[:-1]:
            self._line(line, complete=True)
            self.kind = None
        self.line = lines[-1]
        if len(self.line) > _LONG_LINE:
            self._read_piece()
        return self

    def point(self, more: str = "") -> Point:
        """Where the end of what was read, and `more` after it, stands (the start of what comes next);
        nothing is read for good."""
        probe = self.copy()
        if more:
            probe.feed(more)
        kind = probe._line(probe.line, complete=False)
        container = kind if kind in CONTAINERS else probe.block
        if not container and probe.fence:
            container = "fence"
        if not container and probe.html:
            container = "html"
        if not container and probe.code_run:
            container = "inline_code"
        if not container and probe.quotes:
            container = "quoted"
        return Point(container, probe.think, probe.ended)

    def skip(self, markup: str) -> Context:
        """Pass over a call's markup without reading it as prose: what follows it reads as the rest of the
        line it ends on, after a sentence's end."""
        self._line(self.line, complete=False)
        self.line = ""
        if "\n" in markup or self.kind is None:
            self.kind = ""
        self.para = True
        self.ended = True
        return self

    # -- lines --------------------------------------------------------------------------------------
    def _line(self, line: str, complete: bool) -> str:
        """Read (a piece of) one line; `complete`: it ended with a newline. Returns its kind: "" for
        prose, "blank", or one of `CONTAINERS`."""
        if self.fence:
            if complete and self.kind is None and _closes(line, self.fence):
                self.fence = ""
                self._new_paragraph()
            return "fence"
        start = 0
        kind = self.kind
        if self.html:
            close = line.lower().find(f"</{self.html}>")
            if close < 0:
                return "html"
            start = close + len(self.html) + 3
            self.html = ""
            kind = kind or ""
        elif kind is None:
            kind = self._classify(line, complete)
        self.kind = kind
        if kind == "blank":
            if complete:
                self._new_paragraph()
            return kind
        if kind.startswith(("`", "~")):  # a fence's opening line: its info string is no prose
            if complete:
                self.fence = kind
                self._new_paragraph()
            return "fence"
        if kind != "code":
            self._tokens(line, start)
            self.para = True
        return kind

    def _classify(self, line: str, complete: bool) -> str:
        """A line's kind from its start: blank, a fence's run, or the container it opens."""
        body = line.lstrip(" \t")
        width = _width(line[: len(line) - len(body)])
        under_list = bool(self.list_indent) and width >= self.list_indent
        if not body and complete:
            return "blank"
        if width >= 4:
            return "list" if under_list else "code"
        if not body:
            return "list" if under_list else ""  # a point at the start of a line's text
        if m := _FENCE.match(line):
            run = m.group(1)
            if run[0] == "~" or "`" not in line[m.end() :]:
                return run
        kind = ""
        if body[0] == ">":
            kind = "quote"
        elif item := _LIST_ITEM.match(body):
            kind = "list"
            self.list_indent = width + len(item.group(1)) + min(len(item.group(2)), 4)
        elif under_list:
            kind = "list"  # a list item's content after a blank line
        elif body[0] == "|" or (self.para and "|" in body and _DELIMITER_ROW.fullmatch(body.rstrip())):
            kind = "table"
        if kind != "list" and not self.para:
            self.list_indent = 0  # a paragraph not indented under the list ends it
        if kind:
            self.block = kind
        return kind

    def _tokens(self, line: str, start: int) -> None:
        """Inline code spans, tags and quotes of a line from `start`."""
        pos = start
        for m in _TOKEN.finditer(line, start):
            token = m.group()
            if m.start() < pos:
                continue
            if self.code_run:
                if token[0] == "`" and len(token) == self.code_run:
                    self.code_run = 0
                    self.ended = False
                    pos = m.end()
                continue
            self._prose(line[pos : m.start()])
            pos = m.end()
            if token[0] == "`":
                self.code_run = len(token)
                continue
            low = token.lower()
            if low == "<think>":
                self.think = True
            elif low == "</think>":
                self.think = False
                self.ended = True
            elif html := _HTML_OPEN.fullmatch(token):
                name = html.group(1).lower()
                close = line.lower().find(f"</{name}>", pos)
                if close < 0:
                    self.html = name
                    return
                pos = close + len(name) + 3
                self.ended = False
            elif SPECIAL.fullmatch(token):
                self.ended = True
        if not self.code_run:
            self._prose(line[pos:])

    def _prose(self, text: str) -> None:
        if not text:
            return
        for q in _QUOTES.finditer(text):
            at = q.start()
            if at == 0 or text[at - 1] != "\\":
                self._quote(q.group())
        tail = text.rstrip()
        if tail:
            last = (tail.rstrip(_CLOSERS) or tail)[-1]
            self.ended = last in _TERMINATORS or unicodedata.category(last) == "So"

    def _quote(self, ch: str) -> None:
        top = self.quotes[-1:]
        if ch == '"':
            if top == '"':
                self.quotes = self.quotes[:-1]
                return
        elif top and ch in _PAIRS.get(top, ""):
            self.quotes = self.quotes[:-1]
            return
        if ch in _PAIRS or ch == '"':
            if len(self.quotes) < _MAX_QUOTES:
                self.quotes += ch

    def _new_paragraph(self) -> None:
        self.para = False
        self.block = ""
        self.quotes = ""
        self.code_run = 0
        self.ended = True

    def _read_piece(self) -> None:
        """Read the front of a long line now, cut where no token can be: not after a `<` that isn't closed,
        next to a backtick, after a backslash or before a quote."""
        line = self.line
        for cut in range(len(line) - 128, max(len(line) - 128 - _LONG_LINE, 64), -1):
            if line[cut] in "`<\\" or line[cut + 1] == "`" or _QUOTES.match(line, cut + 1):
                continue
            lt = line.rfind("<", cut - 64, cut + 1)  # a tag can't hold a `<`: only the last one may be open
            if lt >= 0 and line.find(">", lt, cut + 1) < 0:
                continue
            self.line = ""
            self._line(line[: cut + 1], complete=False)
            if self.kind is None:
                self.kind = "fence"  # a line inside a fence: too long to close it
            self.line = line[cut + 1 :]
            return


def _closes(line: str, fence: str) -> bool:
    m = _FENCE.match(line)
    return m is not None and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end() :].strip()


def _width(indent: str) -> int:
    width = 0
    for ch in indent:
        width = width + 4 - width % 4 if ch == "\t" else width + 1
    return width
