"""Responses and Messages end to end: the openai and anthropic SDKs → `tapfix run` → `tapfix mock`.

Checks what the issue asks for on real processes: captures assembled into the store's columns,
sampling defaults and reasoning mapped in the forwarded bytes (`captures export --forwarded`), broken
tool-call streams repaired, and unrecoverable ones ended with an error event each SDK raises.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.support.inproc import cli, start_mock, start_proxy
from tests.support.procs import wait_capture

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
RESPONSES_TOOLS = [{"type": "function", "name": "write", "description": "Write a file", "parameters": SCHEMA}]
ANTHROPIC_TOOLS = [{"name": "write", "description": "Write a file", "input_schema": SCHEMA}]
PROMPT = 'Create hello.txt containing "hi there"'
ARGS = {"path": "hello.txt", "content": "hi there\n"}  # the script ends a file with a newline
MODES = ("truncate", "unclosed", "resend_whole", "drop_opening")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("surfaces")
    rules = [{"when": {"model": f"break-{m}"}, "do": "break_tool_call", "mode": m} for m in MODES]
    (tmp / "scenario.json").write_text(json.dumps({"rules": rules}))
    (tmp / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 4096})
    )
    mock = start_mock(tmp, "--scenario", str(tmp / "scenario.json"))
    gen = str(tmp / "generation_config.json")
    proxy = start_proxy(tmp, mock.url, "--engine", "vllm", "--generation-config", gen, shared=True)
    yield mock, proxy
    proxy.stop()
    mock.stop()


def _row(proxy, capture_id):
    row = wait_capture(proxy.extra["db"], capture_id)
    row["tool_calls"] = json.loads(row["tool_calls"] or "[]")
    row["usage"] = json.loads(row["usage"]) if row["usage"] else None
    row["flags"] = json.loads(row["flags"] or "[]")
    return row


def _forwarded(proxy, capture_id) -> dict:
    out = cli("captures", "export", capture_id, "--forwarded", "--db", str(proxy.extra["db"]))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# -- Responses ---------------------------------------------------------------------------------
def _openai(proxy):
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)


def _responses_stream(proxy, model, **kw):
    raw = _openai(proxy).responses.with_raw_response.create(
        model=model, input=PROMPT, tools=RESPONSES_TOOLS, stream=True, **kw
    )
    calls, error, events = [], None, []
    try:
        for event in raw.parse():
            events.append(event.type)
            if event.type == "response.output_item.done" and event.item.type == "function_call":
                calls.append((event.item.name, json.loads(event.item.arguments)))
    except openai.APIError as e:
        error = e
    return calls, error, raw.headers["x-tapfix-capture-id"], events


def test_responses_stream_is_captured_and_mapped(stack):
    _, proxy = stack
    reasoning = {"effort": "max", "summary": "auto"}
    calls, error, capture_id, events = _responses_stream(proxy, "m", reasoning=reasoning)
    assert error is None and calls == [("write", ARGS)] and events[-1] == "response.completed"
    row = _row(proxy, capture_id)
    assert row["tool_calls"][0]["name"] == "write" and json.loads(row["tool_calls"][0]["arguments"]) == ARGS
    assert row["tool_calls"][0]["id"].startswith("call_")
    assert row["reasoning"].startswith("The user wants me to") and row["finish_reason"] == "completed"
    assert row["usage"]["output_tokens"] > 0 and row["completion_tokens"] == row["usage"]["output_tokens"]
    assert row["client_response_body_id"] is None  # a valid stream passes byte for byte
    fwd = _forwarded(proxy, capture_id)
    assert fwd["reasoning"] == {"effort": "xhigh", "summary": "auto"}  # vLLM validates OpenAI's levels
    assert (fwd["temperature"], fwd["top_p"], fwd["max_output_tokens"]) == (0.6, 0.95, 4096)
    assert "top_k" not in fwd and "max_tokens" not in fwd


def test_responses_non_streamed_text(stack):
    _, proxy = stack
    raw = _openai(proxy).responses.with_raw_response.create(
        model="m", input="What is 6 * 7?", reasoning={"effort": "low"}
    )
    response = raw.parse()
    assert response.output_text == "6 * 7 = 42."
    row = _row(proxy, raw.headers["x-tapfix-capture-id"])
    assert row["content"] == "6 * 7 = 42." and row["reasoning"] and row["tool_calls"] == []
    assert row["finish_reason"] == "completed" and row["usage"]["input_tokens"] > 0


@pytest.mark.parametrize("mode", ["unclosed", "resend_whole", "drop_opening"])
def test_responses_broken_stream_is_repaired(stack, mode):
    _, proxy = stack
    calls, error, capture_id, _ = _responses_stream(proxy, f"break-{mode}")
    assert error is None and calls == [("write", ARGS)]
    row = _row(proxy, capture_id)
    assert "toolcall_repaired" in row["flags"] and json.loads(row["tool_calls"][0]["arguments"]) == ARGS


def test_responses_unrecoverable_stream_raises_in_the_sdk(stack):
    _, proxy = stack
    calls, error, capture_id, _ = _responses_stream(proxy, "break-truncate")
    assert calls == [] and isinstance(error, openai.APIError)
    assert "upstream server error: tapfix could not recover tool call 'write'" in str(error)
    row = _row(proxy, capture_id)
    assert "toolcall_unrecoverable" in row["flags"] and row["tool_calls"] == []


def test_responses_non_streamed_unrecoverable_is_a_502(stack):
    _, proxy = stack
    with pytest.raises(openai.InternalServerError) as info:
        _openai(proxy).responses.create(model="break-truncate", input=PROMPT, tools=RESPONSES_TOOLS)
    assert info.value.status_code == 502


# -- Messages ----------------------------------------------------------------------------------
def _anthropic(proxy):
    return anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)


def test_messages_stream_is_captured_and_mapped(stack):
    _, proxy = stack
    with _anthropic(proxy).messages.stream(
        model="m",
        max_tokens=6000,
        messages=[{"role": "user", "content": PROMPT}],
        tools=ANTHROPIC_TOOLS,
        thinking={"type": "adaptive"},
        extra_body={"output_config": {"effort": "high"}},
    ) as stream:
        message = stream.get_final_message()
        capture_id = stream.response.headers["x-tapfix-capture-id"]
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("write", ARGS)] and message.stop_reason == "tool_use"
    assert any(b.type == "thinking" and b.thinking for b in message.content)
    row = _row(proxy, capture_id)
    assert row["tool_calls"] == [{"id": uses[0].id, "name": "write", "arguments": json.dumps(ARGS)}]
    assert row["reasoning"] and row["finish_reason"] == "tool_use"
    assert row["usage"]["input_tokens"] > 0 and row["usage"]["output_tokens"] > 0
    fwd = _forwarded(proxy, capture_id)
    assert fwd["thinking"] == {"type": "enabled", "budget_tokens": 5999}  # high → 16384, kept < max_tokens
    assert fwd["output_config"] == {"effort": "high"}
    assert (fwd["temperature"], fwd["top_p"], fwd["top_k"], fwd["max_tokens"]) == (0.6, 0.95, 20, 6000)


def test_messages_budget_is_clamped_and_text_assembled(stack):
    _, proxy = stack
    raw = _anthropic(proxy).messages.with_raw_response.create(
        model="m",
        max_tokens=3000,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        thinking={"type": "enabled", "budget_tokens": 500},
    )
    message = raw.parse()
    assert message.content[-1].text == "The capital of France is Paris."
    capture_id = raw.headers["x-tapfix-capture-id"]
    row = _row(proxy, capture_id)
    assert row["content"] == "The capital of France is Paris." and row["finish_reason"] == "end_turn"
    assert _forwarded(proxy, capture_id)["thinking"] == {"type": "enabled", "budget_tokens": 1024}


@pytest.mark.parametrize("mode", ["unclosed", "resend_whole", "drop_opening"])
def test_messages_broken_stream_is_repaired(stack, mode):
    _, proxy = stack
    with _anthropic(proxy).messages.stream(
        model=f"break-{mode}", max_tokens=2000, tools=ANTHROPIC_TOOLS, messages=[{"role": "user", "content": PROMPT}]
    ) as stream:
        message = stream.get_final_message()
        capture_id = stream.response.headers["x-tapfix-capture-id"]
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == [("write", ARGS)]
    assert "toolcall_repaired" in _row(proxy, capture_id)["flags"]


def test_messages_unrecoverable_stream_raises_in_the_sdk(stack):
    _, proxy = stack
    client = _anthropic(proxy)
    raw = client.messages.with_raw_response.create(
        model="break-truncate",
        max_tokens=2000,
        stream=True,
        tools=ANTHROPIC_TOOLS,
        messages=[{"role": "user", "content": PROMPT}],
    )
    seen = []
    with pytest.raises(anthropic.APIStatusError) as info:
        for event in raw.parse():
            seen.append(event.type)
    assert "upstream server error: tapfix could not recover tool call 'write'" in str(info.value)
    assert info.value.body["error"]["type"] == "api_error"
    assert "content_block_start" not in seen[-1:]  # the held tool_use block never went out
    row = _row(proxy, raw.headers["x-tapfix-capture-id"])
    assert "toolcall_unrecoverable" in row["flags"] and row["tool_calls"] == []


def test_messages_non_streamed_unrecoverable_is_a_502(stack):
    _, proxy = stack
    with pytest.raises(anthropic.InternalServerError) as info:
        _anthropic(proxy).messages.create(
            model="break-truncate",
            max_tokens=2000,
            tools=ANTHROPIC_TOOLS,
            messages=[{"role": "user", "content": PROMPT}],
        )
    assert info.value.status_code == 502 and info.value.body["error"]["type"] == "api_error"


def test_mock_surfaces_answer_directly(stack):
    mock, _ = stack
    r = httpx.post(
        f"{mock.url}/v1/messages",
        json={"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hello"}]},
    )
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "Hello! How can I help you today?"
    r = httpx.post(f"{mock.url}/v1/responses", json={"model": "m"})
    assert r.status_code == 400 and "input" in r.json()["error"]["message"]
