"""The byte scanner under `jsonsplice`: members, values and strings of JSON bytes found without parsing them.

A skipped value (a 5 MB `messages` array) is crossed by jumping from one structural character to the next with a
compiled regex and over each string with `bytes.find`, so the Python loop runs once per bracket or string.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import orjson

_WS = re.compile(rb"[ \t\r\n]*")


_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)


# What a depth counter must look at: a quote opens a string (skipped whole), brackets nest.
_STRUCTURAL = re.compile(rb'["\[\]{}]')


_SCALAR = re.compile(rb"[^\s,\]}]+")


def _skip_ws(body: bytes, pos: int) -> int:
    """The first position at or after `pos` that is not JSON whitespace."""
    match = _WS.match(body, pos)
    assert match is not None  # `[ \t\r\n]*` matches everywhere, if only the empty string
    return match.end()


class SpliceError(ValueError):
    """The bytes are not the JSON object the caller parsed (a bug or a non-object body)."""


@dataclass(slots=True)
class _Member:
    key: str
    key_start: int
    value_start: int
    value_end: int


def _members(
    body: bytes, start: int, items: dict[str, list[tuple[int, int]]] | None = None
) -> tuple[list[_Member], int]:
    """The members of the object whose `{` is at `start`, and the index of its `}`. For each key of
    `items` whose value is an array, its items' spans are filled in on the way."""
    members: list[_Member] = []
    pos = _skip_ws(body, start + 1)
    if pos < len(body) and body[pos] == 0x7D:
        return members, pos
    while True:
        key = _STRING.match(body, pos)
        if key is None:
            raise SpliceError(f"expected a key at byte {pos}")
        raw = key.group()
        try:
            name = orjson.loads(raw) if b"\\" in raw else raw[1:-1].decode("utf-8")
        except ValueError as e:  # a key that isn't UTF-8 (UnicodeDecodeError, orjson's JSONDecodeError)
            raise SpliceError(f"key at byte {key.start()} is not valid JSON text ({e})") from e
        pos = _skip_ws(body, key.end())
        if pos >= len(body) or body[pos] != 0x3A:
            raise SpliceError(f"expected ':' at byte {pos}")
        value_start = _skip_ws(body, pos + 1)
        if items is not None and name in items and value_start < len(body) and body[value_start] == 0x5B:
            value_end = _array_end(body, value_start, items[name])
        else:
            value_end = _value_end(body, value_start)
        members.append(_Member(name, key.start(), value_start, value_end))
        pos = _skip_ws(body, value_end)
        if pos >= len(body):
            raise SpliceError("unterminated object")
        if body[pos] == 0x2C:
            pos = _skip_ws(body, pos + 1)
            continue
        if body[pos] == 0x7D:
            return members, pos
        raise SpliceError(f"expected ',' or '}}' at byte {pos}")


def _value_end(body: bytes, pos: int) -> int:
    if pos >= len(body):
        raise SpliceError("missing value")
    first = body[pos]
    if first == 0x22:
        return _string_end(body, pos)
    if first in (0x7B, 0x5B):
        depth = 0
        search = _STRUCTURAL.search
        while True:
            m = search(body, pos)
            if m is None:
                raise SpliceError("unterminated container")
            c = body[m.start()]
            if c == 0x22:
                pos = _string_end(body, m.start())
                continue
            pos = m.end()
            if c in (0x7B, 0x5B):
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    return pos
    m = _SCALAR.match(body, pos)
    if m is None:
        raise SpliceError(f"expected a value at byte {pos}")
    return m.end()


def _string_end(body: bytes, pos: int) -> int:
    """The end of the string opened at `pos`: memchr-speed jumps from quote to quote, so a long
    string costs one `find`, not a regex step per character."""
    find = body.find
    i = pos + 1
    while True:
        quote = find(b'"', i)
        if quote < 0:
            raise SpliceError(f"unterminated string at byte {pos}")
        j = quote - 1
        while body[j] == 0x5C:  # count the backslashes before the quote
            j -= 1
        if (quote - 1 - j) % 2 == 0:
            return quote + 1
        i = quote + 1


def _array_end(body: bytes, start: int, items: list[tuple[int, int]]) -> int:
    """The end of the array whose `[` is at `start`, appending its items' spans to `items`."""
    items.clear()  # a key given twice: the last one counts, as in `top_level_spans`
    for item in array_item_spans(body, start):
        items.append(item)
    pos = _skip_ws(body, items[-1][1] if items else start + 1)
    return pos + 1  # array_item_spans checked that this is the closing `]`


def array_item_spans(body: bytes, start: int) -> Iterator[tuple[int, int]]:
    """Spans of the items of the array whose `[` is at `start`, one at a time (stop early for free)."""
    if body[start] != 0x5B:
        raise SpliceError(f"expected an array at byte {start}")
    pos = _skip_ws(body, start + 1)
    if pos < len(body) and body[pos] == 0x5D:
        return
    while True:
        end = _value_end(body, pos)
        yield pos, end
        pos = _skip_ws(body, end)
        if pos >= len(body):
            raise SpliceError("unterminated array")
        if body[pos] == 0x2C:
            pos = _skip_ws(body, pos + 1)
            continue
        if body[pos] == 0x5D:
            return
        raise SpliceError(f"expected ',' or ']' at byte {pos}")
