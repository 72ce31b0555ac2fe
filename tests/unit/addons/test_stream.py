"""StreamOwner in-process: which flows get a stream pipeline, the framing fix-ups it makes, the repair of a
plain JSON body, and the retryable error event it sends per surface when the upstream resets."""

from __future__ import annotations

import orjson
import pytest
from mitmproxy import flow as mflow
from mitmproxy import http
from mitmproxy.test import taddons
from tapfix.addons.runner.reset_tail import TAIL_ATTR
from tapfix.addons.stream import StreamOwner
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.response.pipeline import StreamPipeline

from tests.support.builders import chat_chunk, message_tool_call, sse
from tests.support.flows import READ_TOOL, flow, json_response, recorded, runtime, sse_response

HELLO = sse([chat_chunk({"content": "hello"})])


def test_an_sse_response_with_tools_is_owned_and_sent_chunked() -> None:
    owner = StreamOwner(runtime())
    f = flow(response=sse_response(HELLO))
    ex = recorded(f, tools=[READ_TOOL])
    with taddons.context(owner):
        owner.responseheaders(f)
    assert f.response is not None and isinstance(f.response.stream, StreamPipeline)
    assert f.response.headers["x-tapfix-capture-id"] == ex.id
    assert "content-length" not in f.response.headers  # a repaired stream may change length
    assert [(c.stage, c.kind, c.path) for c in ex.changes] == [("framing", "drop", "headers.content-length")]


def test_a_stream_without_stages_keeps_its_length() -> None:
    owner = StreamOwner(runtime())
    f = flow(response=sse_response(HELLO))
    ex = recorded(f)  # no tools: nothing to repair
    with taddons.context(owner):
        owner.responseheaders(f)
    assert f.response is not None and isinstance(f.response.stream, StreamPipeline)
    assert f.response.headers["content-length"] == str(len(HELLO)) and ex.changes == []


@pytest.mark.parametrize("status", [200, 500])
def test_guard_clauses_json_error_and_foreign_flows_get_no_pipeline(status: int) -> None:
    owner = StreamOwner(runtime())
    plain = flow(response=json_response({"ok": True}, status))
    recorded(plain, tools=[READ_TOOL])
    untracked = flow(response=sse_response(HELLO))  # no exchange: not a flow tapfix took
    with taddons.context(owner):
        owner.responseheaders(plain)
        owner.responseheaders(untracked)
    assert plain.response is not None and not plain.response.stream
    assert untracked.response is not None and not untracked.response.stream
    assert "x-tapfix-capture-id" not in untracked.response.headers


def _plain_tool_call_response(arguments: str) -> tuple[http.HTTPFlow, Exchange]:
    """A non-streamed chat completion whose one tool call carries `arguments`, run through the owner."""
    owner = StreamOwner(runtime())
    body = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "tool_calls": [message_tool_call(arguments)]},
            }
        ]
    }
    f = flow(response=json_response(body))
    ex = recorded(f, tools=[READ_TOOL])
    with taddons.context(owner):
        owner.response(f)
    return f, ex


def test_a_plain_body_is_repaired_and_its_content_length_follows() -> None:
    f, ex = _plain_tool_call_response('{"path": "a.txt"')
    assert f.response is not None and f.response.status_code == 200
    body = f.response.raw_content or b""
    call = orjson.loads(body)["choices"][0]["message"]["tool_calls"][0]
    assert orjson.loads(call["function"]["arguments"]) == {"path": "a.txt"}
    assert f.response.headers["content-length"] == str(len(body))
    assert ex.client_response == body and "toolcall_repaired" in ex.flags


def test_an_unrecoverable_plain_body_becomes_a_retryable_502() -> None:
    f, ex = _plain_tool_call_response('{"path": "a", "n": 1.')
    assert f.response is not None and f.response.status_code == 502
    error = orjson.loads(f.response.raw_content or b"")["error"]
    assert error["type"] == "server_error" and error["tapfix"]["capture_id"] == ex.id


def _reset(path: str, head: bytes) -> bytes:
    """Stream `head`, then break the upstream connection; the bytes the client gets after `head`."""
    owner = StreamOwner(runtime())
    f = flow(path, response=sse_response(head))
    ex = recorded(f)
    with taddons.context(owner):
        owner.responseheaders(f)
        assert f.response is not None and callable(f.response.stream)
        f.response.stream(head)
        f.error = mflow.Error("connection reset by peer")
        owner.error(f)
    tail = getattr(f.client_conn, TAIL_ATTR)
    assert ex.client_response_chunks == [head, tail]
    assert [(c.stage, c.kind) for c in ex.changes] == [("stream", "inject")]
    return tail


def test_a_chat_stream_cut_by_the_upstream_ends_with_a_server_error_then_done() -> None:
    tail = _reset("/v1/chat/completions", sse([chat_chunk({"content": "hel"})], done=False))
    event, done = tail.split(b"\n\n", 1)
    error = orjson.loads(event.removeprefix(b"data: "))["error"]
    assert (error["type"], error["code"], error["tapfix"]["reason"]) == ("server_error", 502, "upstream_reset")
    assert done == b"data: [DONE]\n\n"


def test_a_responses_stream_cut_by_the_upstream_ends_with_an_error_event() -> None:
    head = b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
    tail = _reset("/v1/responses", head)
    assert tail.startswith(b"event: error\n")
    assert orjson.loads(tail.split(b"data: ", 1)[1])["code"] == "server_error"


def test_a_messages_stream_cut_by_the_upstream_ends_with_an_api_error_event() -> None:
    head = b'event: message_start\ndata: {"type":"message_start","message":{"usage":{}}}\n\n'
    tail = _reset("/v1/messages", head)
    assert tail.startswith(b"event: error\n")
    assert orjson.loads(tail.split(b"data: ", 1)[1])["error"]["type"] == "api_error"


def test_a_client_that_left_gets_no_error_event() -> None:
    owner = StreamOwner(runtime())
    f = flow(response=sse_response(HELLO))
    ex = recorded(f)
    with taddons.context(owner):
        owner.responseheaders(f)
        f.error = mflow.Error("client disconnected")
        owner.error(f)
    assert getattr(f.client_conn, TAIL_ATTR, None) is None and ex.changes == []
