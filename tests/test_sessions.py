"""Session keys: the cheap opening extractor agrees with a full parse, on any body."""

from __future__ import annotations

import json

import orjson
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.store.sessions import _opening


def full_parse_opening(body: bytes) -> bytes | None:
    """The definition: system + the turns up to the first user message, from a full parse."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    messages = (
        obj.get("messages")
        if isinstance(obj.get("messages"), list)
        else (obj.get("input") if isinstance(obj.get("input"), list) else None)
    )
    if not messages:
        return None
    opening = [obj["system"]] if "system" in obj else []
    for message in messages:
        opening.append(message)
        if isinstance(message, dict) and message.get("role") == "user":
            break
    return orjson.dumps(opening, option=orjson.OPT_SORT_KEYS)


TEXT = st.text(alphabet=st.sampled_from(list('ab "\\\n{}[],:é😀')), max_size=12)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool"]),
        "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2),
    }
)
BODY = st.fixed_dictionaries(
    {"model": TEXT},
    optional={
        "messages": st.lists(MESSAGE, max_size=5),
        "input": st.lists(MESSAGE, max_size=3) | TEXT,
        "system": TEXT,
        "tools": st.lists(st.fixed_dictionaries({"name": TEXT}), max_size=2),
        "stream": st.booleans(),
    },
)


@given(BODY, st.sampled_from([None, 0, 2]))
def test_opening_matches_a_full_parse(body, indent):
    raw = json.dumps(body, indent=indent, ensure_ascii=bool(indent)).encode()
    assert _opening(raw) == full_parse_opening(raw)


def test_a_long_conversation_keeps_its_key_turn_after_turn():
    system = {"role": "system", "content": "You are an agent. " * 500}
    turns = [system, {"role": "user", "content": "create hello.txt"}]
    keys = set()
    for i in range(5):
        turns.append({"role": "assistant", "content": f"step {i} " + "x" * 100_000})
        keys.add(_opening(json.dumps({"model": "m", "messages": turns, "tools": []}).encode()))
    assert len(keys) == 1 and None not in keys


def test_not_an_object_or_no_conversation():
    for body in (b"", b"[]", b'{"model": "m"}', b'{"messages": []}', b'{"messages": "hi"}', b"{broken"):
        assert _opening(body) is None, body
