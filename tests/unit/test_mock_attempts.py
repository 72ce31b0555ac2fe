"""What a regenerating client relies on in the mock (issue 19): the `attempt` counter counts per
conversation, `continue_final_message` continues the mock's own answer the way vLLM does, and the
"broken on the first attempt, fine on the next" scenarios hold on all three surfaces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient
from tapfix.proxy.mock import MockOptions, create_app
from tapfix.proxy.sse import SSESplitter, event_data

from tests.support.builders import tool
from tests.support.depth import examples

WRITE = tool(
    "write",
    {"path": {"type": "string"}, "content": {"type": "string"}},
    ["path", "content"],
)
PROMPT = "Create a file hello.txt containing a greeting"
TOOLS: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "tools": [WRITE]}
LONG = "Explain the rules of chess to me briefly"
TEXT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": LONG}]}
CONTINUE = {"continue_final_message": True, "add_generation_prompt": False}
BOTH_FLAGS = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
BREAK_FIRST = {"rules": [{"when": {"attempt": 1, "has_tools": True}, "do": "break_tool_call"}]}


def payloads(raw: bytes) -> list[Any]:
    """Every event's parsed data, `[DONE]` left out."""
    splitter = SSESplitter()
    events = splitter.feed(raw) + splitter.flush()
    return [json.loads(data) for event in events if (data := event_data(event)) and data != b"[DONE]"]


def make(tmp_path: Path, scenario: dict[str, Any] | None = None) -> TestClient:
    if scenario is None:
        return TestClient(create_app(MockOptions()))
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario))
    return TestClient(create_app(MockOptions(scenario=path)))


def prefixed(body: dict[str, Any], prefix: str, **extra: Any) -> dict[str, Any]:
    """The same conversation with `prefix` as a trailing assistant message to continue."""
    messages = [*body["messages"], {"role": "assistant", "content": prefix}]
    return {**body, "messages": messages, **CONTINUE, **extra}


def chat_message(c: TestClient, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    r = c.post("/v1/chat/completions", json={**body, "stream": False})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"], choice["finish_reason"]


def chat_stream(c: TestClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = c.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    return [o for o in payloads(r.content) if isinstance(o, dict) and o.get("choices")]


def streamed(chunks: list[dict[str, Any]], key: str) -> str:
    return "".join(ch["choices"][0]["delta"].get(key) or "" for ch in chunks)


def streamed_args(chunks: list[dict[str, Any]]) -> str:
    deltas = [ch["choices"][0]["delta"] for ch in chunks]
    return "".join(tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls", []))


def conversation_key(body: dict[str, Any], surface: str) -> str:
    from tapfix.proxy.mock.continuation import conversation_key as key  # the module is new in issue 19

    return key(body, surface)


def is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


# ---- 1. the attempt counter counts per conversation -------------------------------------------------


def test_a_fresh_seed_or_a_continuation_is_the_next_attempt(tmp_path: Path) -> None:
    c = make(tmp_path, BREAK_FIRST)
    assert chat_message(c, {**TOOLS, "seed": 1})[1] == "length"  # attempt 1: broken
    assert chat_message(c, {**TOOLS, "seed": 2})[1] == "tool_calls"  # a regeneration with a fresh seed
    assert chat_message(c, prefixed(TOOLS, "Sure.\n", seed=3))[1] == "tool_calls"  # a continuation
    assert chat_message(c, TOOLS)[1] == "tool_calls"  # the agent resending the same body
    other = {**TOOLS, "messages": [{"role": "user", "content": "Create a file b.txt"}]}
    assert chat_message(c, other)[1] == "length"  # another conversation starts at attempt 1


def test_the_attempt_counts_exactly(tmp_path: Path) -> None:
    c = make(tmp_path, {"rules": [{"when": {"attempt": 3}, "do": "http_error", "status": 503}]})
    sends = [TOOLS, {**TOOLS, "seed": 7}, prefixed(TOOLS, "")]
    assert [c.post("/v1/chat/completions", json=b).status_code for b in sends] == [200, 200, 503]


@settings(max_examples=examples(50), deadline=None)
@given(seed=st.integers(), prefix=st.text(max_size=30), flags=st.booleans())
def test_the_key_ignores_seed_flags_and_a_trailing_prefix(seed: int, prefix: str, flags: bool) -> None:
    base = conversation_key(TOOLS, "chat")
    body: dict[str, Any] = {
        **TOOLS,
        "seed": seed,
        "messages": [*TOOLS["messages"], {"role": "assistant", "content": prefix}],
    }
    if flags:
        body |= {"continue_final_message": True, "add_generation_prompt": False}
    assert conversation_key(body, "chat") == base
    assert conversation_key({**TOOLS, "temperature": 0.5}, "chat") != base  # anything else is another body


def test_a_trailing_tool_call_is_no_prefix() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "write", "arguments": "{}"}}
    with_call = {**TOOLS, "messages": [*TOOLS["messages"], {"role": "assistant", "content": "", "tool_calls": [call]}]}
    assert conversation_key(with_call, "chat") != conversation_key(TOOLS, "chat")


def test_the_key_per_surface_shape() -> None:
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]}
    thought = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Hm."}]}
    responses = {"model": "m", "input": [user]}
    key = conversation_key(responses, "responses")
    assert conversation_key({**responses, "input": [user, thought, said], "seed": 4}, "responses") == key
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    assert conversation_key({**responses, "input": [user, output]}, "responses") != key
    messages = {"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": PROMPT}]}
    key = conversation_key(messages, "messages")
    prefill = {"role": "assistant", "content": [{"type": "text", "text": "Sure."}]}
    assert conversation_key({**messages, "messages": [*messages["messages"], prefill]}, "messages") == key
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "write", "input": {}}]}
    assert conversation_key({**messages, "messages": [*messages["messages"], use]}, "messages") != key


# ---- 2. continue_final_message the way vLLM does it ------------------------------------------------


@settings(max_examples=examples(25), deadline=None)
@given(cut=st.integers(min_value=0, max_value=200))
def test_a_prefix_of_the_answer_gets_the_rest(cut: int) -> None:
    c = make(Path("."))
    answer = chat_message(c, TEXT)[0]["content"]
    prefix = answer[: cut % (len(answer) + 1)]
    message, finish = chat_message(c, prefixed(TEXT, prefix))
    assert (message["role"], message["content"], finish) == ("assistant", answer[len(prefix) :], "stop")
    chunks = chat_stream(c, prefixed(TEXT, prefix))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert streamed(chunks, "content") == answer[len(prefix) :]


def test_after_text_that_is_not_its_own_a_text_answer_ends(tmp_path: Path) -> None:
    c = make(tmp_path)
    message, finish = chat_message(c, prefixed(TEXT, "Something else entirely."))
    assert (message["content"], finish) == ("", "stop")
    assert streamed(chat_stream(c, prefixed(TEXT, "Something else entirely.")), "content") == ""


@pytest.mark.parametrize("reasoning", [None, "high"])
def test_a_tool_call_after_a_text_prefix_comes_as_tool_calls(tmp_path: Path, reasoning: str | None) -> None:
    c = make(tmp_path)
    body = {**TOOLS, "reasoning_effort": reasoning} if reasoning else TOOLS
    whole, _ = chat_message(c, body)
    message, finish = chat_message(c, prefixed(body, "Sure, I will create it.\n"))
    assert finish == "tool_calls" and message["content"] is None and message["reasoning"] is None
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == json.loads(
        whole["tool_calls"][0]["function"]["arguments"]
    )
    chunks = chat_stream(c, prefixed(body, "Sure, I will create it.\n"))
    assert streamed(chunks, "content") == "" and streamed(chunks, "reasoning") == ""
    assert json.loads(streamed_args(chunks)) == {"path": "hello.txt", "content": "Hello, world!\n"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_an_empty_prefix_continues_from_the_start(tmp_path: Path) -> None:
    c = make(tmp_path)
    body = {**TOOLS, "reasoning_effort": "low"}
    whole, _ = chat_message(c, body)
    message, _ = chat_message(c, prefixed(body, ""))
    assert message["reasoning"] == whole["reasoning"] and message["reasoning"]


@pytest.mark.parametrize("stream", [False, True])
def test_both_flags_true_is_vllms_400(tmp_path: Path, stream: bool) -> None:
    body = {**prefixed(TEXT, "Thanks"), "add_generation_prompt": True, "stream": stream}
    r = make(tmp_path).post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["message"] == BOTH_FLAGS and error["type"] == "BadRequestError" and error["code"] == 400


def test_continue_without_add_generation_prompt_false_is_a_400(tmp_path: Path) -> None:
    body = prefixed(TEXT, "Thanks")
    del body["add_generation_prompt"]  # vLLM's default is true: the chat template refuses the pair
    r = make(tmp_path).post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "continue_final_message and add_generation_prompt are not compatible"
    )


def test_continuing_a_user_message_answers_in_its_role(tmp_path: Path) -> None:
    """vLLM does not refuse it: the reply's role is the last message's (`get_chat_request_role`)."""
    c = make(tmp_path)
    message, finish = chat_message(c, {**TEXT, **CONTINUE})
    assert message["role"] == "user" and finish == "stop"
    assert chat_stream(c, {**TEXT, **CONTINUE})[0]["choices"][0]["delta"] == {"role": "user", "content": ""}


def test_echo_prepends_the_prefix(tmp_path: Path) -> None:
    c = make(tmp_path)
    answer = chat_message(c, TEXT)[0]["content"]
    body = prefixed(TEXT, answer[:10], echo=True)
    assert chat_message(c, body)[0]["content"] == answer
    chunks = chat_stream(c, body)
    assert chunks[1]["choices"][0] == {
        "index": 0,
        "delta": {"content": answer[:10]},
        "logprobs": None,
        "finish_reason": None,
    }
    assert streamed(chunks, "content") == answer


def test_echo_of_a_message_that_is_no_text_is_refused(tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {
        **TEXT,
        **CONTINUE,
        "echo": True,
        "messages": [*TEXT["messages"], {"role": "assistant", "content": [image]}],
    }
    r = make(tmp_path).post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "echo is not supported by tapfix mock" in r.json()["error"]["message"]


# ---- 3. broken on the first attempt, fine on the next, on all three surfaces ------------------------

RESPONSES_TOOL = {"type": "function", "name": "write", "parameters": WRITE["function"]["parameters"]}
SURFACE_BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": TOOLS,
    "/v1/responses": {"model": "m", "input": PROMPT, "tools": [RESPONSES_TOOL]},
    "/v1/messages": {
        "model": "m",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": [{"name": "write", "input_schema": WRITE["function"]["parameters"]}],
    },
}


def call_of(path: str, raw: bytes, stream: bool) -> tuple[str, str]:
    """(finish in chat words, the call's argument text) of one answer on any surface."""
    if path == "/v1/chat/completions":
        if stream:
            chunks = [o for o in payloads(raw) if isinstance(o, dict) and o.get("choices")]
            return chunks[-1]["choices"][0]["finish_reason"], streamed_args(chunks)
        choice = json.loads(raw)["choices"][0]
        return choice["finish_reason"], choice["message"]["tool_calls"][0]["function"]["arguments"]
    if path == "/v1/responses":
        events = [o for o in payloads(raw) if isinstance(o, dict)] if stream else []
        response = events[-1]["response"] if stream else json.loads(raw)
        if stream:
            args = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
        else:
            args = next(i["arguments"] for i in response["output"] if i["type"] == "function_call")
        return ("length" if response["status"] == "incomplete" else "tool_calls"), args
    if stream:
        events = [o for o in payloads(raw) if isinstance(o, dict)]
        deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
        args = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
        stop = next(e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta")
    else:
        message = json.loads(raw)
        block = next(b for b in message["content"] if b["type"] == "tool_use")
        args = block["input"] if isinstance(block["input"], str) else json.dumps(block["input"])
        stop = message["stop_reason"]
    return ("length" if stop == "max_tokens" else "tool_calls"), args


@pytest.mark.parametrize(
    "scenario", ["fail_first_attempt_unrecoverable", "break_args_first_attempt", "break_first_turn"]
)
@pytest.mark.parametrize("path", list(SURFACE_BODIES))
@pytest.mark.parametrize("stream", [True, False])
def test_broken_first_then_fine_on_every_surface(scenario: str, path: str, stream: bool) -> None:
    c = TestClient(create_app(MockOptions(scenario=scenario)))
    body = {**SURFACE_BODIES[path], "stream": stream}
    finish, args = call_of(path, c.post(path, json={**body, "seed": 11}).content, stream)
    assert finish == "length" and not is_json(args), (finish, args)  # unrecoverable: cut inside a string
    finish, args = call_of(path, c.post(path, json={**body, "seed": 12}).content, stream)  # a regeneration
    assert finish == "tool_calls" and json.loads(args) == {"path": "hello.txt", "content": "Hello, world!\n"}
