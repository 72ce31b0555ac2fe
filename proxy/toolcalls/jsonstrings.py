"""The string half of the tolerant JSON reader: where a string ends, its escapes, and what only a lost
fragment explains.

Split from jsonfix.py, which reads the structure: a string is where a tolerant reader most easily
hands out a different call (a quote read as inside a value that a dropped fragment cut short), so its
rules live together here. String scanning jumps between special characters with one regex, so cost
stays linear in the argument size.
"""

from __future__ import annotations

import re

_WS = " \t\r\n"
_SPECIAL = {'"': re.compile(r'["\\\x00-\x1f]|<\|'), "'": re.compile(r"['\\\x00-\x1f]|<\|")}
# Gemma-4 string delimiter `<|"|>` and the fragments of it that leak when split across deltas.
_DEBRIS = re.compile(r'<\|\\?"\|?>?|<\|\\(?!")')
_GEMMA_DELIM = '<|"|>'
_ESCAPED_WS = ("n", "t", "r")
ESCAPED_WHITESPACE = "escaped whitespace between tokens dropped"
# After `, ` inside a value: a quoted word and a colon start the next member, never more of the value.
_NEXT_MEMBER = re.compile(r'[^"\\\s,:{}\[\]]+"(?:\s|\\[nrt])*:')
_BARE_KEY = re.compile(r"[A-Za-z_$][\w$\-]*\s*[:=]")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Cut(Exception):
    """The text ends inside a value: the model wrote more than we have."""


class _Bad(Exception):
    """The text is not JSON-like enough to read."""


class _Spliced(_Bad):
    """A key repeats inside one object: fragments were duplicated or spliced together."""


LOST_STRING_END = "a string runs into the next member: its end was lost"
LOST_QUOTE = "a quote that could end the string is followed by what could follow its end: a fragment was lost"
LOST_COMMA = "a value runs into the next one without a comma: a fragment was lost"
LOST_REST = "a container closes right after a comma: its rest was lost"
LOST_LITERAL = "a bare word that is a literal with a piece missing: a fragment was lost"
LOST_DIGITS = "a number stops after '.', 'e' or a sign: its digits were lost"


class _Lost(_Bad):
    """Text that only a lost fragment explains (`"/tmp/fo, "mode": "w"`, `1 "b"`, `1."b"`); the message says which.

    A repair may fill in only what the evidence proves: where a dropped fragment would leave the same
    text, reading it as a defect of the writer would hand out a different call."""

    def __init__(self, reason: str = LOST_STRING_END) -> None:
        super().__init__(reason)
        self.reason = reason


class StringScanner:
    """Mixin of `jsonfix._Reader`: the methods that read and end strings."""

    __slots__ = ("text", "n", "pos")
    text: str
    n: int
    pos: int

    def fix(self, kind: str) -> None:  # pragma: no cover - the reader's
        raise NotImplementedError

    def closes(self, k: int, ctx: str) -> bool:
        """Whether a quote at k-1 ends the string: it must be followed by what can follow a string.

        In an object, a comma counts only when a member (or the object's end) follows it; a quote
        followed by a comma that starts no member is not an end, but not proof of an inner quote
        either (`could_end`)."""
        k = self._after_space(k)
        if k >= self.n:
            return True
        c = self.text[k]
        if ctx == "key":
            return c == ":"
        if ctx == "top":
            return True
        if c != ",":
            return c in "}]"
        if ctx != "object":
            return True
        k = self._after_space(k + 1)
        return k >= self.n or self.text[k] in "\"'}" or _BARE_KEY.match(self.text, k) is not None

    def could_end(self, k: int, quote: str) -> bool:
        """Whether a quote at k-1 that `closes` rejected is followed by what follows a string's end in some
        JSON: a separator, a closer, a colon or another quote. A dropped fragment leaves exactly that
        (`"ls -la",README.md"` of `"ls -la","path":"README.md"`), so reading the quote as part of the
        value would guess; only a letter, a digit or any other character that never follows a string's
        end (`"echo "hi" now"`) shows the quote is inside it."""
        k = self._after_space(k)
        return k < self.n and (self.text[k] in ',}]:"' or self.text[k] == quote)

    def _after_space(self, k: int) -> int:
        text, n = self.text, self.n
        while k < n:
            if text[k] in _WS:
                k += 1
            elif text[k] == "\\" and text[k + 1 : k + 2] in _ESCAPED_WS:
                k += 2
            else:
                break
        return k

    def _starts_next_member(self, j: int) -> bool:
        """Whether the quote at j ends a key (`…h": "src`) or opens one right after a comma: either way
        the value before it lost its end, and reading on would swallow a member."""
        text = self.text
        k = self._after_space(j + 1)
        if k < self.n and text[k] == ":":
            return True
        k = j - 1
        while k >= 0 and text[k] in _WS:
            k -= 1
        return k >= 0 and text[k] == "," and _NEXT_MEMBER.match(text, j + 1) is not None

    def string(self, quote: str, ctx: str) -> str:
        text, n = self.text, self.n
        special = _SPECIAL[quote]
        parts: list[str] = []
        i = self.pos + 1
        while True:
            m = special.search(text, i)
            if m is None:
                raise _Cut("string")
            j = m.start()
            if j > i:
                parts.append(text[i:j])
            c = text[j]
            if c == quote:
                if self.closes(j + 1, ctx):
                    self.pos = j + 1
                    return "".join(parts)
                if ctx == "key" or self._starts_next_member(j):
                    # A key never holds a quote: `"case_insensitiv` + `lse, "max_results":` lost `e": fa`
                    raise _Lost(LOST_STRING_END)
                if self.could_end(j + 1, quote):
                    raise _Lost(LOST_QUOTE)
                self.fix("unescaped_quote")
                parts.append(quote)
                i = j + 1
            elif c == "\\":
                i = self.escape(j, parts)
            elif c == "<":
                d = _DEBRIS.match(text, j)
                if d is None:
                    parts.append("<")
                    i = j + 1
                    continue
                self.fix("delimiter_debris")
                end = d.end()
                started = any(parts)
                if '"' in d.group() and started and (end >= n or text[end] != quote) and self.closes(end, ctx):
                    self.pos = end
                    return "".join(parts)
                i = end
            else:
                self.fix("control_character")
                parts.append(c)
                i = j + 1

    def escape(self, j: int, parts: list[str]) -> int:
        text, n = self.text, self.n
        if j + 1 >= n:
            raise _Cut("string")
        e = text[j + 1]
        if e in _ESCAPES:
            parts.append(_ESCAPES[e])
            return j + 2
        if e == "u":
            if j + 6 > n:
                if re.fullmatch(r"[0-9a-fA-F]*", text[j + 2 :]):
                    raise _Cut("string")
            digits = text[j + 2 : j + 6]
            if re.fullmatch(r"[0-9a-fA-F]{4}", digits):
                code = int(digits, 16)
                if 0xD800 <= code < 0xDC00 and text.startswith("\\u", j + 6):
                    low_digits = text[j + 8 : j + 12]
                    if re.fullmatch(r"[0-9a-fA-F]{4}", low_digits) and 0xDC00 <= int(low_digits, 16) < 0xE000:
                        low = int(low_digits, 16)
                        parts.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                        return j + 12
                parts.append(chr(code))
                return j + 6
        if e == "'":
            parts.append("'")
            return j + 2
        self.fix("unescaped_backslash")
        parts.append("\\")
        return j + 1
