"""Reasoning replay through the real proxy (issue 36): the openai SDK runs a two-turn tool loop; a loopback
upstream of the test's own answers turn 1 with streamed reasoning and a tool call, as vLLM does, and records
what reaches it on turn 2."""

from __future__ import annotations

import json
from functools import partial

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.builders import DONE, chat_chunk, message_tool_call, sse_event, tool, tool_call_delta
from tests.support.inproc import cli, start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawServer, json_reply, sse_response

REASONING = "The user wants a.py.\nI'll read it first — «ü»."
CALL_ID = "functions.read:0"  # Kimi's ids: the same in every conversation
TOOLS = [tool("read", {"path": {"type": "string"}})]
FIRST = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "read a.py"}]


chunk = partial(chat_chunk, id="chatcmpl-1", model="qwen3")
frame = partial(sse_event, ensure_ascii=True, separators=(", ", ": "))  # json.dumps' spacing and escaping, as before


def _answer(request):
    """Turn 1 (one user message): reasoning in pieces, then a tool call; any later turn: a short text."""
    body = json.loads(request.body)
    if len(body["messages"]) == 2:
        half = len(REASONING) // 2
        chunks = [
            chunk({"role": "assistant", "content": None, "reasoning": REASONING[:half]}),
            chunk({"reasoning": REASONING[half:]}),
            chunk({"tool_calls": [tool_call_delta(0, CALL_ID, "read", "")]}),
            chunk({"tool_calls": [tool_call_delta(0, arguments='{"path": "a.py"}')]}),
            chunk({}, "tool_calls"),
        ]
    else:
        message = {"role": "assistant", "content": "It prints 1."}
        answer = json.dumps(
            {
                "id": "chatcmpl-2",
                "object": "chat.completion",
                "created": 1,
                "model": "qwen3",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        ).encode()
        return [(0.0, json_reply(answer))]
    return sse_response([*map(frame, chunks), DONE])


@pytest.fixture
def upstream():
    server = RawServer(_answer)
    yield server
    server.close()


def _client(url: str, agent: str = "agent/1.0", address: str | None = None) -> openai.OpenAI:
    transport = httpx.HTTPTransport(local_address=address) if address else None
    http = httpx.Client(transport=transport)
    return openai.OpenAI(
        base_url=url + "/v1", api_key="k", max_retries=0, http_client=http, default_headers={"user-agent": agent}
    )


def _turn1(client: openai.OpenAI):
    stream = client.chat.completions.with_raw_response.create(model="qwen3", messages=FIRST, tools=TOOLS, stream=True)
    calls = {}
    for chunk in stream.parse():
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = call.id or slot["id"]
            slot["name"] += call.function.name or ""
            slot["arguments"] += call.function.arguments or ""
    return stream.headers["x-tapfix-capture-id"], calls[0]


def _turn2_messages(call: dict) -> list[dict]:
    """The conversation as agents resend it: the assistant turn with its tool call and no reasoning."""
    tool_call = message_tool_call(call["arguments"], id=call["id"], name=call["name"])
    assistant = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
    return [*FIRST, assistant, {"role": "tool", "tool_call_id": call["id"], "content": "print(1)"}]


def _turn2(client: openai.OpenAI, messages: list[dict]) -> str:
    raw = client.chat.completions.with_raw_response.create(model="qwen3", messages=messages, tools=TOOLS)
    assert raw.parse().choices[0].message.content == "It prints 1."
    return raw.headers["x-tapfix-capture-id"]


def test_turn_2_carries_turn_1s_reasoning_and_no_other_client_gets_it(tmp_path, upstream):
    db = tmp_path / "c.db"
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "vllm", "--replay-reasoning", db=db)
    try:
        client = _client(proxy.url)
        first_id, call = _turn1(client)
        messages = _turn2_messages(call)
        second_id = _turn2(client, messages)  # at once: the writer may not have stored turn 1 yet
        received = json.loads(upstream.requests[-1].body)
        assert received["messages"][2]["reasoning"] == REASONING
        del received["messages"][2]["reasoning"]
        assert received["messages"] == messages  # nothing else changed

        # Same ids, same content, from another client: another user-agent, or another address.
        others = []
        for other in (_client(proxy.url, agent="other/2.0"), _client(proxy.url, address="127.0.0.2")):
            others.append(_turn2(other, messages))
            assert REASONING.encode() not in upstream.requests[-1].body
            assert "reasoning" not in json.loads(upstream.requests[-1].body)["messages"][2]

        health = httpx.get(proxy.url + "/tapfix/health").json()
        assert health["reasoning_replay"]["replayed"] == 1 and health["reasoning_replay"]["missed"] == 2
        for capture_id in others:
            wait_capture(db, capture_id)
        wait_capture(db, second_id)
        scrape = httpx.get(proxy.url + "/tapfix/metrics").text
        counted = {
            s.labels["outcome"]: s.value
            for family in text_string_to_metric_families(scrape)
            for s in family.samples
            if s.name == "tapfix_reasoning_replay_total"
        }
        assert counted == {"replayed": 1.0, "missed": 2.0}
        shown = cli("captures", "show", second_id, "--db", str(db)).stdout.decode()
        assert "replay_reasoning $.messages[2].reasoning" in shown and first_id in shown
        sent = json.loads(cli("captures", "export", second_id, "--db", str(db)).stdout)
        assert "reasoning" not in sent["messages"][2]  # the client's own bytes are what the capture keeps
    finally:
        proxy.stop()


def test_without_the_flag_the_upstream_gets_the_clients_bytes(tmp_path, upstream):
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "vllm", db=tmp_path / "c.db")
    try:
        client = _client(proxy.url)
        _, call = _turn1(client)
        _turn2(client, _turn2_messages(call))
        assert "reasoning" not in json.loads(upstream.requests[-1].body)["messages"][2]
        assert httpx.get(proxy.url + "/tapfix/health").json()["reasoning_replay"] is None
    finally:
        proxy.stop()


def test_a_later_proxy_finds_the_turn_in_the_store(tmp_path, upstream):
    """A restart (or another tapfix on the same store) has nothing in memory: the store has the turn."""
    db = tmp_path / "c.db"
    args = ("--engine", "llamacpp", "--replay-reasoning")
    proxy = start_proxy(tmp_path, upstream.url, *args, db=db)
    try:
        first_id, call = _turn1(_client(proxy.url))
        wait_capture(db, first_id)
    finally:
        proxy.stop()
    proxy = start_proxy(tmp_path, upstream.url, *args, db=db)
    try:
        _turn2(_client(proxy.url), _turn2_messages(call))
        assert json.loads(upstream.requests[-1].body)["messages"][2]["reasoning_content"] == REASONING
    finally:
        proxy.stop()


def _message(content: list[dict], stop: str) -> list[tuple[float, bytes]]:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "qwen3",
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    raw = json.dumps(body).encode()
    return [(0.0, json_reply(raw))]


def _messages_answer(request):
    """Turn 1: thinking, text and a tool_use block, as a local engine's /v1/messages answers; later: text."""
    if len(json.loads(request.body)["messages"]) == 1:
        thinking = {"type": "thinking", "thinking": REASONING, "signature": ""}
        use = {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.py"}}
        return _message([thinking, {"type": "text", "text": "Reading it."}, use], "tool_use")
    return _message([{"type": "text", "text": "It prints 1."}], "end_turn")


def test_messages_turn_2_gets_a_thinking_block_before_the_text_and_tool_use(tmp_path):
    upstream = RawServer(_messages_answer)
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "llamacpp", "--replay-reasoning", db=tmp_path / "c.db")
    try:
        client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
        tools = [{"name": "read", "input_schema": {"type": "object"}}]
        first = [{"role": "user", "content": "read a.py"}]
        answer = client.messages.create(model="qwen3", max_tokens=100, messages=first, tools=tools)
        # Claude Code and most agents resend the text and tool_use blocks, not the thinking block.
        resent = [b.model_dump(exclude_none=True) for b in answer.content if b.type != "thinking"]
        result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}
        messages = [*first, {"role": "assistant", "content": resent}, {"role": "user", "content": [result]}]
        client.messages.create(model="qwen3", max_tokens=100, messages=messages, tools=tools)
        received = json.loads(upstream.requests[-1].body)["messages"][1]["content"]
        assert received[0] == {"type": "thinking", "thinking": REASONING, "signature": ""}
        assert received[1:] == resent
    finally:
        proxy.stop()
        upstream.close()


def _responses_answer(request):
    """Turn 1: a reasoning item and a function call, as vLLM's /v1/responses answers; later: a message."""
    body = json.loads(request.body)
    if len(body["input"]) == 1:
        reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "content": []}
        reasoning["content"] = [{"type": "reasoning_text", "text": REASONING}]
        call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "read"}
        call |= {"arguments": '{"path": "a.py"}', "status": "completed"}
        output = [reasoning, call]
    else:
        text = {"type": "output_text", "text": "It prints 1.", "annotations": []}
        output = [{"type": "message", "id": "m_1", "role": "assistant", "status": "completed", "content": [text]}]
    answer = {"id": "resp_1", "object": "response", "created_at": 1, "model": "qwen3", "status": "completed"}
    answer |= {"output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    raw = json.dumps(answer).encode()
    return [(0.0, json_reply(raw))]


def test_responses_turn_2_gets_a_reasoning_item_before_the_function_call(tmp_path):
    upstream = RawServer(_responses_answer)
    proxy = start_proxy(tmp_path, upstream.url, "--engine", "vllm", "--replay-reasoning", db=tmp_path / "c.db")
    try:
        client = _client(proxy.url)
        tools = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
        first = [{"role": "user", "content": "read a.py"}]
        answer = client.responses.create(model="qwen3", input=first, tools=tools)
        # Agents that keep no reasoning resend the function call alone, then its output.
        call = next(item.model_dump(exclude_none=True) for item in answer.output if item.type == "function_call")
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "print(1)"}
        client.responses.create(model="qwen3", input=[*first, call, output], tools=tools)
        received = json.loads(upstream.requests[-1].body)["input"]
        assert received[1]["type"] == "reasoning" and received[1]["content"][0]["text"] == REASONING
        assert received[2:] == [call, output]
    finally:
        proxy.stop()
        upstream.close()
