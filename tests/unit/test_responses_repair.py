"""Responses (`/v1/responses`) tool-call repair, assembly and non-streamed repair, on mock-built streams."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.assemble import assemble, assemble_sse
from tapfix.proxy.mock.responses import responses_body, responses_events
from tapfix.proxy.mock.surface_script import Part, Script
from tapfix.proxy.toolcalls import ResponsesToolCallRepair, repair_responses_body

from tests.support.builders import split_at
from tests.support.builders import sse_json as events
from tests.support.depth import examples
from tests.support.stage_io import WRITE_ARGS, WRITE_FRAGMENTS, WRITE_SCHEMA, assert_passes_untouched, run_stage

TOOLS = [{"type": "function", "name": "write", "parameters": WRITE_SCHEMA}]


def script(frags: list[str], finish: str = "tool_calls", text: bool = True) -> Script:
    parts = [Part("reasoning", ["I ", "will ", "write."])]
    if text:
        parts.append(Part("text", ["Writing", " it."]))
    parts.append(Part("call", frags, "chatcmpl-tool-0123456789abcdef01234567", "write"))
    return Script(parts, finish, 12)


def stream(frags: list[str], **kw) -> bytes:
    return b"".join(responses_events(script(frags, **kw), {"tools": TOOLS}, "d" * 64, 1_760_000_000, "m", 10))


def run(data: bytes, chunks: list[int] | None = None, policy: str = "error") -> tuple[bytes, ResponsesToolCallRepair]:
    stage = ResponsesToolCallRepair(TOOLS, policy=policy, capture_id="cap1")
    return run_stage(stage, [data] if chunks is None else split_at(data, chunks)), stage


def client_call(data: bytes) -> tuple[dict | None, list[dict]]:
    """What a delta-reading client builds, and the final output's call (they must agree)."""
    evs = events(data)
    deltas = "".join(e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta")
    done = [e for e in evs if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    final = [
        i
        for e in evs
        if e["type"] == "response.completed"
        for i in e["response"]["output"]
        if i["type"] == "function_call"
    ]
    if not done:
        return None, evs
    assert done[0]["item"]["arguments"] == deltas
    assert final and final[0]["arguments"] == deltas
    return json.loads(deltas), evs


def test_valid_stream_is_byte_identical():
    data = stream(WRITE_FRAGMENTS)
    out, stage = run(data)
    assert out == data and stage.outcome == "untouched" and stage.changes == []


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=20_000), max_size=12), st.booleans())
def test_valid_stream_split_anywhere_is_byte_identical(cuts, crlf):
    assert_passes_untouched(run, stream(WRITE_FRAGMENTS), cuts, crlf)


@pytest.mark.parametrize(
    ("frags", "kind"),
    [
        (WRITE_FRAGMENTS + ['{"path": "hello.txt", "content": "hi there"}'], "duplicated_fragments"),  # resent whole
        (['path": ', '"hello.txt", ', '"content": "hi', ' there"}'], "missing_first_chunk"),
        (['{"path": "hello.txt", "content": "hi there", "force": "true"}'], "schema_mismatch"),
        (["{'path': 'hello.txt', 'content': 'hi there'}"], "invalid_json"),
    ],
)
def test_defects_are_repaired(frags, kind):
    out, stage = run(stream(frags))
    call, _ = client_call(out)
    expected = {**WRITE_ARGS, "force": True} if kind == "schema_mismatch" else WRITE_ARGS
    assert call == expected
    assert stage.outcome == "repaired" and kind in stage.defects
    assert stage.changes and stage.changes[0].after["arguments"] == json.dumps(expected)


def test_cut_inside_a_string_is_unrecoverable_and_ends_with_an_error_event():
    out, stage = run(stream(['{"path": "hello.txt", "content": "hi th'], finish="length"))
    call, evs = client_call(out)
    assert call is None and stage.outcome == "unrecoverable"
    assert not any("function_call" in json.dumps(e) for e in evs if e["type"] != "response.failed")
    error, failed = evs[-2], evs[-1]
    assert error["type"] == "error" and error["error"]["code"] == 502
    assert "upstream server error" in error["message"] and error["code"] == "server_error"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert b"event: error\n" in out and out.endswith(b"\n\n")
    # the text that came before the call still went out
    assert any(e["type"] == "response.output_text.delta" for e in evs)


def test_fail_fast_has_no_retry_words():
    out, _ = run(stream(['{"path": "hello.txt", "content": "hi th'], finish="length"), policy="fail_fast")
    error = events(out)[-2]
    assert error["code"] == "tool_call_unrecoverable"
    assert "server" not in json.dumps(error).lower()


def test_passthrough_policy_sends_the_held_bytes():
    data = stream(['{"path": "hello.txt", "content": "hi th'], finish="length")
    out, stage = run(data, policy="passthrough")
    assert stage.outcome == "unrecoverable"
    start = out.index(b": tapfix")
    assert out.replace(out[start : out.index(b"\n\n", start) + 2], b"") == data


def test_stream_cut_while_a_call_is_open_is_detected():
    data = stream(WRITE_FRAGMENTS)
    cut = data[: data.index(b"response.function_call_arguments.done")]
    cut = cut[: cut.rindex(b"event:")]
    out, stage = run(cut)
    assert stage.outcome == "unrecoverable" and events(out)[-1]["type"] == "response.failed"


def test_assembly_of_stream_and_body():
    data = stream(WRITE_FRAGMENTS)
    a = assemble(data, "text/event-stream", "/v1/responses")
    assert a.content == "Writing it." and a.reasoning == "I will write."
    assert a.tool_calls == [
        {"id": "call_0123456789abcdef01234567", "name": "write", "arguments": "".join(WRITE_FRAGMENTS)}
    ]
    assert a.finish_reason == "completed" and a.done and a.usage["output_tokens"] == 12
    assert assemble_sse([data[:100], data[100:]]).tool_calls == a.tool_calls  # sniffed without a path
    body = responses_body(script(WRITE_FRAGMENTS), {}, "d" * 64, 1, "m", 10)
    b = assemble(body, "application/json")
    assert (b.content, b.reasoning, b.tool_calls, b.finish_reason) == (
        a.content,
        a.reasoning,
        a.tool_calls,
        "completed",
    )
    cut = assemble(stream(WRITE_FRAGMENTS[:2], finish="length"), "text/event-stream", "/v1/responses")
    assert cut.finish_reason == "max_output_tokens"


def test_reasoning_summaries_are_assembled():
    ev = [
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs",
            "output_index": 0,
            "summary_index": 0,
            "delta": "Thinking",
        },
        {
            "type": "response.completed",
            "response": {
                "status": "completed",
                "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Thinking hard"}]}],
            },
        },
    ]
    data = b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), json.dumps(e).encode()) for e in ev)
    assert assemble(data, "text/event-stream", "/v1/responses").reasoning == "Thinking hard"


def test_non_streamed_repair():
    good = responses_body(script(WRITE_FRAGMENTS), {}, "d" * 64, 1, "m", 10)
    assert repair_responses_body(good, TOOLS) == (good, [], "untouched")
    bad = responses_body(script(["{'path': 'hello.txt', 'content': 'hi there'}"]), {}, "d" * 64, 1, "m", 10)
    body, changes, outcome = repair_responses_body(bad, TOOLS)
    assert outcome == "repaired" and changes
    call = next(i for i in orjson.loads(body)["output"] if i["type"] == "function_call")
    assert json.loads(call["arguments"]) == WRITE_ARGS
    cut_script = script(['{"path": "hello.txt", "content": "hi'], finish="length")
    cut = responses_body(cut_script, {}, "d" * 64, 1, "m", 1)
    body, _, outcome = repair_responses_body(cut, TOOLS)
    assert outcome == "unrecoverable" and orjson.loads(body)["error"]["type"] == "server_error"
