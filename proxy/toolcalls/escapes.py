"""Backslashes in tool-call arguments, read on evidence.

A model that writes a Windows path without doubling its backslashes (`C:\\temp\\new`) sends text where
some pairs happen to be valid JSON escapes: json.loads reads `\\t` and `\\n` as a tab and a newline and
the path is silently corrupted, even though the text parses. This module finds the tokens where that
can have happened and says which reading the evidence supports; it never decodes anything itself.

A token is a run of a string literal's raw text without real whitespace, so a decision never spreads
over a multi-line string: code holding a `\\d` regex and `\\n` newlines keeps its newlines. A token is
path-shaped when it holds a drive (`X:\\`), a UNC prefix (`\\\\host\\`), or is `name\\name(\\name)*`.
Evidence that its backslashes are literal is strong (a drive or UNC prefix, an invalid escape in the
same token, a property that is a path) or weak (plain names whose escapes all look valid). Only a
token whose separators are all single backslashes counts: `C:\\\\temp\\nnext` is a well-escaped path
followed by a newline.

Arguments that parse are trusted except where the shape alone says "path" (a drive, a UNC path with
two names or more): a path property holding `"a\\nb"` holds a newline as far as anyone can tell, and a
well-formed stream passes as sent. Where the text shows unescaped backslashes elsewhere, a path
property and an invalid escape in the token count too.

Cost: one regex (`GATE`) over the raw text decides whether anything needs a closer look; normal
arguments stop there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

# A single backslash before a letter that JSON decodes to a control character, right after a path
# character or a drive's colon; or an unescaped UNC prefix. Everything else is left to json.loads.
GATE: Final = re.compile(r"[\w.~$%@+\-:]\\[bfnrt]|(?<!\\)\\\\[\w.$\-]+\\(?!\\)")

_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)
_STRUCTURE = re.compile(r"[{}\[\],]")
_COLON = re.compile(r"(?:\s|\\[nrt])*:")
_TOKEN = re.compile(r"\S+")
_NAME = r"[\w.~$%@+\-]"
_DRIVE = re.compile(r"(?<![\w\\])[A-Za-z]:\\[\w.~$%@+\-\\]*")
_UNC = re.compile(r"(?<![\w\\])\\\\[\w.$\-]+\\[\w.~$%@+\-\\]*")
_NAMES = re.compile(rf"{_NAME}+(?:\\{_NAME}+)+")
_WRAP_HEAD = re.compile(r'(?:\\"|["\'(\[{<=])+')
_WRAP_TAIL = re.compile(r'(?:\\"|["\')\]}>,;:])+$')
_RUN = re.compile(r"\\+")
_ESCAPE_LETTER_NAME = re.compile(r"\\[bfnrt](?=\\|$)")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_INVALID_ESCAPE = re.compile(r'(?<!\\)(?:\\\\)*\\(?:[^"\\/bfnrtu]|u(?![0-9a-fA-F]{4}))')
_RAW_CONTROL = re.compile(r"[\x00-\x1f]")

_PATH_WORDS: Final = frozenset(
    "path paths file files filename filenames filepath filepaths pathname dir dirs dirname directory"
    " directories folder folders cwd workdir".split()
)
_PATH_DESCRIPTION = re.compile(
    r"\s*(?:the\s+|an?\s+)?(?:(?:absolute|relative|full|local)\s+)?(?:path|file\s*path|file\s*name|directory|folder)\b",
    re.I,
)
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


@dataclass(frozen=True, slots=True)
class PathToken:
    """A path-shaped part of a string literal whose JSON reading differs from the literal one."""

    key: str | None  # the member it belongs to (an array's elements belong to the array's key)
    start: int  # span in the arguments text
    end: int
    literal: str  # the span with its literal backslashes doubled, ready to be spliced in
    strong: bool  # a drive, a UNC prefix, an invalid escape in the token, or a path property
    separators: int
    overrules_json: bool  # strong even in arguments that parse: a drive, or a UNC path of 2+ names

    def shown(self, text: str) -> str:
        return text[self.start : self.end]


@dataclass(slots=True)
class EscapeReading:
    """Which path-shaped tokens to read literally, and which ones the evidence doesn't decide."""

    literal: list[PathToken]
    ambiguous: list[PathToken]


def read_escapes(text: str, props: dict[str, Any] | None, valid: bool) -> EscapeReading:
    """Decide per token. Valid JSON is trusted unless the token's shape is a drive or UNC path; in text that shows
    unescaped backslashes elsewhere, plain names with two or more separators (`src\\new\\table`) may
    be a path or lines of text: both readings are returned for the caller to try against the schema."""
    tokens = path_tokens(text, props)
    if not tokens:
        return EscapeReading([], [])
    if valid:
        return EscapeReading([t for t in tokens if t.overrules_json], [])
    literal = [t for t in tokens if t.strong]
    weak = [t for t in tokens if not t.strong and t.separators >= 2]
    if weak and not unescaped_backslashes(text):
        weak = []
    return EscapeReading(literal, weak)


def path_like_key(key: str) -> bool:
    """`path`, `file_path`, `targetFile`, `working_dir`: the last word names a path (`file_content` doesn't)."""
    words = [w.lower() for w in _WORD.findall(key)]
    return bool(words) and (words[-1] in _PATH_WORDS or key.lower() in _PATH_WORDS)


def path_like_property(key: str | None, props: dict[str, Any] | None) -> bool:
    """A string property that is a path by its name or by a description that says it is one."""
    if key is None:
        return False
    prop = props.get(key) if props else None
    if not isinstance(prop, dict):
        return path_like_key(key)
    if not _holds_strings(prop):
        return False
    description = prop.get("description")
    return path_like_key(key) or (isinstance(description, str) and _PATH_DESCRIPTION.match(description) is not None)


def _holds_strings(prop: dict[str, Any]) -> bool:
    kind = prop.get("type")
    if kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    items = prop.get("items")
    return kind == "array" and isinstance(items, dict) and items.get("type") in (None, "string")


def unescaped_backslashes(text: str) -> bool:
    """Evidence that the writer left backslashes (or control characters) unescaped somewhere."""
    for m in _STRING.finditer(text):
        body = m.group(1)
        if _INVALID_ESCAPE.search(body) or _RAW_CONTROL.search(body):
            return True
    return False


def path_tokens(text: str, props: dict[str, Any] | None) -> list[PathToken]:
    """The path-shaped tokens of the string values in `text` whose backslashes may be literal."""
    if GATE.search(text) is None:
        return []
    tokens: list[PathToken] = []
    for start, end, key in _values(text):
        body = text[start:end]
        if "\\" not in body:
            continue
        path_prop = path_like_property(key, props)
        for t in _TOKEN.finditer(body):
            if GATE.search(body, t.start(), t.end()) is None:
                continue  # a token `_examine` keeps holds a control escape after a path character, or a UNC
            token = _examine(t.group(), start + t.start(), key, path_prop)
            if token is not None:
                tokens.append(token)
    return tokens


def with_literal(text: str, tokens: list[PathToken]) -> str:
    """`text` with the given tokens' backslashes made literal (doubled)."""
    parts: list[str] = []
    pos = 0
    for token in sorted(tokens, key=lambda t: t.start):
        parts.append(text[pos : token.start])
        parts.append(token.literal)
        pos = token.end
    parts.append(text[pos:])
    return "".join(parts)


def _values(text: str) -> list[tuple[int, int, str | None]]:
    """(start, end, owning key) of every string value's raw body; keys are told by a following `:`."""
    frames: list[tuple[bool, str | None]] = [(False, None)]  # (is an object, key owning the container)
    pending: str | None = None
    out: list[tuple[int, int, str | None]] = []
    pos = 0
    for m in _STRING.finditer(text):
        for s in _STRUCTURE.finditer(text, pos, m.start()):
            c = s.group()
            if c in "{[":
                owner = pending if frames[-1][0] else frames[-1][1]
                frames.append((c == "{", owner))
                pending = None
            elif c in "}]":
                if len(frames) > 1:
                    frames.pop()
                pending = None
            elif frames[-1][0]:
                pending = None
        pos = m.end()
        if frames[-1][0] and _COLON.match(text, pos):
            pending = m.group(1)
            continue
        out.append((m.start(1), m.end(1), pending if frames[-1][0] else frames[-1][1]))
    return out


def _examine(token: str, offset: int, key: str | None, path_prop: bool) -> PathToken | None:
    m = _DRIVE.search(token) or _UNC.search(token)
    if m is not None and m.re is _DRIVE and m.end() - m.start() < 5:
        m = None  # `if x:\n` is code: a drive needs more than one letter after its backslash
    # `if x:\n\t\treturn`: a first name that is only an escape's letter may be code's escapes, so in
    # arguments that parse the shape alone doesn't overrule json's reading (`C:\f\0` doesn't parse).
    letter_first = m is not None and m.re is _DRIVE and _ESCAPE_LETTER_NAME.match(token, m.start() + 2, m.end())
    if m is not None:
        a, b, strong, shaped = m.start(), m.end(), True, True
        if b < len(token) and token[b] == '"':
            b -= _odd_tail(token[a:b])  # the backslash of a `\"` that ends the path is the quote's
        unc = m.re is _UNC
    else:
        head = _WRAP_HEAD.match(token)
        a = head.end() if head else 0
        tail = _WRAP_TAIL.search(token, a)
        b = tail.start() if tail else len(token)
        if _NAMES.fullmatch(token, a, b) is None or _ESCAPE_LETTER_NAME.search(token, a, b):
            return None  # `re\\n\\nPATTERN`: a name that is only an escape's letter is two escapes
        strong, unc, shaped = path_prop, False, False
    region = token[a:b]
    runs = list(_RUN.finditer(region))
    if not runs:
        return None
    control = invalid = False
    for k, run in enumerate(runs):
        length = len(run.group())
        if unc and k == 0:
            continue
        if length != 1:
            return None  # a doubled separator: the writer escaped this token
        nxt = region[run.end() : run.end() + 1]
        if nxt in ("b", "f", "n", "r", "t"):
            control = True
        elif nxt == "u" and _HEX4.match(region, run.end() + 1) is not None:
            return None  # a real `\\uXXXX`: whoever wrote this token escaped it
        else:
            invalid = True
    if unc and (len(runs[0].group()) != 2 or len(runs) < 2):
        return None  # `\\\\host\\` is a well-escaped UNC prefix (or not one at all)
    if not control and not unc:
        return None  # json's reading already keeps these backslashes
    literal = _RUN.sub(lambda r: r.group() * 2, region)
    # In arguments that parse, the shape alone must say "path": `\\\\section\\n` is LaTeX and a newline,
    # and a path property holding "a\\nb" holds a newline as far as anyone can tell.
    overrules = shaped and not letter_first and (not unc or len(runs) >= 3)
    return PathToken(key, offset + a, offset + b, literal, strong or invalid or path_prop, len(runs), overrules)


def _odd_tail(region: str) -> int:
    n = len(region) - len(region.rstrip("\\"))
    return n % 2
