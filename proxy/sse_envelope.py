"""A streamed delta's envelope: the bytes around the one JSON string that changes from chunk to chunk.

A server writes each delta of a kind alike: the same bytes (id, model, index, nulls) around a different string,
`{"id":…,"choices":[{"index":0,"delta":{"content":"` + text + `"}…}]}`. `learn` takes one chunk, its parse and
the path to that string in the parse, and returns the chunk as head + string bytes + tail (`Envelope`) once a
parse proves it: the chunk with a probe string in the slot (one other than the slot's own) parses to the
chunk's own object with the probe at the path. Putting one string token where another was leaves every other
token of the JSON as it was, so a later chunk that starts with the head and ends with the tail, with one JSON
string between, parses to that object with that string at the path: its string is read (`string`) or passed
on (`raw`) without a parse.

The probe proves what a look at the bytes can't: that the slot's value is the one the parse keeps, not one a
later repeated key overrides (that key's value, the slot's own, would stay where the probe should show).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

Path = tuple[str | int, ...]
PROBES = (b"\\u0000tapfix", b"probe")  # strings' bytes, one an escape; two: one differs from any slot's string
_PROBED = tuple((probe, str(orjson.loads(b'"' + probe + b'"'))) for probe in PROBES)
_WHITESPACE = b" \t\r\n"
_WHITESPACE_AFTER = (b" ", b"\t", b"\r", b"\n")
_TRIES = 4  # the key's places tried (a chunk of another shape isn't searched through)


class Envelope:
    """A chunk as `head` (up to its slot string's opening quote) + the string's bytes + `tail` (from its
    closing quote)."""

    __slots__ = ("head", "hi", "lo", "tail")

    def __init__(self, head: bytes, tail: bytes) -> None:
        self.head, self.tail = head, tail
        self.lo, self.hi = len(head), len(tail)

    def raw(self, chunk: bytes) -> bytes | None:
        """The slot's bytes of a chunk that starts with the head and ends with the tail, else None. They are
        one string's (and the chunk one of this envelope's) when they hold no quote and no control byte and
        don't end in a backslash: a caller that looks at the bytes anyway checks that in the same search."""
        if chunk.startswith(self.head) and chunk.endswith(self.tail) and len(chunk) >= self.lo + self.hi:
            return chunk[self.lo : len(chunk) - self.hi]
        return None

    def string(self, chunk: bytes) -> str | None:
        """The slot's string of a chunk of this envelope (what the chunk's parse holds at the path), read from
        the slot alone; None for any other chunk."""
        n = len(chunk)
        if chunk.startswith(self.head) and chunk.endswith(self.tail) and n >= self.lo + self.hi:
            try:
                text = orjson.loads(chunk[self.lo - 1 : n - self.hi + 1])
            except orjson.JSONDecodeError:
                return None
            return text if text.__class__ is str else None
        return None

    def chunk(self, raw: bytes) -> bytes:
        """The chunk of this envelope whose slot holds `raw` (a JSON string's bytes, quotes excluded)."""
        return self.head + raw + self.tail


def parse_object(chunk: bytes) -> Any:
    """orjson's parse, None for bytes that aren't JSON."""
    try:
        return orjson.loads(chunk)
    except orjson.JSONDecodeError:
        return None


def learn(chunk: bytes, obj: Any, path: Path, parse: Callable[[bytes], Any] = parse_object) -> Envelope | None:
    """The envelope of `chunk` (whose `parse`, a fresh object each time, is `obj`) around the string at `path`
    (its last step a key), proved by parsing the chunk with the probes in the slot; None when no place of the
    key proves so."""
    parent = _at(obj, path[:-1])
    key = path[-1] if path else None
    if not isinstance(parent, dict) or not isinstance(key, str) or not isinstance(value := parent.get(key), str):
        return None
    try:
        token = orjson.dumps(key)
    except orjson.JSONEncodeError:  # a lone surrogate: no chunk's bytes hold that key as orjson writes it
        return None
    at, tries = chunk.find(token), _TRIES
    while at >= 0 and tries:
        tries -= 1
        start = _value_start(chunk, at + len(token))
        end = _string_end(chunk, start + 1) if start > 0 and chunk.startswith(b'"', start) else -1
        if end > 0 and parse_object(chunk[start : end + 1]) == value:
            head, tail = chunk[: start + 1], chunk[end:]
            probe, text = _PROBED[0] if _PROBED[0][1] != value else _PROBED[1]
            if _proves(parse(head + probe + tail), obj, path, text, value):
                return Envelope(head, tail)
        at = chunk.find(token, at + 1)
    return None


def _proves(probed: Any, obj: Any, path: Path, text: str, value: str) -> bool:
    """Whether a probe's parse is `obj` with the probe's `text` at `path` (in place of `value`)."""
    parent = _at(probed, path[:-1])
    if not isinstance(parent, dict) or parent.get(path[-1]) != text:
        return False
    parent[path[-1]] = value  # the parse is the probe's own: put back what `obj` holds, and compare
    return bool(probed == obj)


def _at(obj: Any, path: Path) -> Any:
    """The value at `path` (a dict's key, a list's index), None when there is none (a str's item is a str)."""
    try:
        for step in path:
            obj = obj[step]
    except (KeyError, IndexError, TypeError):
        return None
    return obj


def _value_start(chunk: bytes, at: int) -> int:
    """Where the value after a key ending at `at` starts (past `:` and whitespace); -1 when no `:` follows."""
    if chunk.startswith(b":", at) and not chunk.startswith(_WHITESPACE_AFTER, at + 1):
        return at + 1  # `"key":value`, as most encoders write it
    n = len(chunk)
    while at < n and chunk[at] in _WHITESPACE:
        at += 1
    if at >= n or chunk[at] != 58:
        return -1
    at += 1
    while at < n and chunk[at] in _WHITESPACE:
        at += 1
    return at if at < n else -1


def _string_end(chunk: bytes, start: int) -> int:
    """Where the JSON string whose bytes start at `start` ends (its closing quote), -1 when it doesn't."""
    end = chunk.find(b'"', start)
    while end > 0 and chunk[end - 1] == 92:
        k = end - 1
        while k >= start and chunk[k] == 92:
            k -= 1
        if (end - 1 - k) % 2 == 0:
            break
        end = chunk.find(b'"', end + 1)
    return end
