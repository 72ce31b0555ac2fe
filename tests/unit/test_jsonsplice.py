import json
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.jsonsplice import (
    Delete,
    Set,
    SpliceError,
    apply_to_dict,
    array_item_spans,
    json_path,
    splice,
    top_level_item_spans,
    top_level_spans,
)
from tapfix.proxy.jsonsplice.spans import _compact_item_spans

from tests.support.depth import examples

# (body, edits, expected bytes): the style of the body is kept, nothing else moves.
CASES = [
    (b'{"model":"a"}', [Set(("top_p",), 0.95)], b'{"model":"a","top_p":0.95}'),
    (b'{"model": "a"}', [Set(("top_p",), 0.95)], b'{"model": "a", "top_p": 0.95}'),
    (b'{\n  "model": "a"\n}', [Set(("top_p",), 1)], b'{\n  "model": "a",\n  "top_p": 1\n}'),
    (b'{"a":1,\n "b":2}', [Set(("c",), 3)], b'{"a":1,\n "b":2,\n "c":3}'),
    (b"{}", [Set(("a",), True)], b'{"a":true}'),
    (b"{ }", [Set(("a",), None)], b'{ "a":null}'),
    (b'{"a":1,"b":2,"c":3}', [Delete(("a",))], b'{"b":2,"c":3}'),
    (b'{"a":1,"b":2,"c":3}', [Delete(("b",))], b'{"a":1,"c":3}'),
    (b'{"a":1,"b":2,"c":3}', [Delete(("c",))], b'{"a":1,"b":2}'),
    (b'{"a":1,"b":2,"c":3}', [Delete(("a",)), Delete(("b",))], b'{"c":3}'),
    (b'{"a":1,"b":2,"c":3}', [Delete(("b",)), Delete(("c",))], b'{"a":1}'),
    (b'{"a":1,"b":2,"c":3}', [Delete(("a",)), Delete(("c",))], b'{"b":2}'),
    (b'{"a":1}', [Delete(("a",))], b"{}"),
    (b'{"a":1}', [Delete(("a",)), Set(("b",), 2)], b'{"b":2}'),
    (b'{"a":1,"b":2}', [Delete(("b",)), Set(("c",), 3)], b'{"a":1,"c":3}'),
    (b'{"a":1}', [Delete(("zz",))], b'{"a":1}'),
    (b'{"a":{"x":1}}', [Set(("a", "y"), 2)], b'{"a":{"x":1,"y":2}}'),
    (b'{"a":{"x":1,"y":2}}', [Delete(("a", "x"))], b'{"a":{"y":2}}'),
    (b'{"a":null}', [Set(("a", "y"), 2)], b'{"a":{"y":2}}'),
    (b'{"m":1}', [Set(("r", "effort"), "high")], b'{"m":1,"r":{"effort":"high"}}'),
    (b'{"m":1}', [Delete(("r", "effort"))], b'{"m":1}'),
    (b'{"m": 1}', [Set(("k",), {"a": [1, 2]})], b'{"m": 1, "k": {"a": [1, 2]}}'),
    # replace keeps everything around the value, escapes and all
    (b'{"m":"\\u00e9","t" :  0.2 ,"z":1}', [Set(("t",), 0.6)], b'{"m":"\\u00e9","t" :  0.6 ,"z":1}'),
    # keys written with escapes are found by their decoded name
    (b'{"\\u0074op_p":0.2}', [Set(("top_p",), 0.9)], b'{"\\u0074op_p":0.9}'),
    # braces and quotes inside strings are skipped
    (b'{"s":"}{\\"]","a":[{"b":"}"}],"c":1}', [Delete(("c",))], b'{"s":"}{\\"]","a":[{"b":"}"}]}'),
    # a later edit of the same path wins; an edit inside a value set whole folds into it
    (b'{"a":1}', [Set(("a",), 2), Set(("a",), 3)], b'{"a":3}'),
    (b'{"a":1}', [Set(("k",), {"x": 1}), Set(("k", "y"), 2)], b'{"a":1,"k":{"x":1,"y":2}}'),
    (b'{"a":1,"k":{"x":1}}', [Delete(("k",)), Set(("k", "y"), 2)], b'{"a":1,"k":{"y":2}}'),
    (b'  {"a":1}\n', [Set(("b",), "\u00e9")], '  {"a":1,"b":"\u00e9"}\n'.encode()),
]


@pytest.mark.parametrize(("body", "edits", "expected"), CASES)
def test_splice_table(body, edits, expected):
    out = splice(body, edits)
    assert out == expected
    assert orjson.loads(out) == apply_to_dict(orjson.loads(body), edits)


def test_no_edits_returns_the_same_object():
    body = b'{"a" : 1}'
    assert splice(body, []) is body


@pytest.mark.parametrize("body", [b"[1]", b"", b"  ", b'"x"', b'{"a" 1}', b'{"a":1', b'{"a":"x}'])
def test_non_objects_and_broken_bodies_raise_splice_error(body):
    with pytest.raises(SpliceError):
        splice(body, [Set(("b",), 1)])


def test_duplicate_keys_edit_the_effective_one():
    body = b'{"a":1,"a":2}'
    assert orjson.loads(splice(body, [Set(("a",), 3)])) == {"a": 3}
    assert orjson.loads(splice(body, [Delete(("a",))])) == {}


def test_json_path():
    assert json_path(("reasoning", "effort")) == "$.reasoning.effort"
    assert json_path(("a b",)) == '$["a b"]'


def test_five_megabyte_body_is_fast_and_untouched_bytes_stay():
    messages = [{"role": "user", "content": "x" * 4000 + ' "quoted" {braces} [brackets] \\ é'} for _ in range(1250)]
    body = json.dumps({"model": "m", "messages": messages, "stream": True, "temperature": None}).encode()
    assert len(body) > 5_000_000
    edits = [
        Set(("temperature",), 0.6),
        Set(("top_p",), 0.95),
        Delete(("stream",)),
        Set(("chat_template_kwargs", "enable_thinking"), False),
    ]
    start = time.perf_counter()
    out = splice(body, edits)
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, elapsed
    head = body.index(b'"stream"')
    assert out[: head - 2] == body[: head - 2]  # everything before the first edit is identical
    assert orjson.loads(out) == apply_to_dict(orjson.loads(body), edits)


# --- properties ---------------------------------------------------------------------------------

keys = st.sampled_from(["a", "b", "c", "model", "top_p", "é", 'k"q', "x y"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(-1e6, 1e6, allow_nan=False)
    | st.text(max_size=8)
)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(keys, c, max_size=3), max_leaves=8)
objects = st.dictionaries(keys, values, max_size=6)
paths = st.lists(keys, min_size=1, max_size=3).map(tuple)
edit_lists = st.lists(st.builds(Set, paths, values) | st.builds(Delete, paths), max_size=5)


def _styles(obj):
    yield json.dumps(obj).encode()
    yield orjson.dumps(obj)
    yield json.dumps(obj, indent=2).encode()
    yield json.dumps(obj, ensure_ascii=True, separators=(" ,", " : ")).encode()


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(objects, edit_lists)
def test_splice_then_parse_equals_the_dict_edit(obj, edits):
    expected = apply_to_dict(obj, edits)
    for body in _styles(obj):
        out = splice(body, edits)
        assert json.loads(out) == expected


@settings(max_examples=examples(200))
@given(objects, keys, values)
def test_untouched_members_keep_their_bytes(obj, key, value):
    body = json.dumps(obj, indent=1).encode()
    out = splice(body, [Set((key,), value)])
    for other in obj:
        if other != key:
            member = json.dumps({other: obj[other]}, indent=1).encode()[2:-2]  # '"k": v' at indent 1
            assert member in out


# --- top-level spans: the compact fast path finds what the scan finds -------------------------------

conversations = st.dictionaries(keys | st.just("messages"), values | st.lists(values, max_size=4), max_size=6)


def _scanned(body):
    """The spans as the scan finds them (top_level_spans and array_item_spans never take the fast path)."""
    spans = top_level_spans(body)
    arrays = [n for n in ("messages", "input") if n in spans and body[spans[n][0]] == 0x5B]
    return spans, {n: list(array_item_spans(body, spans[n][0])) for n in arrays}


@settings(max_examples=examples(300))
@given(conversations)
def test_top_level_item_spans_are_the_scans_whatever_the_style(obj):
    compact = orjson.dumps(obj)
    bodies = [*_styles(obj), compact + b" ", b'{"model":0,' + compact[1:] if obj else b'{"model":0}']
    for body in bodies:
        assert top_level_item_spans(body, ("messages", "input")) == _scanned(body), body


@settings(max_examples=examples(100))
@given(conversations.filter(bool))
def test_a_compact_body_is_read_without_a_scan(obj):
    assert _compact_item_spans(orjson.dumps(obj), ("messages",)) is not None
    assert _compact_item_spans(orjson.dumps(obj).replace(b"{", b"{ ", 1), ("messages",)) is None


def test_a_key_given_twice_goes_to_the_scan():
    body = b'{"messages":[1],"messages":[2,3]}'
    assert _compact_item_spans(body, ("messages",)) is None
    assert top_level_item_spans(body, ("messages",)) == ({"messages": (27, 32)}, {"messages": [(28, 29), (30, 31)]})
