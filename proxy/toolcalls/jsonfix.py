"""A tolerant JSON reader for tool-call arguments that says what it fixed and where text was cut.

json.loads is always tried first by callers; this reader only runs on text that failed it. It must
tell a value the model finished (repairable: a missing `}` after a closed string) from one that was
cut (unrecoverable: the text stops inside a string or after `1.`), because omp and pi silently
"complete" partial JSON and write half files. Strings are read by the mixin in jsonstrings.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.toolcalls.jsonstrings import (
    _ESCAPED_WS,
    _GEMMA_DELIM,
    _WS,
    ESCAPED_WHITESPACE,
    LOST_COMMA,
    LOST_DIGITS,
    LOST_LITERAL,
    LOST_REST,
    LOST_STRING_END,
    StringScanner,
    _Bad,
    _Cut,
    _Lost,
    _Spliced,
)

MISSING: Any = object()

_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_NUMBER_LOOSE = re.compile(r"[-+]?\d*\.?\d*(?:[eE][-+]?\d*)?")
_SIGNED_NUMBER = re.compile(r"\+(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_STRICT_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_WORD = re.compile(r"[A-Za-z_$][\w$.\-]*")
_LITERALS: dict[str, Any] = {
    "true": True,
    "false": False,
    "null": None,
    "True": True,
    "False": False,
    "None": None,
}


@dataclass(slots=True)
class Parsed:
    value: Any = MISSING
    fixes: list[str] = field(default_factory=list)
    cut: str | None = None  # what the text stopped inside of: "string", "number", "value", ...
    bad: bool = False
    spliced: bool = False
    lost: bool = False  # a fragment was lost (a string's end, a comma, a number's digits): `lost_reason` says which
    lost_reason: str = ""
    closed: int = 0  # brackets closed at the end because they were missing
    ends_on_number: bool = False  # the last token is a number at the very end (maybe cut short)
    rest: str = ""  # text after the first complete top-level value
    partial: dict[str, Any] | None = None  # completed members of the top-level object when cut


class _Reader(StringScanner):
    __slots__ = ("fixes", "closed", "top", "last_number_end", "quoted_keys")  # text, n, pos: StringScanner's

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)
        self.pos = 0
        self.fixes: list[str] = []
        self.closed = 0
        self.top: dict[str, Any] | None = None
        self.last_number_end = -1
        self.quoted_keys = False

    def skip(self) -> None:
        text, n, pos = self.text, self.n, self.pos
        while pos < n:
            if text[pos] in _WS:
                pos += 1
            elif text[pos] == "\\" and text[pos + 1 : pos + 2] in _ESCAPED_WS:
                self.fix(ESCAPED_WHITESPACE)  # `\n` written outside any string: whitespace noise
                pos += 2
            else:
                break
        self.pos = pos

    def fix(self, kind: str) -> None:
        if kind not in self.fixes:
            self.fixes.append(kind)

    def value(self, ctx: str, depth: int) -> Any:
        if depth > 200:
            raise _Bad("too deep")
        self.skip()
        if self.pos >= self.n:
            raise _Cut("value")
        c = self.text[self.pos]
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.arr(depth)
        if c == '"' or c == "'":
            if c == "'":
                self.fix("single_quotes")
            return self.string(c, ctx)
        if c.isdigit() or c in "-+.":
            return self.number()
        if c == "<" and self.text.startswith(_GEMMA_DELIM, self.pos):
            self.fix("delimiter_debris")
            end = self.text.find(_GEMMA_DELIM, self.pos + len(_GEMMA_DELIM))
            if end < 0:
                raise _Cut("string")
            value = self.text[self.pos + len(_GEMMA_DELIM) : end]
            self.pos = end + len(_GEMMA_DELIM)
            return value
        return self.word(ctx)

    def obj(self, depth: int) -> dict[str, Any]:
        self.pos += 1
        result: dict[str, Any] = {}
        if self.top is None:
            self.top = result
        # `{"a": 1]` or `{"a": 1, ]`: a `[` (or a member and the `}`) was lost; `{"a": 1 "b": 2}` is also
        # `{"a": 15, "b": 2}` with `5,` dropped
        for _ in self.members("}", "]"):
            key = self.key()
            if key in result:
                raise _Spliced(key)
            self.skip()
            if self.pos >= self.n:
                raise _Cut("key")
            if self.text[self.pos] != ":":
                if self.text[self.pos] != "=":
                    raise _Bad("expected ':'")
                self.fix("bare_word")
            self.pos += 1
            self.skip()
            if self.pos >= self.n:
                raise _Cut("value")
            result[key] = self.value("object", depth + 1)
        return result

    def key(self) -> str:
        c = self.text[self.pos]
        if c == '"' or c == "'":
            if c == "'":
                self.fix("single_quotes")
            self.quoted_keys = True
            return self.string(c, "key")
        m = _WORD.match(self.text, self.pos)
        if m is None:
            raise _Bad("expected a key")
        if m.end() >= self.n:
            raise _Cut("key")
        self.fix("bare_word")
        self.pos = m.end()
        return m.group()

    def arr(self, depth: int) -> list[Any]:
        self.pos += 1
        result: list[Any] = []
        # `["a"}` or `["a", }`: a `{` (or the rest of the array and `]`) was lost; `[1 2]` is also `[1, 12]`
        # with `, 1` dropped
        for _ in self.members("]", "}"):
            result.append(self.value("array", depth + 1))
        return result

    def members(self, close: str, other: str) -> Iterator[None]:
        """Stops at each member of the object or array being read (the caller reads it), past white space
        and separators, until `close`; a cut, a lost piece or a fix where the separators say so. `other`
        is the other container's close: met here, a piece of the text was lost."""
        after_value = after_comma = False
        count = 0
        while True:
            self.skip()
            if self.pos >= self.n:
                if after_comma or not count:
                    raise _Cut("member")
                self.closed += 1
                return
            c = self.text[self.pos]
            if c == close or c == other:
                if c == other:
                    raise _Lost(LOST_REST)
                if after_comma:
                    self.fix("trailing_comma")
                self.pos += 1
                return
            if c == "," or (c == ";" and after_value):
                if not after_value:
                    raise _Lost(LOST_REST)  # `{, "b": 1}` / `[1, , 2]`: a member between the commas was lost
                if c == ";":
                    self.fix("semicolon_separator")  # a separator no drop can leave: Python-ish `a; b`
                self.pos += 1
                after_value, after_comma = False, True
                continue
            if after_value:
                self.missing_separator(c)
            yield
            count += 1
            after_value, after_comma = True, False

    @staticmethod
    def missing_separator(c: str) -> None:
        """A value followed by the start of another with no comma between: what a dropped fragment leaves
        (`1 "b"` of `15, "b"`, `1ue` of `1, true`), never a writer's slip we could prove. Anything else
        there (`1; "b"`) is not JSON at all and left to the last resort."""
        if c in "\"'{[<+-." or c.isalnum() or c in "_$":
            raise _Lost(LOST_COMMA)
        raise _Bad("expected ','")

    def number(self) -> Any:
        text = self.text
        m = _NUMBER_LOOSE.match(text, self.pos)
        token = m.group() if m else ""
        end = self.pos + len(token)
        if not token:
            raise _Bad("not a number")
        if end >= self.n and not _STRICT_NUMBER.fullmatch(token):
            raise _Cut("number")
        if token[-1] in ".eE+-":
            raise _Lost(LOST_DIGITS)  # `1."b"` or `1.,`: the digits after the point (and maybe more) were lost
        self.pos = end
        if end >= self.n:
            self.last_number_end = end
        if _STRICT_NUMBER.fullmatch(token):
            return float(token) if any(c in token for c in ".eE") else int(token)
        strict = _NUMBER.fullmatch(token)
        if strict is None:
            raise _Bad("not a number")
        if not _SIGNED_NUMBER.fullmatch(token):
            raise _Lost(LOST_DIGITS)  # `0000` of `120000`, `.5` of `0.5`: only a leading `+` is no drop's doing
        self.fix("number_format")
        value = float(token)
        return int(value) if value.is_integer() and not any(c in token for c in ".eE") else value

    def word(self, ctx: str) -> Any:
        text, n = self.text, self.n
        m = _WORD.match(text, self.pos)
        if m is None:
            raise _Bad("unexpected character")
        token = m.group()
        if token in _LITERALS:
            if m.end() >= n and token not in ("None",):
                pass
            if token[0].isupper():
                self.fix("python_literal")
            self.pos = m.end()
            return _LITERALS[token]
        if m.end() >= n and any(lit.startswith(token) for lit in _LITERALS):
            raise _Cut("literal")
        if _literal_with_a_piece_lost(token) or _literal_run_on(token):
            raise _Lost(LOST_LITERAL)  # `rue` of `true`, `fse` of `false`: a fragment of the literal was lost
        # A bare word: read it as a string up to the next delimiter of the context.
        stop = re.compile(r"[,}\]\n]") if ctx != "top" else re.compile(r"$")
        s = stop.search(text, self.pos)
        end = s.start() if s else n
        if end >= n and ctx != "top":
            raise _Cut("value")
        value = text[self.pos : end].strip()
        if self.quoted_keys:
            raise _Lost(LOST_STRING_END)  # a writer who quotes keys quotes strings: this one lost its quote
        if '"' in value:
            raise _Lost(
                LOST_STRING_END
            )  # `{"path": set": 1, ...}`: a bare word never holds a quote; a string lost its start
        self.fix("bare_word")
        self.pos = end
        return value


def _literal_run_on(word: str) -> bool:
    """A word that starts like a literal and goes on (`trueull`, `tr1`, `nul0`): a literal with the
    rest of the text spliced onto it after a drop; a bare string never needs to start so."""
    return len(word) >= 2 and any(lit.startswith(word[:2]) for lit in _LITERALS) and word[:1] in "tfnTFN"


def _literal_with_a_piece_lost(word: str) -> bool:
    """Whether `word` is a literal with one contiguous piece removed (`rue`, `tr`, `fse`, `nul`)."""
    return any(
        len(word) < len(lit) and lit.startswith(word[:k]) and lit.endswith(word[k:])
        for lit in _LITERALS
        for k in range(len(word) + 1)
    )


def loads_tolerant(text: str) -> Parsed:
    """Read the first JSON-ish value of `text`; never raises."""
    reader = _Reader(text)
    reader.skip()
    if reader.pos >= reader.n:
        return Parsed()
    try:
        value = reader.value("top", 0)
    except _Cut as cut:
        return Parsed(fixes=reader.fixes, cut=str(cut), partial=reader.top)
    except _Spliced:
        return Parsed(fixes=reader.fixes, bad=True, spliced=True, partial=reader.top)
    except _Lost as lost:
        return Parsed(fixes=reader.fixes, bad=True, lost=True, lost_reason=lost.reason, partial=reader.top)
    except (_Bad, RecursionError):
        return Parsed(fixes=reader.fixes, bad=True, partial=reader.top)
    if reader.closed:
        reader.fix("closed_brackets")
    return Parsed(
        value=value,
        fixes=reader.fixes,
        closed=reader.closed,
        ends_on_number=reader.last_number_end == reader.n,
        rest=text[reader.pos :],
    )


_DEBRIS_TAIL = re.compile(r'(?:\s|\\[nrt]|["\'`}\]]|</tool_call>|</function>|<\|tool_calls?_(?:section_)?end\|>)*')


def is_debris(rest: str) -> bool:
    """Whether text after a complete value is only stray quotes, closers or end markers."""
    return _DEBRIS_TAIL.fullmatch(rest) is not None


def strip_gemma_delimiters(value: Any) -> tuple[Any, bool]:
    """Remove whole `<|"|>` tokens from string values (they are special tokens, never payload)."""
    if isinstance(value, str):
        if _GEMMA_DELIM in value:
            return value.replace(_GEMMA_DELIM, ""), True
        return value, False
    if isinstance(value, dict):
        changed = False
        out: dict[str, Any] = {}
        for k, v in value.items():
            out[k], c = strip_gemma_delimiters(v)
            changed |= c
        return (out, True) if changed else (value, False)
    if isinstance(value, list):
        items = [strip_gemma_delimiters(v) for v in value]
        if any(c for _, c in items):
            return [v for v, _ in items], True
    return value, False
