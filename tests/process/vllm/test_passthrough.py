"""tapfix in front of a real vLLM passes its answers through byte for byte.

What vLLM really sent is recorded by the realengine suite's independent loopback relay
(tests/process/realengine/relay.py) between `tapfix run` and vLLM, so each comparison is against the same request's
bytes on the wire (vLLM's ids and `created` differ per request). Tool-call repair is armed (tapfix run's
default) and must stay silent on vLLM's valid answers: the capture records no response-side change, and the
request reaches vLLM as the client sent it plus exactly the recorded changes (the realengine suite's checks).

Each case states the model's exact text (forced: tests/process/vllm/served/forcing_plan.py) and first checks that
vLLM's own answer shows what the case is named for (a call, reasoning, an error), so no case passes vacuously.
The server runs the `hermes` tool parser and the `qwen3` reasoning parser, as a Qwen3 deployment does.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.process.engine_suite import relayed
from tests.process.realengine.relay import Exchange, Relay
from tests.process.realengine.test_passthrough import Seen, assert_forwarded, assert_passed_back, recorded_changes
from tests.process.vllm.engine import MAX_MODEL_LEN, MODEL
from tests.process.vllm.wire import (
    CHAT,
    READ_ARGS,
    THINKING,
    TOOLS,
    WRITE_ARGS,
    ask,
    chat_body,
    chat_choice,
    exactly,
    hermes_call,
    messages_blocks,
    parsed_events,
    think,
)
from tests.support.inproc import InprocProxy

pytestmark = [pytest.mark.vllm]

WRITE_CALL = hermes_call("write", WRITE_ARGS)
READ_CALL = hermes_call("read", READ_ARGS)
HI = [{"role": "user", "content": "hi"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
# The model's own answer (no directive): reasoning it closes itself, then "Hello!"
OWN_REASONING, OWN_ANSWER = "Okay, the user wants a file written", "\n\nHello!"

# name -> (request body, what vLLM's own answer must show)
CHAT_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "stream": (chat_body(HI, stream=True, **NO_THINKING), {"content": "Hello!"}),
    "whole": (chat_body(HI, **NO_THINKING), {"content": "Hello!"}),
    "stream_usage": (
        chat_body(HI, stream=True, stream_options={"include_usage": True}, **NO_THINKING),
        {"content": "Hello!", "usage": True},
    ),
    "stream_reasoning": (chat_body(HI, stream=True), {"reasoning": OWN_REASONING, "content": OWN_ANSWER}),
    "whole_reasoning": (chat_body(HI), {"reasoning": OWN_REASONING, "content": OWN_ANSWER}),
    "stream_tool_call": (
        chat_body(ask("Write hello.py.", think() + WRITE_CALL), tools=TOOLS, stream=True),
        {"reasoning": THINKING, "calls": [("write", WRITE_ARGS)]},
    ),
    "whole_tool_call": (
        chat_body(ask("Write hello.py.", think() + WRITE_CALL), tools=TOOLS),
        {"reasoning": THINKING, "calls": [("write", WRITE_ARGS)]},
    ),
    # Forced by vLLM's own structured outputs instead of the directive: the model closes its reasoning itself,
    # then the regex holds its content to the call, and the hermes parser reads it as one.
    **{
        f"{mode}_tool_call_by_structured_outputs": (
            chat_body(
                [{"role": "user", "content": "Write hello.py."}],
                tools=TOOLS,
                structured_outputs={"regex": exactly(WRITE_CALL)},
                **({"stream": True} if mode == "stream" else {}),
            ),
            {"reasoning": OWN_REASONING, "calls": [("write", WRITE_ARGS)]},
        )
        for mode in ("stream", "whole")
    },
    "stream_text_then_call": (
        chat_body(ask("Write hello.py.", think() + "I will write the file.\n" + WRITE_CALL), tools=TOOLS, stream=True),
        {"content": "\n\nI will write the file.\n", "calls": [("write", WRITE_ARGS)]},
    ),
    "stream_two_calls": (
        chat_body(ask("Write, then read.", think() + WRITE_CALL + "\n" + READ_CALL), tools=TOOLS, stream=True),
        {"calls": [("write", WRITE_ARGS), ("read", READ_ARGS)]},
    ),
    "wrong_model": ({**chat_body(HI), "model": "gpt-4o"}, {"status": 404}),
}
# What tapfix may ask vLLM itself beside a request (issue 37): its window, and the prompt's count by its tokenizer.
WINDOW_READS = ("GET /v1/models ", "POST /tokenize ")


relay, proxy = relayed("vllm")


def post(proxy: InprocProxy, path: str, body: dict[str, Any]) -> tuple[Seen, Seen]:
    """The request as the client sent it, and the response as it received it (undecoded, de-chunked)."""
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST", proxy.url + path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
        ) as response,
    ):
        raw = b"".join(response.iter_raw())
    sent = Seen(None, response.request.headers, response.request.content)
    return sent, Seen(response.status_code, response.headers, raw)


def the_request(seen: list[Exchange], path: str) -> Exchange:
    """The one request tapfix sent upstream for the client's (anything else only reads vLLM's window)."""
    [exchange] = [e for e in seen if e.request.start_line.startswith(f"POST {path} ")]
    assert all(e is exchange or e.request.start_line.startswith(WINDOW_READS) for e in seen), seen
    return exchange


def through(proxy: InprocProxy, relay: Relay, path: str, body: dict[str, Any]) -> tuple[Seen, Exchange, list[dict]]:
    """Send `body` through tapfix; check the passthrough promises against the relay's record of the same
    request; return what the client got, the exchange vLLM saw, and the capture's changes."""
    mark = relay.mark()
    sent, received = post(proxy, path, body)
    exchange = the_request(relay.exchanges_since(mark), path)
    changes = recorded_changes(proxy.extra["db"], received.headers["x-tapfix-capture-id"])
    assert_passed_back(received, exchange)
    assert_forwarded(sent, exchange, changes)
    # with tapfix run's defaults (no --engine, no --generation-config) nothing of the body changes
    assert not [c for c in changes if not c["path"].startswith("headers.")], changes
    return received, exchange, changes


@pytest.mark.parametrize("name", list(CHAT_CASES))
def test_the_client_gets_exactly_what_vllm_sent(proxy: InprocProxy, relay: Relay, name: str) -> None:
    body, expect = CHAT_CASES[name]
    received, exchange, _ = through(proxy, relay, CHAT, body)
    response = exchange.response
    assert response.status == expect.get("status", 200), response.body[:500]
    if response.status != 200:
        error = json.loads(response.body)["error"]
        assert error["code"] == response.status and error["type"] in ("NotFoundError", "BadRequestError")
        return
    stream = bool(body.get("stream"))
    if stream:
        assert response.header("content-type") == "text/event-stream; charset=utf-8"
        assert response.body.endswith(b"data: [DONE]\n\n")
    answer = chat_choice(response.body, stream)
    for field in ("content", "reasoning"):
        if field in expect:
            assert getattr(answer, field) == expect[field], field
    if "calls" in expect:
        assert answer.parsed_calls() == expect["calls"] and answer.finish_reason == "tool_calls"
        assert all(c["id"].startswith("chatcmpl-tool-") for c in answer.calls)
    else:
        assert (answer.calls, answer.finish_reason) == ([], "stop")
    if expect.get("usage"):
        *_, (_, last), (_, done) = parsed_events(response.body)
        assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0 and done == "[DONE]"


@pytest.mark.parametrize("tools", [False, True], ids=["messages", "with_tools"])
def test_a_budget_over_the_window_is_clamped_by_vllms_own_count(proxy: InprocProxy, relay: Relay, tools: bool) -> None:
    """vLLM refuses prompt + max_tokens over max_model_len instead of clamping (vllm #42474); through tapfix
    the client is answered, max_tokens lowered to what vLLM's own count of the prompt leaves. The prompt is
    what the chat template renders: an agent's tools and the template's arguments are part of it (counted
    without them, the recorded budget is over what the window leaves: vLLM 0.32 lowers it again itself, an
    engine that refuses instead answers 400)."""
    body = chat_body(HI, max_tokens=MAX_MODEL_LEN + 1, **NO_THINKING, **({"tools": TOOLS} if tools else {}))
    mark = relay.mark()
    _, received = post(proxy, CHAT, body)
    seen = relay.exchanges_since(mark)
    exchange = the_request(seen, CHAT)
    [*_, counted] = [e for e in seen if e.request.start_line.startswith("POST /tokenize ")]
    count = json.loads(counted.response.body)["count"]
    asked = json.loads(counted.request.body)
    assert asked.get("tools") == (TOOLS if tools else None)
    assert asked["chat_template_kwargs"] == NO_THINKING["chat_template_kwargs"]
    assert json.loads(exchange.request.body)["max_tokens"] == MAX_MODEL_LEN - count
    assert exchange.response.status == received.status == 200, received.body[:500]
    assert tools or chat_choice(received.body, False).content == "Hello!"
    changes = recorded_changes(proxy.extra["db"], received.headers["x-tapfix-capture-id"])
    [clamp] = [c for c in changes if c["stage"] == "window"]
    assert clamp["path"] == "$.max_tokens" and "the engine's count" in clamp["reason"]


@pytest.mark.parametrize("budget", [False, True], ids=["vllms_error", "counted_first"])
def test_vllms_overflow_reaches_the_client_as_the_overflow_agents_compact_on(
    proxy: InprocProxy, relay: Relay, budget: bool
) -> None:
    """A prompt longer than vLLM's window reaches the client as OpenAI's context_length_exceeded (what opencode
    and pi match). Without max_tokens vLLM's own 400 is rewritten, with vLLM's numbers, and the capture keeps
    vLLM's error; with one, tapfix counts the prompt by vLLM's tokenizer first and answers without sending it."""
    body = chat_body([{"role": "user", "content": "1" * MAX_MODEL_LEN}], stream=True)  # a token per digit
    if not budget:
        del body["max_tokens"]
    mark = relay.mark()
    _, received = post(proxy, CHAT, body)
    seen = relay.exchanges_since(mark)
    assert received.status == 400
    error = json.loads(received.body)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "context_length_exceeded")
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]
    changes = recorded_changes(proxy.extra["db"], received.headers["x-tapfix-capture-id"])
    if budget:
        [counted] = [e for e in seen if e.request.start_line.startswith("POST /tokenize ")]
        assert f"resulted in {json.loads(counted.response.body)['count']} tokens" in error["message"]
        assert not [e for e in seen if e.request.start_line.startswith(f"POST {CHAT} ")]  # never sent
        return
    exchange = the_request(seen, CHAT)
    assert exchange.response.status == 400
    vllms = json.loads(exchange.response.body)["error"]
    assert vllms["type"] == "BadRequestError" and str(MAX_MODEL_LEN) in vllms["message"]
    assert [c["stage"] for c in changes if not c["path"].startswith("headers.")] == ["window"]


def test_a_call_with_broken_json_arguments_is_repaired_or_failed_cleanly(proxy: InprocProxy, relay: Relay) -> None:
    """vLLM streams whatever the model wrote inside `<tool_call>` as arguments, and still finishes with
    `tool_calls`. tapfix must not pass the broken arguments on: the client gets valid JSON or a retryable
    error, and the capture says which."""
    broken = '<tool_call>\n{"name": "write", "arguments": {"path": "/tmp/a.py", "content": \n</tool_call>'
    body = chat_body(ask("Write a.py.", think() + broken), tools=TOOLS, stream=True)
    mark = relay.mark()
    _, received = post(proxy, CHAT, body)
    exchange = the_request(relay.exchanges_since(mark), CHAT)
    sent_by_vllm = chat_choice(exchange.response.body, True)
    assert sent_by_vllm.finish_reason == "tool_calls"
    [call] = sent_by_vllm.calls
    with pytest.raises(ValueError):
        json.loads(call["arguments"])  # vLLM passed the broken arguments on
    capture_id = received.headers["x-tapfix-capture-id"]
    changes = recorded_changes(proxy.extra["db"], capture_id)
    events = parsed_events(received.body)
    errors = [data for _, data in events if isinstance(data, dict) and "error" in data]
    got = chat_choice(received.body, True)
    if errors:  # failed: a retryable error event, no call bytes, and the capture records the failure
        assert errors[0]["error"]["type"] == "server_error", errors
        assert got.calls == [] or all(not c["arguments"] for c in got.calls)
        assert any(c["stage"] == "toolcalls" for c in changes), changes
    else:  # repaired: valid JSON, recorded as a change
        [fixed] = got.calls
        assert json.loads(fixed["arguments"])["path"] == "/tmp/a.py"
        assert any(c["stage"] == "toolcalls" for c in changes), changes


MESSAGES_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_messages_with_thinking_and_tool_use_pass_through(proxy: InprocProxy, relay: Relay, stream: bool) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 400,
        "temperature": 0,
        "stream": stream,
        "messages": ask("Write hello.py.", think() + "Writing it.\n" + WRITE_CALL),
        "tools": MESSAGES_TOOLS,
    }
    received, exchange, _ = through(proxy, relay, "/v1/messages", body)
    assert exchange.response.status == 200, exchange.response.body[:500]
    blocks = messages_blocks(exchange.response.body, stream)
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[0]["thinking"] == THINKING
    assert (blocks[2]["name"], blocks[2]["input"]) == ("write", WRITE_ARGS)
    if stream:
        names = [name for name, _ in parsed_events(exchange.response.body)]
        assert names[0] == "message_start" and names[-1] == "message_stop" and None not in names
    else:
        assert json.loads(exchange.response.body)["stop_reason"] == "tool_use"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_responses_with_reasoning_and_a_function_call_pass_through(
    proxy: InprocProxy, relay: Relay, stream: bool
) -> None:
    body = {
        "model": MODEL,
        "input": ask("Write hello.py.", think() + WRITE_CALL)[0]["content"],
        "tools": [{"type": "function", **t["function"]} for t in TOOLS],
        "temperature": 0,
        "max_output_tokens": 400,
        "stream": stream,
    }
    received, exchange, _ = through(proxy, relay, "/v1/responses", body)
    assert exchange.response.status == 200, exchange.response.body[:500]
    if stream:
        events = parsed_events(exchange.response.body)
        [completed] = [data for name, data in events if name == "response.completed"]
        output = completed["response"]["output"]
    else:
        output = json.loads(exchange.response.body)["output"]
    kinds = [item["type"] for item in output]
    assert kinds[0] == "reasoning" and kinds[-1] == "function_call", kinds
    call = output[-1]
    assert (call["name"], json.loads(call["arguments"])) == ("write", WRITE_ARGS)
