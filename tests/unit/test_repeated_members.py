"""RepeatedMembers: an agent's tool list parsed once, and every body still parsed to what orjson gives."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.jsonbody import RepeatedMembers
from tapfix.proxy.request.policy import RequestPolicy

from tests.support.depth import examples

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Reads a file of the repository. " * 8,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
    for i in range(12)
]


def body(messages: list, **extra: object) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, "tools": TOOLS, "stream": True, **extra})


def turns(n: int) -> list[bytes]:
    messages: list = [{"role": "user", "content": "start"}]
    out = []
    for i in range(n):
        out.append(body(list(messages)))
        messages += [{"role": "assistant", "content": f"answer {i}"}, {"role": "user", "content": f"more {i}"}]
    return out


def test_a_tool_list_resent_every_turn_is_parsed_once_and_shared() -> None:
    members = RepeatedMembers()
    parsed = [members.loads(b) for b in turns(5)]
    assert parsed == [orjson.loads(b) for b in turns(5)]
    assert all(p["tools"] is parsed[0]["tools"] for p in parsed)  # not a fresh tree of objects each turn
    assert [list(p) for p in parsed] == [list(orjson.loads(b)) for b in turns(5)]  # members in the body's order


def test_a_changed_tool_list_is_parsed_anew() -> None:
    members = RepeatedMembers()
    first = members.loads(body([{"role": "user", "content": "a"}]))
    other = [*TOOLS[:-1], {"type": "function", "function": {"name": "late", "parameters": {}}}]
    changed = orjson.dumps({"model": "m", "messages": [], "tools": other})
    assert members.loads(changed) == orjson.loads(changed)
    assert members.loads(changed)["tools"] is not first["tools"]


@pytest.mark.parametrize(
    "shape",
    [
        # the same bytes, but nested, and no top-level tools
        lambda t: {"model": "m", "messages": [{"role": "user", "tools": t}]},
        # nested first, the top-level one different
        lambda t: {"messages": [{"tools": t}], "tools": t[:3]},
        # the key given twice: the last one counts, as orjson reads it
        lambda t: b'{"tools":' + orjson.dumps(t) + b',"tools":[]}',
        # spaced after the key: not the learnt bytes
        lambda t: b'{"tools": ' + orjson.dumps(t) + b"}",
        # inside a string: escaped, so never the learnt bytes
        lambda t: {"messages": [{"content": orjson.dumps({"tools": t}).decode()}]},
    ],
)
def test_the_learnt_bytes_elsewhere_than_the_top_level_member_parse_as_orjson_does(shape) -> None:
    members = RepeatedMembers()
    members.loads(body([]))  # learns the tool list
    shaped = shape(TOOLS)
    raw = shaped if isinstance(shaped, bytes) else orjson.dumps(shaped)
    assert members.loads(raw) == orjson.loads(raw)


def test_bodies_that_are_not_json_raise_what_orjson_raises() -> None:
    members = RepeatedMembers()
    members.loads(body([]))
    broken = body([])[:-5]
    with pytest.raises(orjson.JSONDecodeError):
        members.loads(broken)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(broken)
    assert members.loads(b"[1, 2]") == [1, 2]


def test_a_spaced_client_is_parsed_whole_and_stops_being_tried() -> None:
    members = RepeatedMembers()
    spaced = b'{"model": "m", "tools": ' + orjson.dumps(TOOLS) + b"}"
    for _ in range(20):
        assert members.loads(spaced) == orjson.loads(spaced)
    assert members._misses >= 8  # learning is tried every 64th body from then on, not on each


def test_two_members_learnt_and_swapped_in_one_parse() -> None:
    members = RepeatedMembers()
    system = [{"type": "text", "text": "You are a careful coding agent. " * 60}]
    first = orjson.dumps({"model": "m", "system": system, "messages": [], "tools": TOOLS})
    members.loads(first)
    later = orjson.dumps(
        {"model": "m", "system": system, "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}
    )
    parsed = members.loads(later)
    assert parsed == orjson.loads(later)
    assert {k.name for k in members._known} == {"tools", "system"}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    before=st.dictionaries(st.sampled_from(["model", "messages", "stream", "tools", "x"]), json_values, max_size=4),
    after=st.dictionaries(st.sampled_from(["model", "messages", "stream", "system", "y"]), json_values, max_size=4),
    tools_first=st.booleans(),
)
def test_any_body_around_a_learnt_member_parses_as_orjson_does(before, after, tools_first) -> None:
    members = RepeatedMembers(min_bytes=1)
    members.loads(body([]))
    doc = {"tools": TOOLS, **before, **after} if tools_first else {**before, "tools": TOOLS, **after}
    for raw in (orjson.dumps(doc), orjson.dumps(before), orjson.dumps({**doc, "tools": before})):
        assert members.loads(raw) == orjson.loads(raw)


def test_the_request_policy_reads_a_resent_tool_list_from_its_first_parse() -> None:
    from tapfix.proxy.config.file import Config

    policy = RequestPolicy(Config.quick("http://127.0.0.1:9", engine="vllm"))
    outcomes = [policy.apply("/v1/chat/completions", b, {"content-type": "application/json"}) for b in turns(3)]
    assert [o.parsed for o in outcomes] == [orjson.loads(b) for b in turns(3)]
    assert outcomes[2].parsed["tools"] is outcomes[0].parsed["tools"]
