"""Structural invariants on the Responses and Messages surfaces (issue 16 item 1), checked on every answer
that offered tools: dense indexes, one unique id per call, offered names, a finish that matches what the
client received, and a terminal object that agrees with the streamed events.

Streams are the mock renderers' well-formed ones, mutated per defect class; what a client assembles is read
by the two small readers below (items/blocks in order, their ids, names and joined arguments)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
import pytest
from tapfix.proxy.mock.messages import messages_body, messages_events
from tapfix.proxy.mock.responses import responses_body, responses_events
from tapfix.proxy.mock.surface_script import Part, Script
from tapfix.proxy.toolcalls import (
    MessagesToolCallRepair,
    ResponsesToolCallRepair,
    repair_messages_body,
    repair_responses_body,
)
from tapfix.proxy.toolcalls.defects import EMPTY_TURN, FINISH_MISMATCH, UNKNOWN_TOOL, WRONG_INDEX

from tests.support.builders import random_splits
from tests.support.builders import sse_json as events
from tests.support.stage_io import run_stage

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WRITE = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
R_TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER},
    {"type": "function", "name": "write", "parameters": WRITE},
]
M_TOOLS = [{"name": "get_weather", "input_schema": WEATHER}, {"name": "write", "input_schema": WRITE}]
WEATHER_FRAGS = ['{"city": ', '"Oslo"}']
WRITE_FRAGS = ['{"path": "a.txt", ', '"content": "hi"}']
EXPECTED = [("get_weather", {"city": "Oslo"}), ("write", {"path": "a.txt", "content": "hi"})]
IDS = ("chatcmpl-tool-aaaaaaaaaaaaaaaaaaaaaaaa", "chatcmpl-tool-bbbbbbbbbbbbbbbbbbbbbbbb")


def script(finish: str = "tool_calls", calls: int = 2, weather: list[str] | None = None) -> Script:
    parts = [Part("reasoning", ["Let ", "me see."]), Part("text", ["Checking", " now."])]
    frags = [weather or WEATHER_FRAGS, WRITE_FRAGS]
    for k in range(calls):
        parts.append(Part("call", list(frags[k]), IDS[k], EXPECTED[k][0]))
    return Script(parts, finish, 9)


def r_events(s: Script | None = None) -> list[bytes]:
    return responses_events(s or script(), {"tools": R_TOOLS}, "e" * 64, 1_760_000_000, "m", 10)


def m_events(s: Script | None = None) -> list[bytes]:
    return messages_events(s or script(), "e" * 64, "m", 10)


def reframe(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def mutate(evs: list[bytes], fn: Callable[[dict[str, Any]], dict[str, Any] | None]) -> list[bytes]:
    """Each event's data through `fn` (None drops it); an event `fn` leaves equal keeps its bytes."""
    out = []
    for raw in evs:
        obj = json.loads(raw.split(b"data: ", 1)[1])
        new = fn(json.loads(json.dumps(obj)))
        if new is None:
            continue
        out.append(raw if new == obj else reframe(new))
    return out


def feed(stage: Any, evs: list[bytes]) -> bytes:
    out: list[bytes] = []
    for raw in evs:
        out += stage.feed(raw)
    out += stage.flush()
    assert all(isinstance(e, bytes) and e for e in out)
    return b"".join(out)


def run_r(evs: list[bytes], policy: str = "error") -> tuple[bytes, ResponsesToolCallRepair]:
    stage = ResponsesToolCallRepair(R_TOOLS, policy=policy, capture_id="cap-16")
    return feed(stage, evs), stage


def run_m(evs: list[bytes], policy: str = "error") -> tuple[bytes, MessagesToolCallRepair]:
    stage = MessagesToolCallRepair(M_TOOLS, policy=policy, capture_id="cap-16")
    return feed(stage, evs), stage


def kinds(stage: Any) -> list[str]:
    return [c.kind for c in stage.changes]


# -- what a Responses client assembles ---------------------------------------------------------------
def responses_view(data: bytes) -> dict[str, Any]:
    """Items in order of `.added`, each checked for one output_index, one call_id and one name across its
    `.added`, deltas, `.done` events and the terminal object; the terminal object must list the same calls."""
    evs = events(data)
    order: list[str] = []
    index_of: dict[str, int] = {}
    calls: dict[str, dict[str, Any]] = {}
    for e in evs:
        kind = e["type"]
        item = e.get("item") or {}
        item_id = e.get("item_id") or item.get("id")
        if "output_index" in e and item_id is not None:
            assert index_of.setdefault(item_id, e["output_index"]) == e["output_index"], "one output_index per item"
        if kind == "response.output_item.added":
            order.append(item["id"])
            if item["type"] == "function_call":
                calls[item["id"]] = {"call_id": item.get("call_id"), "name": item["name"], "deltas": ""}
        elif kind == "response.function_call_arguments.delta":
            calls[item_id]["deltas"] += e["delta"]
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == calls[item_id]["deltas"]
            if "name" in e:
                assert e["name"] == calls[item_id]["name"]
        elif kind == "response.output_item.done" and item["type"] == "function_call":
            call = calls[item["id"]]
            assert item.get("call_id") == call["call_id"], "the .done item has the .added item's call_id"
            assert item["name"] == call["name"] and item["arguments"] == call["deltas"]
            call["done"] = True
    assert [index_of[i] for i in order] == list(range(len(order))), "output_index dense in order"
    terminal = [e for e in evs if e["type"] in ("response.completed", "response.incomplete")]
    errors = [e for e in evs if e["type"] in ("error", "response.failed")]
    out_calls = [
        {"id": i, **{k: calls[i][k] for k in ("call_id", "name")}, "arguments": calls[i]["deltas"]}
        for i in order
        if i in calls and calls[i].get("done")
    ]
    if terminal:
        final = [
            {k: item.get(k) for k in ("id", "call_id", "name", "arguments")}
            for item in terminal[-1]["response"]["output"]
            if item["type"] == "function_call"
        ]
        assert final == out_calls, "the terminal object lists the calls the events carried"
    return {"calls": out_calls, "errors": errors, "terminal": terminal}


def parsed(calls: list[dict[str, Any]], key: str = "arguments") -> list[tuple[str, Any]]:
    return [(c["name"], json.loads(c[key]) if isinstance(c[key], str) else c[key]) for c in calls]


def assert_unique_ids(calls: list[dict[str, Any]], key: str) -> None:
    ids = [c[key] for c in calls]
    assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)


# -- what a Messages client assembles ----------------------------------------------------------------
def messages_view(data: bytes) -> dict[str, Any]:
    """Blocks by their start index (dense in order), tool_use blocks with id, name and joined input, the
    stop_reason, and error events."""
    evs = events(data)
    starts = [e for e in evs if e["type"] == "content_block_start"]
    assert [e["index"] for e in starts] == list(range(len(starts))), "block indexes dense in order"
    started = {e["index"] for e in starts}
    for e in evs:
        if e["type"] in ("content_block_delta", "content_block_stop"):
            assert e["index"] in started, "deltas and stops name a started block"
    calls = []
    for e in starts:
        block = e["content_block"]
        if block["type"] == "tool_use":
            raw = "".join(
                d["delta"]["partial_json"]
                for d in evs
                if d["type"] == "content_block_delta" and d["index"] == e["index"]
            )
            calls.append({"id": block.get("id"), "name": block["name"], "input": json.loads(raw) if raw else {}})
    stops = [e["delta"].get("stop_reason") for e in evs if e["type"] == "message_delta"]
    errors = [e for e in evs if e["type"] == "error"]
    return {"calls": calls, "stop": stops[-1] if stops else None, "errors": errors}


# == Responses, streamed ==============================================================================
def test_responses_well_formed_is_byte_for_byte_split_anywhere() -> None:
    evs = r_events()
    data = b"".join(evs)
    out, stage = run_r(evs)
    assert out == data and stage.changes == [] and stage.outcome == "untouched"
    for seed in range(5):
        stage = ResponsesToolCallRepair(R_TOOLS, capture_id="cap-16")
        assert run_stage(stage, random_splits(data, random.Random(seed))) == data


def _shift(key: str, mapping: Callable[[int], int]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """An event mutation renumbering `key` (Responses `output_index`, Messages block `index`)."""

    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        if isinstance(obj.get(key), int):
            obj[key] = mapping(obj[key])
        return obj

    return fn


@pytest.mark.parametrize(
    "mapping", [lambda i: i + 1, lambda i: i * 2, lambda i: i + (3 if i >= 2 else 0)], ids=["offset", "gap", "hole"]
)
def test_responses_output_index_is_dense(mapping: Callable[[int], int]) -> None:
    out, stage = run_r(mutate(r_events(), _shift("output_index", mapping)))
    view = responses_view(out)
    assert parsed(view["calls"]) == EXPECTED and not view["errors"]
    assert WRONG_INDEX in stage.defects and WRONG_INDEX in kinds(stage)


def _drop_call_id(which: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        items = [obj.get("item") or {}] + list((obj.get("response") or {}).get("output") or [])
        for item in items:
            if item.get("type") == "function_call" and item.get("call_id", "").endswith(which):
                del item["call_id"]
        return obj

    return fn


def test_responses_missing_call_id_is_minted_and_the_terminal_agrees() -> None:
    out, stage = run_r(mutate(r_events(), _drop_call_id("a" * 24)))
    view = responses_view(out)
    assert parsed(view["calls"]) == EXPECTED
    assert_unique_ids(view["calls"], "call_id")
    assert view["calls"][1]["call_id"] == "call_" + "b" * 24  # the other call keeps its id
    assert WRONG_INDEX in stage.defects


def test_responses_minted_call_id_is_stable() -> None:
    evs = mutate(r_events(), _drop_call_id(""))
    first = responses_view(run_r(evs)[0])["calls"]
    assert first == responses_view(run_r(evs)[0])["calls"]
    assert_unique_ids(first, "call_id")


def test_responses_duplicate_call_id_gives_the_later_call_a_minted_one() -> None:
    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        items = [obj.get("item") or {}] + list((obj.get("response") or {}).get("output") or [])
        for item in items:
            if item.get("call_id") == "call_" + "b" * 24:
                item["call_id"] = "call_" + "a" * 24
        return obj

    out, stage = run_r(mutate(r_events(), fn))
    view = responses_view(out)
    assert parsed(view["calls"]) == EXPECTED
    assert_unique_ids(view["calls"], "call_id")
    assert view["calls"][0]["call_id"] == "call_" + "a" * 24
    assert WRONG_INDEX in stage.defects


def test_responses_done_item_with_another_call_id_agrees_with_the_added_one() -> None:
    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["type"] == "response.output_item.done" and obj["item"].get("call_id") == "call_" + "a" * 24:
            obj["item"]["call_id"] = "call_other"
        return obj

    out, stage = run_r(mutate(r_events(), fn))
    view = responses_view(out)
    assert [c["call_id"] for c in view["calls"]] == ["call_" + "a" * 24, "call_" + "b" * 24]
    assert WRONG_INDEX in stage.defects


def _rename(old: str, new: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        items = [obj.get("item") or {}, obj.get("content_block") or {}]
        items += list((obj.get("response") or {}).get("output") or [])
        for item in items:
            if item.get("name") == old:
                item["name"] = new
        if obj.get("name") == old:
            obj["name"] = new
        return obj

    return fn


@pytest.mark.parametrize("wrong", ["Get_Weather", "get_weatherget_weather", "functions.get_weather", "GetWeather"])
def test_responses_name_forms_of_one_offered_tool_become_the_offered_name(wrong: str) -> None:
    out, stage = run_r(mutate(r_events(), _rename("get_weather", wrong)))
    view = responses_view(out)
    assert parsed(view["calls"]) == EXPECTED and not view["errors"]
    assert stage.outcome == "repaired" and stage.changes
    assert stage.changes[0].before["name"] == wrong and stage.changes[0].after["name"] == "get_weather"


def test_responses_unknown_tool_passes_byte_for_byte_flagged() -> None:
    evs = mutate(r_events(), _rename("get_weather", "lookup_stock"))
    out, stage = run_r(evs)
    assert out == b"".join(evs)
    assert UNKNOWN_TOOL in stage.defects and kinds(stage) == [UNKNOWN_TOOL]


def test_responses_terminal_object_disagreeing_with_the_events_is_made_to_agree() -> None:
    def other_args(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["type"] == "response.completed":
            obj["response"]["output"][2]["arguments"] = '{"city": "Paris"}'
        return obj

    out, stage = run_r(mutate(r_events(), other_args))
    assert parsed(responses_view(out)["calls"]) == EXPECTED and stage.changes

    def drop_call(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["type"] == "response.completed":
            del obj["response"]["output"][3]
        return obj

    out, stage = run_r(mutate(r_events(), drop_call))
    assert parsed(responses_view(out)["calls"]) == EXPECTED and stage.changes


def test_responses_renumbered_and_minted_together_agree_everywhere() -> None:
    evs = mutate(mutate(r_events(), _shift("output_index", lambda i: i + 7)), _drop_call_id(""))
    evs = mutate(evs, _rename("write", "Write"))
    view = responses_view(run_r(evs)[0])
    assert parsed(view["calls"]) == EXPECTED
    assert_unique_ids(view["calls"], "call_id")


# == Responses, non-streamed ==========================================================================
def r_body(fn: Callable[[dict[str, Any]], None] | None = None) -> bytes:
    obj = json.loads(responses_body(script(), {"tools": R_TOOLS}, "e" * 64, 1, "m", 10))
    if fn is not None:
        fn(obj)
    return orjson.dumps(obj)


def body_calls(body: bytes, key: str = "output") -> list[dict[str, Any]]:
    items = orjson.loads(body)[key]
    return [i for i in items if i["type"] in ("function_call", "tool_use")]


def test_responses_body_well_formed_untouched() -> None:
    body = r_body()
    assert repair_responses_body(body, R_TOOLS) == (body, [], "untouched")


# == Messages, streamed ===============================================================================
def test_messages_well_formed_is_byte_for_byte_split_anywhere() -> None:
    for s in (script(), script("stop", calls=0), script("length", calls=0)):
        evs = m_events(s)
        data = b"".join(evs)
        out, stage = run_m(evs)
        assert out == data and stage.changes == [] and stage.outcome == "untouched"
    data = b"".join(m_events())
    for seed in range(5):
        stage = MessagesToolCallRepair(M_TOOLS, capture_id="cap-16")
        assert run_stage(stage, random_splits(data, random.Random(seed))) == data


@pytest.mark.parametrize(
    "mapping", [lambda i: i + 1, lambda i: i * 2, lambda i: i + (5 if i >= 3 else 0)], ids=["offset", "gap", "hole"]
)
def test_messages_block_indexes_are_dense(mapping: Callable[[int], int]) -> None:
    out, stage = run_m(mutate(m_events(), _shift("index", mapping)))
    view = messages_view(out)
    assert [(c["name"], c["input"]) for c in view["calls"]] == EXPECTED and not view["errors"]
    assert view["stop"] == "tool_use" and WRONG_INDEX in stage.defects


def test_messages_tool_use_stop_without_a_tool_use_block_is_the_error() -> None:
    out, stage = run_m(m_events(script("tool_calls", calls=0)))
    view = messages_view(out)
    assert len(view["errors"]) == 1 and view["errors"][0]["error"]["type"] == "api_error"
    assert not view["calls"] and stage.outcome == "unrecoverable" and EMPTY_TURN in stage.defects


@pytest.mark.parametrize("stop", ["end_turn", "stop_sequence"])
def test_messages_end_turn_with_a_tool_use_block_becomes_tool_use(stop: str) -> None:
    def fn(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["type"] == "message_delta":
            obj["delta"]["stop_reason"] = stop
            obj["delta"]["stop_sequence"] = "</done>" if stop == "stop_sequence" else None
        return obj

    out, stage = run_m(mutate(m_events(), fn))
    view = messages_view(out)
    assert [(c["name"], c["input"]) for c in view["calls"]] == EXPECTED
    assert view["stop"] == "tool_use" and FINISH_MISMATCH in stage.defects and stage.outcome == "repaired"


def test_messages_max_tokens_with_complete_calls_becomes_tool_use() -> None:
    out, stage = run_m(m_events(script("length")))
    view = messages_view(out)
    assert [(c["name"], c["input"]) for c in view["calls"]] == EXPECTED and not view["errors"]
    assert view["stop"] == "tool_use" and FINISH_MISMATCH in stage.defects


def test_messages_max_tokens_with_a_cut_call_is_the_error() -> None:
    cut = script("length", calls=1, weather=['{"city": ', '"Oslo"'])  # block closed, no closing brace
    out, stage = run_m(m_events(cut))
    view = messages_view(out)
    assert len(view["errors"]) == 1 and not view["calls"] and stage.outcome == "unrecoverable"
    # the same call under a tool_use stop is repaired (only the cut explains the missing brace then)
    out, stage = run_m(m_events(script("tool_calls", calls=1, weather=['{"city": ', '"Oslo"'])))
    assert [(c["name"], c["input"]) for c in messages_view(out)["calls"]] == EXPECTED[:1]


def _m_ids(fn: Callable[[str], str | None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def mut(obj: dict[str, Any]) -> dict[str, Any]:
        block = obj.get("content_block") or {}
        if block.get("type") == "tool_use":
            new = fn(block["id"])
            if new is None:
                del block["id"]
            else:
                block["id"] = new
        return obj

    return mut


@pytest.mark.parametrize(
    "fn",
    [lambda i: None, lambda i: None if i.endswith("a" * 24) else i, lambda i: "toolu_same", lambda i: ""],
    ids=["all_missing", "one_missing", "duplicate", "empty"],
)
def test_messages_missing_or_duplicate_ids_are_minted(fn: Callable[[str], str | None]) -> None:
    out, stage = run_m(mutate(m_events(), _m_ids(fn)))
    view = messages_view(out)
    assert [(c["name"], c["input"]) for c in view["calls"]] == EXPECTED
    assert_unique_ids(view["calls"], "id")
    assert WRONG_INDEX in stage.defects


@pytest.mark.parametrize("wrong", ["Get_Weather", "get_weatherget_weather", "functions.get_weather"])
def test_messages_name_forms_become_the_offered_name(wrong: str) -> None:
    out, stage = run_m(mutate(m_events(), _rename("get_weather", wrong)))
    view = messages_view(out)
    assert [(c["name"], c["input"]) for c in view["calls"]] == EXPECTED and stage.outcome == "repaired"


def test_messages_unknown_tool_passes_byte_for_byte_flagged() -> None:
    evs = mutate(m_events(), _rename("get_weather", "lookup_stock"))
    out, stage = run_m(evs)
    assert out == b"".join(evs) and kinds(stage) == [UNKNOWN_TOOL] and UNKNOWN_TOOL in stage.defects


# == Messages, non-streamed ===========================================================================
def m_body(s: Script | None = None, fn: Callable[[dict[str, Any]], None] | None = None) -> bytes:
    obj = json.loads(messages_body(s or script(), "e" * 64, "m", 10))
    if fn is not None:
        fn(obj)
    return orjson.dumps(obj)


def test_messages_body_well_formed_untouched() -> None:
    for s in (script(), script("stop", calls=0)):
        body = m_body(s)
        assert repair_messages_body(body, M_TOOLS) == (body, [], "untouched")


def test_messages_body_stop_reason_matches_the_content() -> None:
    body, changes, outcome = repair_messages_body(m_body(script("tool_calls", calls=0)), M_TOOLS)
    assert outcome == "unrecoverable" and orjson.loads(body)["type"] == "error"
    assert [c.kind for c in changes] == [EMPTY_TURN]

    def end_turn(obj: dict[str, Any]) -> None:
        obj["stop_reason"] = "end_turn"

    for bad in (m_body(fn=end_turn), m_body(script("length"))):
        body, changes, outcome = repair_messages_body(bad, M_TOOLS)
        obj = orjson.loads(body)
        assert (
            outcome == "repaired" and obj["stop_reason"] == "tool_use" and FINISH_MISMATCH in [c.kind for c in changes]
        )
        assert [(b["name"], b["input"]) for b in body_calls(body, "content")] == EXPECTED

    def cut(obj: dict[str, Any]) -> None:
        obj["content"][2]["input"] = '{"city": "Oslo"'

    body, _, outcome = repair_messages_body(m_body(script("length"), cut), M_TOOLS)
    assert outcome == "unrecoverable" and orjson.loads(body)["type"] == "error"


# == Both whole bodies: call ids and tool names ======================================================
@dataclass(frozen=True)
class WholeBody:
    """Where a surface's whole body keeps its calls, and how to build and repair one."""

    items: str  # the list the calls sit in
    id_key: str
    args_key: str
    near_name: str  # a tool's name as a model miswrites it
    build: Callable[[Callable[[dict[str, Any]], None]], bytes]
    repair: Callable[..., tuple[bytes, list[Any], str]]


BODIES = {
    "responses": WholeBody(
        "output", "call_id", "arguments", "functions.get_weather", r_body, partial(repair_responses_body, tools=R_TOOLS)
    ),
    "messages": WholeBody(
        "content", "id", "input", "Get-Weather", lambda fn: m_body(fn=fn), partial(repair_messages_body, tools=M_TOOLS)
    ),
}


@pytest.mark.parametrize("surface", list(BODIES))
def test_body_ids_and_names(surface: str) -> None:
    shape = BODIES[surface]

    def missing(obj: dict[str, Any]) -> None:
        del obj[shape.items][2][shape.id_key]

    def duplicate(obj: dict[str, Any]) -> None:
        obj[shape.items][3][shape.id_key] = obj[shape.items][2][shape.id_key]

    def renamed(obj: dict[str, Any]) -> None:
        obj[shape.items][2]["name"] = shape.near_name

    for fn in (missing, duplicate, renamed):
        body, changes, outcome = shape.repair(shape.build(fn), capture_id="cap-16")
        calls = body_calls(body, shape.items)
        assert parsed(calls, shape.args_key) == EXPECTED and outcome == "repaired" and changes, fn.__name__
        assert_unique_ids(calls, shape.id_key)


@pytest.mark.parametrize("surface", list(BODIES))
def test_body_unknown_tool_is_flagged_unchanged(surface: str) -> None:
    shape = BODIES[surface]

    def unknown(obj: dict[str, Any]) -> None:
        obj[shape.items][2]["name"] = "lookup_stock"

    bad = shape.build(unknown)
    body, changes, _ = shape.repair(bad)
    assert body == bad and [c.kind for c in changes] == [UNKNOWN_TOOL]
