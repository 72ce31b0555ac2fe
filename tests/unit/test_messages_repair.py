"""Anthropic Messages (`/v1/messages`) tool-call repair, assembly and non-streamed repair."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.assemble import assemble, assemble_sse
from tapfix.proxy.mock.messages import messages_body, messages_events
from tapfix.proxy.mock.surface_script import Part, Script
from tapfix.proxy.toolcalls import MessagesToolCallRepair, repair_messages_body

from tests.support.builders import split_at
from tests.support.builders import sse_json as events
from tests.support.depth import examples
from tests.support.stage_io import WRITE_ARGS, WRITE_FRAGMENTS, WRITE_SCHEMA, assert_passes_untouched, run_stage

TOOLS = [{"name": "write", "description": "write a file", "input_schema": WRITE_SCHEMA}]


def script(frags: list[str], finish: str = "tool_calls") -> Script:
    parts = [
        Part("reasoning", ["I ", "will ", "write."]),
        Part("text", ["Writing", " it."]),
        Part("call", frags, "chatcmpl-tool-0123456789abcdef01234567", "write"),
    ]
    return Script(parts, finish, 12)


def stream(frags: list[str], **kw) -> bytes:
    return b"".join(messages_events(script(frags, **kw), "d" * 64, "m", 10))


def run(data: bytes, cuts: list[int] | None = None, policy: str = "error", tools=TOOLS):
    stage = MessagesToolCallRepair(tools, policy=policy, capture_id="cap1")
    return run_stage(stage, [data] if cuts is None else split_at(data, cuts)), stage


def sdk_input(data: bytes) -> dict | None:
    """What the anthropic SDK accumulates for the tool_use block (partial_json joined, then parsed)."""
    evs = events(data)
    starts = [e for e in evs if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    if not starts:
        return None
    index = starts[0]["index"]
    raw = "".join(e["delta"]["partial_json"] for e in evs if e["type"] == "content_block_delta" and e["index"] == index)
    return json.loads(raw) if raw else {}


def test_valid_stream_is_byte_identical():
    data = stream(WRITE_FRAGMENTS)
    out, stage = run(data)
    assert out == data and stage.outcome == "untouched"


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), st.booleans())
def test_valid_stream_split_anywhere_is_byte_identical(cuts, crlf):
    assert_passes_untouched(run, stream(WRITE_FRAGMENTS), cuts, crlf)


def test_a_call_without_input_deltas_means_empty_input():
    tools = [{"name": "write", "input_schema": {"type": "object", "properties": {}}}]
    data = stream([])
    out, stage = run(data, tools=tools)
    assert out == data and stage.outcome == "untouched"
    out, stage = run(data)  # but `path` and `content` are required here
    assert stage.outcome == "unrecoverable"


@pytest.mark.parametrize(
    ("frags", "kind"),
    [
        (WRITE_FRAGMENTS + ['{"path": "hello.txt", "content": "hi there"}'], "duplicated_fragments"),
        (['path": ', '"hello.txt", ', '"content": "hi', ' there"}'], "missing_first_chunk"),
        (['{"path": "hello.txt", "content": "hi there", "force": "true"}'], "schema_mismatch"),
    ],
)
def test_defects_are_repaired(frags, kind):
    out, stage = run(stream(frags))
    expected = {**WRITE_ARGS, "force": True} if kind == "schema_mismatch" else WRITE_ARGS
    assert sdk_input(out) == expected
    assert stage.outcome == "repaired" and kind in stage.defects
    assert events(out)[-1]["type"] == "message_stop"


def test_unrecoverable_call_is_never_sent_and_the_stream_ends_with_an_error():
    out, stage = run(stream(['{"path": "hello.txt", "content": "hi th'], finish="length"))
    evs = events(out)
    assert stage.outcome == "unrecoverable" and sdk_input(out) is None
    assert evs[-1]["type"] == "error" and evs[-1]["error"]["type"] == "api_error"
    assert evs[-1]["error"]["message"].startswith("upstream server error: tapfix could not recover tool call")
    assert out.endswith(b"\n\n") and b"event: error\n" in out
    assert any(e.get("delta", {}).get("type") == "text_delta" for e in evs)  # the text before it went out


def test_fail_fast_is_a_permanent_looking_error():
    out, _ = run(stream(['{"path": "hello.txt", "content": "hi th'], finish="length"), policy="fail_fast")
    error = events(out)[-1]["error"]
    assert error["type"] == "invalid_request_error" and "server" not in error["message"]


def test_upstream_error_while_a_call_is_open_is_replaced():
    data = stream(WRITE_FRAGMENTS)
    cut = data[: data.index(b'event: content_block_stop\ndata: {"type":"content_block_stop","index":2}')]
    error = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    cut += b"event: error\ndata: " + error + b"\n\n"
    out, stage = run(cut)
    assert stage.outcome == "unrecoverable" and sdk_input(out) is None
    assert events(out)[-1]["error"]["type"] == "api_error"


def test_assembly_of_stream_and_body():
    data = stream(WRITE_FRAGMENTS)
    a = assemble(data, "text/event-stream", "/v1/messages")
    assert (a.content, a.reasoning) == ("Writing it.", "I will write.")
    call = {"id": "toolu_0123456789abcdef01234567", "name": "write", "arguments": "".join(WRITE_FRAGMENTS)}
    assert a.tool_calls == [call]
    assert a.finish_reason == "tool_use" and a.done
    assert a.usage == {"input_tokens": 10, "output_tokens": 12}
    assert assemble_sse([data]).tool_calls == a.tool_calls
    b = assemble(messages_body(script(WRITE_FRAGMENTS), "d" * 64, "m", 10), "application/json")
    assert (b.content, b.reasoning, b.finish_reason) == (a.content, a.reasoning, "tool_use")
    assert json.loads(b.tool_calls[0]["arguments"]) == WRITE_ARGS


def test_non_streamed_repair():
    good = messages_body(script(WRITE_FRAGMENTS), "d" * 64, "m", 10)
    assert repair_messages_body(good, TOOLS) == (good, [], "untouched")
    obj = orjson.loads(good)
    obj["content"][2]["input"] = {"path": "hello.txt", "content": "hi there", "force": "false"}
    body, changes, outcome = repair_messages_body(orjson.dumps(obj), TOOLS)
    assert outcome == "repaired" and orjson.loads(body)["content"][2]["input"]["force"] is False
    obj["content"][2]["input"] = {"path": "hello.txt"}
    body, _, outcome = repair_messages_body(orjson.dumps(obj), TOOLS)
    err = orjson.loads(body)
    assert outcome == "unrecoverable" and err["type"] == "error" and err["error"]["type"] == "api_error"
