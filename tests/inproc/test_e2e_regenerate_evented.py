"""Issue 19 end to end on Responses and Messages: `tapfix run --regenerate 1` in front of `tapfix mock`,
the OpenAI SDK (Responses) and the anthropic SDK (Messages) streaming with `max_retries=0`. A call
broken on the first attempt reaches the SDK whole, from attempt 2, in the same response; the captures
hold the client-facing exchange and attempt 2. `--regenerate 0` and every attempt broken give today's
retryable error events."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.inproc import test_e2e_regenerate as chat_e2e
from tests.inproc.test_e2e_regenerate import ALWAYS_BROKEN, all_exchanges, parent_id, rows
from tests.support.inproc import InprocProxy
from tests.unit.test_mock_attempts import WRITE
from tests.unit.test_regenerate_evented_seam import objects, valid_messages, valid_responses

PROMPT = "Create a file hello.txt containing a greeting"
PARAMETERS = WRITE["function"]["parameters"]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "write", "parameters": PARAMETERS}]
MESSAGES_TOOLS: list[Any] = [{"name": "write", "description": "Write a file", "input_schema": PARAMETERS}]
GREETING = {"path": "hello.txt", "content": "Hello, world!\n"}
BODIES = {
    "/v1/responses": {"model": "m", "input": PROMPT, "tools": RESPONSES_TOOLS, "stream": True},
    "/v1/messages": {
        "model": "m",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": PROMPT}],
        "tools": MESSAGES_TOOLS,
        "stream": True,
    },
}
stack = chat_e2e.stack  # the fixture: `tapfix mock --scenario S` and `tapfix run ARGS` for one test
REGENERATE_1 = [("break_args_first_attempt", "--regenerate", "1")]


def raw_stream(proxy: InprocProxy, path: str, **extra: Any) -> tuple[str, bytes]:
    with httpx.stream("POST", proxy.url + path, json={**BODIES[path], **extra}, timeout=30) as r:
        assert r.status_code == 200
        return r.headers["x-tapfix-capture-id"], b"".join(r.iter_raw())


def check_store(proxy: InprocProxy, capture_id: str) -> None:
    found = rows(proxy.extra["db"], capture_id, 2)
    assert [(r["attempt"], r["attempt_of"]) for r in found] == [(1, None), (2, capture_id)]
    parent, second = found
    assert "regenerated" in json.loads(parent["flags"])
    assert all_exchanges(proxy.extra["db"]) == 2, "the mock was asked twice, each ask one exchange"
    regenerate = [c for c in second["changes"] if c["kind"] == "regenerate"]
    assert regenerate and json.loads(regenerate[0]["after"]) == "fresh", second["changes"]


@pytest.mark.parametrize("stack", REGENERATE_1, indirect=True)
def test_the_openai_sdk_streaming_responses_gets_one_valid_function_call(stack: InprocProxy) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="k", max_retries=0, timeout=30)
    kinds: list[str] = []
    with client.responses.stream(model="m", input=PROMPT, tools=RESPONSES_TOOLS) as stream:  # type: ignore[arg-type]
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed", kinds
    assert "error" not in kinds
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "write"
    assert json.loads(calls[0].arguments) == GREETING
    check_store(stack, parent_id(stack))


@pytest.mark.parametrize("stack", REGENERATE_1, indirect=True)
def test_the_anthropic_sdk_streaming_messages_gets_one_valid_tool_use(stack: InprocProxy) -> None:
    client = anthropic.Anthropic(base_url=stack.url, api_key="k", max_retries=0, timeout=30)
    with client.messages.stream(
        model="m",
        max_tokens=1000,
        messages=[{"role": "user", "content": PROMPT}],
        tools=MESSAGES_TOOLS,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds.count("message_start") == 1 and kinds[-1] == "message_stop", kinds
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "write" and uses[0].input == GREETING
    assert final.stop_reason == "tool_use"
    check_store(stack, parent_id(stack))


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stack", REGENERATE_1, indirect=True)
def test_the_client_reads_one_valid_stream_with_no_marker(stack: InprocProxy, path: str) -> None:
    capture_id, data = raw_stream(stack, path)
    assert b"tapfix-attempt-end" not in data
    calls = (valid_responses if path == "/v1/responses" else valid_messages)(data)
    assert len(calls) == 1
    check_store(stack, capture_id)


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stack", [("break_args_first_attempt", "--regenerate", "0")], indirect=True)
def test_regenerate_0_is_todays_error_event(stack: InprocProxy, path: str) -> None:
    capture_id, data = raw_stream(stack, path)
    kinds = [k for k, _ in objects(data)]
    assert kinds.count("error") == 1
    assert kinds[-1] == ("response.failed" if path == "/v1/responses" else "error")
    error = next(o for k, o in objects(data) if k == "error")
    inner = error["error"]
    assert inner["type"] in ("server_error", "api_error") and "server error" in inner["message"]
    found = rows(stack.extra["db"], capture_id, 1, timeout=1.0)
    assert [r["attempt"] for r in found] == [1] and "regenerated" not in json.loads(found[0]["flags"])
    assert "toolcall_unrecoverable" in json.loads(found[0]["flags"])


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stack", [(ALWAYS_BROKEN, "--regenerate", "1")], indirect=True)
def test_every_attempt_broken_is_todays_retryable_error_event(stack: InprocProxy, path: str) -> None:
    capture_id, data = raw_stream(stack, path)
    kinds = [k for k, _ in objects(data)]
    assert kinds.count("error") == 1 and kinds.count("message_start") + kinds.count("response.created") == 1
    assert kinds[-1] == ("response.failed" if path == "/v1/responses" else "error")
    error = next(o for k, o in objects(data) if k == "error")
    assert error["error"]["tapfix"]["reason"] == "tool_call_unrecoverable"
    assert error["error"]["tapfix"]["capture_id"] == capture_id
    found = rows(stack.extra["db"], capture_id, 2)
    assert [r["attempt"] for r in found] == [1, 2]
    skips = [c for c in found[0]["changes"] if c["kind"] == "skip"]
    assert skips and json.loads(skips[0]["after"]) == "attempts_spent"


@pytest.mark.parametrize("stack", REGENERATE_1, indirect=True)
def test_a_deterministic_messages_request_is_skipped(stack: InprocProxy) -> None:
    capture_id, data = raw_stream(stack, "/v1/messages", temperature=0)
    assert [k for k, _ in objects(data)].count("error") == 1
    found = rows(stack.extra["db"], capture_id, 1, timeout=1.0)
    assert [r["attempt"] for r in found] == [1]
    skips = [c for c in found[0]["changes"] if c["kind"] == "skip"]
    assert skips and json.loads(skips[0]["after"]) == "deterministic", found[0]["changes"]
