"""A learned envelope reads a chunk's string from its slot alone exactly as a parse reads it, and refuses a chunk
it can't read so: on any JSON object (duplicate keys, the key's name elsewhere, any spacing and escaping, SSE
framing or none), with any string in the slot, and with any bytes in its place."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.sse import event_data
from tapfix.proxy.sse_envelope import PROBES, Path, learn, parse_object

from tests.support.builders import sse_event
from tests.support.depth import examples

# A JSON text as a tree, written by `_write` (so a key may repeat, as no encoder writes but a server may):
# ("obj", [(key, node), ...]), ("arr", [node, ...]), ("str", text), ("lit", bytes).
KEYS = st.sampled_from(["content", "arguments", "a", "index", "delta", "é", "content "])
TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
SLOT_TEXTS = st.one_of(
    TEXTS, st.sampled_from(["", '"', "\\", "\\u0000tapfix", "\x00tapfix", "probe", "a\\", '","x":"', "\u2028"])
)
LITERALS = st.sampled_from([b"1", b"null", b"-2.5e3", b"true"])
leaves = st.one_of(st.tuples(st.just("str"), SLOT_TEXTS), st.tuples(st.just("lit"), LITERALS))
trees = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(st.just("arr"), st.lists(inner, max_size=3)),
        st.tuples(st.just("obj"), st.lists(st.tuples(KEYS, inner), max_size=4)),
    ),
    max_leaves=12,
)
objects = st.tuples(st.just("obj"), st.lists(st.tuples(KEYS, trees), min_size=1, max_size=4))
# Bytes put where the slot's string was: strings written as encoders write them, and bytes that make another
# object (a second key, a closed object, a number, two strings, a cut string, an escape that isn't one).
MIDDLES = st.one_of(
    SLOT_TEXTS.map(orjson.dumps),
    SLOT_TEXTS.map(lambda t: json.dumps(t).encode()),
    st.sampled_from(
        [b'"a","content":"b"', b'"a","a":"x"', b'"a"},"x":{"y":"b"', b"1", b"null", b'"a" "b"', b' "a" ', b'""']
        + [b'"\\ud800"', b'"\\u00e9\\n"', b'"a', b"", b'"a"}]}', b'{"x":"a"}', b'"\\q"', b'"\\"', b'"a\\\\"']
    ),
    st.binary(max_size=6).map(lambda b: b'"' + b + b'"'),
)


def _write(node: tuple[Any, Any], ascii_: bool, space: bytes) -> bytes:
    kind, value = node
    if kind == "str":
        return json.dumps(value, ensure_ascii=ascii_).encode()
    if kind == "lit":
        return bytes(value)
    if kind == "arr":
        return b"[" + (b"," + space).join(_write(v, ascii_, space) for v in value) + b"]"
    items = (_write(("str", k), ascii_, space) + space + b":" + space + _write(v, ascii_, space) for k, v in value)
    return b"{" + (b"," + space).join(items) + b"}"


def _paths(obj: Any, path: Path = ()) -> list[Path]:
    """The paths to the parse's strings held under a key."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in ([(*path, k)] if isinstance(v, str) else _paths(v, (*path, k)))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _paths(v, (*path, i))]
    return []


def _with(obj: Any, path: Path, text: str) -> Any:
    if not path:
        return text
    if isinstance(obj, dict):
        return {**obj, path[0]: _with(obj[path[0]], path[1:], text)}
    return [_with(v, path[1:], text) if i == path[0] else v for i, v in enumerate(obj)]


def _sse_object(chunk: bytes) -> Any:
    data = event_data(chunk)
    return parse_object(data) if data is not None else None


Found = tuple[bytes, Any, Path, Any, bool]


@st.composite
def slotted(draw: st.DrawFn) -> Found:
    """(chunk, its parse, a path to one of its strings, the parse function, whether a key repeats)."""
    tree = draw(objects)
    sse = draw(st.booleans())  # one `data:` line: no line break in the JSON
    text = _write(tree, draw(st.booleans()), draw(st.sampled_from([b"", b"", b" ", b"\t", *[b"\r\n "] * (not sse)])))
    obj = orjson.loads(text)
    paths = _paths(obj)
    path = draw(st.sampled_from(paths)) if paths else ("absent",)
    chunk = sse_event(text, newline=draw(st.sampled_from(["\n", "\r\n"]))) if sse else text
    return chunk, obj, path, _sse_object if sse else parse_object, _has_repeat(tree)


def _has_repeat(node: tuple[Any, Any]) -> bool:
    kind, value = node
    if kind == "obj":
        keys = [k for k, _ in value]
        return len(set(keys)) != len(keys) or any(_has_repeat(v) for _, v in value)
    return kind == "arr" and any(_has_repeat(v) for v in value)


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slotted(), SLOT_TEXTS, MIDDLES)
def test_a_learned_envelope_reads_what_a_parse_reads(found: Found, text: str, middle: bytes) -> None:
    chunk, obj, path, parse, repeats = found
    envelope = learn(chunk, obj, path, parse)
    key = orjson.dumps(path[-1]) if isinstance(path[-1], str) else b"\x00"
    if path != ("absent",) and not repeats and chunk.count(key) == 1:
        assert envelope is not None  # an object that holds the key once: its slot is found and proved
    if envelope is None:
        return
    assert envelope.chunk(envelope.raw(chunk) or b"") == chunk
    for written in (orjson.dumps(text), json.dumps(text).encode()):  # any string, as encoders write it
        other = envelope.chunk(written[1:-1])
        assert envelope.raw(other) == written[1:-1]
        assert envelope.string(other) == text
        assert parse(other) == _with(obj, path, text)
    other = envelope.head[:-1] + middle + envelope.tail[1:]  # any bytes in the string's place
    read = envelope.string(other)
    if read is not None:
        assert parse(other) == _with(obj, path, read)  # read: as the parse reads it, else refused
    raw = envelope.raw(other)  # the quiet path's reading: bytes without a quote, control byte or trailing `\\`
    plain = raw is not None and all(b >= 32 and b != 34 for b in raw) and not raw.endswith(b"\\")
    if plain and raw is not None and parse(other) is not None:
        assert parse(other) == _with(obj, path, orjson.loads(b'"' + raw + b'"'))


@settings(max_examples=examples(300), deadline=None)
@given(slotted(), st.integers(0, 400), st.binary(min_size=1, max_size=3))
def test_a_chunk_of_another_shape_is_refused(found: Found, at: int, cut: bytes) -> None:
    """A chunk changed outside its slot (bytes in, or out) is read only when it still parses as the read says."""
    chunk, obj, path, parse, _ = found
    envelope = learn(chunk, obj, path, parse)
    if envelope is None:
        return
    at = at % (len(chunk) + 1)
    for other in (chunk[:at] + cut + chunk[at:], chunk[:at] + chunk[at + len(cut) :]):
        read = envelope.string(other)
        if read is not None:
            assert parse(other) == _with(obj, path, read)


def test_a_key_given_twice_has_its_slot_in_the_last_place() -> None:
    """The parse keeps a repeated key's last value: the first one's place is no slot, whatever the value (the
    probes are two: a later value can't equal both)."""
    for probe in (*PROBES, b"a"):
        chunk = b'{"delta":{"content":"%s","content":"%s"}}' % (probe, probe)
        envelope = learn(chunk, orjson.loads(chunk), ("delta", "content"))
        assert envelope is not None and envelope.head == b'{"delta":{"content":"%s","content":"' % probe
    chunk = b'{"delta":{"content":"a"},"delta":{"content":"a"}}'
    envelope = learn(chunk, orjson.loads(chunk), ("delta", "content"))
    assert envelope is not None and envelope.head == b'{"delta":{"content":"a"},"delta":{"content":"'


def test_the_slot_is_the_path_s_among_keys_of_one_name() -> None:
    chunk = b'{"a":{"content":"x"},"b":{"content": "x"}}'
    envelope = learn(chunk, orjson.loads(chunk), ("b", "content"))
    assert envelope is not None and envelope.head == b'{"a":{"content":"x"},"b":{"content": "'
    assert envelope.string(envelope.chunk(b"y\\n")) == "y\n"
