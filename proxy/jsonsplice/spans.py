"""Byte spans of a JSON object's values and array items, for edits that cut or read one part of a body.

Given the body's parse, a compact body's spans are read from its serialization (checked against the bytes)
instead of the Python scan (issue 34).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from tapfix.proxy.jsonsplice.scan import SpliceError, _Member, _members, _skip_ws, _value_end, array_item_spans


def top_level_spans(body: bytes) -> dict[str, tuple[int, int]]:
    """Byte spans of the top-level members' values, without parsing them (a megabyte `messages`
    array is skipped at memchr speed). Raises SpliceError when the body is not an object."""
    start = _skip_ws(body, 0)
    if start >= len(body) or body[start] != 0x7B:
        raise SpliceError("not a JSON object")
    members, _ = _members(body, start)
    return {m.key: (m.value_start, m.value_end) for m in members}


def top_level_item_spans(
    body: bytes, arrays: Iterable[str], parsed: dict[str, Any] | None = None
) -> tuple[dict[str, tuple[int, int]], dict[str, list[tuple[int, int]]]]:
    """`top_level_spans`, plus the spans of the items of the named members that are arrays, found in
    the same pass: a caller that needs both crosses a megabyte conversation once, not twice. `parsed`: the
    body's parse, when the caller has it (a compact body is then not parsed again to be read)."""
    names = tuple(arrays)
    compact = _compact_item_spans(body, names, parsed)
    if compact is not None:
        return compact
    start = _skip_ws(body, 0)
    if start >= len(body) or body[start] != 0x7B:
        raise SpliceError("not a JSON object")
    items: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
    members, _ = _members(body, start, items)
    spans = {m.key: (m.value_start, m.value_end) for m in members}
    return spans, {name: found for name, found in items.items() if name in spans and body[spans[name][0]] == 0x5B}


def _compact_item_spans(
    body: bytes, arrays: tuple[str, ...], parsed: dict[str, Any] | None = None
) -> tuple[dict[str, tuple[int, int]], dict[str, list[tuple[int, int]]]] | None:
    """`top_level_item_spans` without a scan, when the body is exactly orjson's compact serialization of
    what it parses (what JavaScript's JSON.stringify, Go and Rust clients send: no spaces, UTF-8 as is):
    then each span follows from the length of its member serialized again, checked against the body's
    bytes as it goes. None when any byte differs (spacing, escapes, a number written otherwise, a key given
    twice, trailing bytes): the scan decides then. A parse and a serialization in C cost a fraction of
    crossing the body in Python, string by string."""
    if body[:1] != b"{" or b'": ' in body[:256]:  # spaced: `{"model": ...` (not worth a parse to find out)
        return None
    if parsed is not None:
        obj: Any = parsed
    else:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(obj, dict) or not obj:
        return None
    layout = _compact_layout(body, obj, arrays)
    if layout is None:
        return None
    members, _, items = layout
    return {m.key: (m.value_start, m.value_end) for m in members}, items


def _compact_layout(
    body: bytes, obj: Mapping[str, Any], arrays: tuple[str, ...]
) -> tuple[list[_Member], int, dict[str, list[tuple[int, int]]]] | None:
    """The members of `body`, its closing brace and the items of its `arrays`, when `body` is exactly the
    compact serialization of `obj` (its parse); None when any byte says otherwise (see `_compact_item_spans`)."""
    if body[:1] != b"{" or not obj:
        return None
    members: list[_Member] = []
    items: dict[str, list[tuple[int, int]]] = {}
    pos = 1
    try:
        for key, value in obj.items():
            if pos > 1:
                if body[pos : pos + 1] != b",":
                    return None
                pos += 1
            key_start = pos
            name = orjson.dumps(key)
            if not body.startswith(name, pos) or body[pos + len(name) : pos + len(name) + 1] != b":":
                return None
            start = pos = pos + len(name) + 1
            if key in arrays and isinstance(value, list):
                found = _compact_items(body, pos, value)
                if found is None:
                    return None
                items[key], pos = found
            else:
                text = orjson.dumps(value)
                if not body.startswith(text, pos):
                    return None
                pos += len(text)
            members.append(_Member(key, key_start, start, pos))
    except TypeError:  # a value orjson can't write (an integer beyond 64 bits): the scan reads it
        return None
    if body[pos:] != b"}":
        return None
    return members, pos, items


def _compact_items(body: bytes, start: int, values: list[Any]) -> tuple[list[tuple[int, int]], int] | None:
    """The spans of a compact array's items at `start` (its `[`), and the array's end; None on a mismatch."""
    if body[start : start + 1] != b"[":
        return None
    pos = start + 1
    spans = []
    for i, value in enumerate(values):
        if i:
            if body[pos : pos + 1] != b",":
                return None
            pos += 1
        text = orjson.dumps(value)
        if not body.startswith(text, pos):
            return None
        spans.append((pos, pos + len(text)))
        pos += len(text)
    if body[pos : pos + 1] != b"]":
        return None
    return spans, pos + 1


def value_span(body: bytes, path: Sequence[str | int]) -> tuple[int, int]:
    """The byte span of the value at `path` (object keys and array indices: `("system", 0)`), found
    without parsing what lies beside it. A key given twice: the last one counts, as parsers do.
    Raises SpliceError when the path isn't there."""
    start = _skip_ws(body, 0)
    if not path:
        return start, _value_end(body, start)
    end = start
    for step in path:
        if isinstance(step, str):
            if start >= len(body) or body[start] != 0x7B:
                raise SpliceError(f"expected an object at byte {start} for {step!r}")
            found = [m for m in _members(body, start)[0] if m.key == step]
            if not found:
                raise SpliceError(f"no key {step!r} in the object at byte {start}")
            start, end = found[-1].value_start, found[-1].value_end
        else:
            for i, (item_start, item_end) in enumerate(array_item_spans(body, start)):
                if i == step:
                    start, end = item_start, item_end
                    break
            else:
                raise SpliceError(f"no item {step} in the array at byte {start}")
    return start, end


def remove_items(body: bytes, array: Sequence[str | int], indices: Iterable[int]) -> bytes:
    """`body` without the items `indices` of the array at `array`, each with the separator that joined it
    to the items kept; every other byte stays (`[A, B, C]` without 0 is `[B, C]`, without 2 `[A, B]`)."""
    start, _ = value_span(body, array)
    spans = list(array_item_spans(body, start))
    gone = {i for i in indices if 0 <= i < len(spans)}
    if not gone:
        return body
    if len(gone) == len(spans):
        return body[: start + 1] + body[_skip_ws(body, spans[-1][1]) :]
    cuts = []
    for i in sorted(gone):
        if any(j not in gone for j in range(i + 1, len(spans))):
            cuts.append((spans[i][0], spans[i + 1][0]))  # the item, its comma, the space before the next
        else:
            cuts.append((spans[i - 1][1], spans[i][1]))  # a trailing item: the comma before it goes with it
    out, pos = [], 0
    for begin, end in cuts:
        out.append(body[pos:begin])
        pos = end
    out.append(body[pos:])
    return b"".join(out)
