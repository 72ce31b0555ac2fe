"""Captures are right against a real engine: what `tapfix captures show --json` and `captures list --json`
say about an exchange with llama-server is what the server sent.

The reference is the response the client got (passthrough is byte-exact; the relay test proves that
against the server's own bytes), read here by a small assembler of its own: content, reasoning, tool
calls, usage and finish reasons per choice, llama.cpp's `timings`, and the engine's error object.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from tests.process.realengine import tiny_model
from tests.process.realengine.engine import LlamaServer
from tests.support.inproc import InprocProxy, cli
from tests.support.procs import wait_capture

pytestmark = [pytest.mark.realengine]

GREETING = [{"role": "user", "content": "Say hello"}]
WRITE_TOOL = tiny_model.WRITE_TOOL
# Far past the -c 2048 of the fixtures' servers: llama-server answers 400 exceed_context_size_error.
OVERFLOW = [{"role": "user", "content": "hello " * 3000}]


@pytest.fixture(scope="module")
def reasoning_proxy(tapfix_in_front: Callable[..., InprocProxy], llama_reasoning: LlamaServer) -> InprocProxy:
    return tapfix_in_front(llama_reasoning)


def _request(messages: list[dict], *, stream: bool, **extra: object) -> dict:
    body: dict = {"model": "tiny", "messages": messages, "temperature": 0, "seed": 7, **extra}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return body


def _exchange(proxy: InprocProxy, body: dict) -> tuple[httpx.Response, dict]:
    """Send through tapfix; the response the client got, and the capture as `captures show --json` has it."""
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30)
    capture_id = response.headers["x-tapfix-capture-id"]
    wait_capture(proxy.extra["db"], capture_id)
    return response, _show(proxy, capture_id)


def _show(proxy: InprocProxy, capture_id: str) -> dict:
    result = cli("captures", "show", capture_id, "--json", "--db", str(proxy.extra["db"]))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return json.loads(result.stdout)


def _listed(proxy: InprocProxy, capture_id: str) -> dict:
    result = cli("captures", "list", "--json", "--limit", "0", "--db", str(proxy.extra["db"]))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    rows = [json.loads(line) for line in result.stdout.decode().splitlines() if line.strip()]
    return next(row for row in rows if row["id"] == capture_id)


def _export(proxy: InprocProxy, capture_id: str, flag: str) -> bytes:
    result = cli("captures", "export", capture_id, flag, "--db", str(proxy.extra["db"]))
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout


def _events(raw: bytes) -> list[dict]:
    """The JSON events of an SSE body ([DONE] left out)."""
    events = []
    for block in raw.decode().split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.splitlines() if line.startswith("data:"))
        if data and data != "[DONE]":
            events.append(json.loads(data))
    return events


def _client_view(response: httpx.Response, stream: bool) -> dict:
    """What the client got, per choice index: content, reasoning, tool calls (id, name, arguments) and
    finish reason; plus usage and llama.cpp's timings."""
    choices: dict[int, dict] = {}

    def choice(index: int) -> dict:
        return choices.setdefault(index, {"content": "", "reasoning": "", "tool_calls": {}, "finish_reason": None})

    if not stream:
        body = response.json()
        for c in body["choices"]:
            entry = choice(c["index"])
            message = c["message"]
            entry["content"] = message.get("content") or ""
            entry["reasoning"] = message.get("reasoning_content") or ""
            for i, call in enumerate(message.get("tool_calls") or []):
                entry["tool_calls"][i] = {"id": call["id"], **call["function"]}
            entry["finish_reason"] = c["finish_reason"]
        usage, timings = body.get("usage"), body.get("timings")
    else:
        usage = timings = None
        for event in _events(response.content):
            usage = event.get("usage") or usage
            timings = event.get("timings") or timings
            for c in event.get("choices", []):
                entry = choice(c["index"])
                delta = c.get("delta", {})
                entry["content"] += delta.get("content") or ""
                entry["reasoning"] += delta.get("reasoning_content") or ""
                for call in delta.get("tool_calls") or []:
                    slot = entry["tool_calls"].setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                    slot["id"] = call.get("id") or slot["id"]
                    function = call.get("function", {})
                    slot["name"] += function.get("name") or ""
                    slot["arguments"] += function.get("arguments") or ""
                entry["finish_reason"] = c.get("finish_reason") or entry["finish_reason"]
    for entry in choices.values():
        entry["tool_calls"] = [entry["tool_calls"][i] for i in sorted(entry["tool_calls"])]
    return {"choices": [choices[i] for i in sorted(choices)], "usage": usage, "timings": timings}


def _recorded(choice: dict) -> dict:
    """A capture's choice (its `assembled`, or one of its `choices`) in the client view's shape."""
    return {
        "content": choice["content"] or "",
        "reasoning": choice["reasoning"] or "",
        "tool_calls": [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in choice["tool_calls"]],
    }


def _only(view: dict) -> dict:
    assert len(view["choices"]) == 1, view
    return view["choices"][0]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_content_usage_and_timings_are_recorded(llama_proxy: InprocProxy, stream: bool) -> None:
    response, capture = _exchange(llama_proxy, _request(GREETING, stream=stream))
    assert response.status_code == 200
    sent = _client_view(response, stream)
    choice = _only(sent)
    assert choice["content"] == tiny_model.ANSWER  # the exchange is the one the test means
    assert _recorded(capture["assembled"]) == {"content": choice["content"], "reasoning": "", "tool_calls": []}
    assert capture["finish_reason"] == choice["finish_reason"] and capture["choices"] == []
    assert capture["stream"] is stream and capture["status"] == 200
    assert sent["usage"] is not None and capture["assembled"]["usage"] == sent["usage"]
    assert capture["prompt_tokens"] == sent["usage"]["prompt_tokens"]
    assert capture["completion_tokens"] == sent["usage"]["completion_tokens"]
    # llama.cpp's timings: tapfix keeps them in the stored bodies, as the server and the client had them.
    assert sent["timings"] and sent["timings"]["predicted_n"] == sent["usage"]["completion_tokens"]
    for flag in ("--response", "--client-response"):
        stored = _export(llama_proxy, capture["id"], flag)
        assert _client_view(httpx.Response(200, content=stored), stream)["timings"] == sent["timings"], flag
    row = _listed(llama_proxy, capture["id"])
    assert (row["status"], row["stream"], row["finish_reason"], row["error"]) == (200, stream, "stop", None)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_reasoning_content_is_recorded_as_reasoning(reasoning_proxy: InprocProxy, stream: bool) -> None:
    response, capture = _exchange(reasoning_proxy, _request(GREETING, stream=stream))
    assert response.status_code == 200
    choice = _only(_client_view(response, stream))
    assert tiny_model.REASONING in choice["reasoning"] and choice["content"] == tiny_model.ANSWER
    assert _recorded(capture["assembled"]) == {
        "content": choice["content"],
        "reasoning": choice["reasoning"],
        "tool_calls": [],
    }
    assert capture["finish_reason"] == choice["finish_reason"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_tool_calls_are_recorded_with_name_arguments_and_id(llama_proxy: InprocProxy, stream: bool) -> None:
    response, capture = _exchange(llama_proxy, _request(GREETING, stream=stream, tools=[WRITE_TOOL]))
    assert response.status_code == 200, response.text
    choice = _only(_client_view(response, stream))
    [call] = choice["tool_calls"]
    assert call["name"] == tiny_model.CALL_NAME and json.loads(call["arguments"]) == tiny_model.CALL_ARGUMENTS
    assert call["id"], "llama-server gives every call an id"
    assert _recorded(capture["assembled"])["tool_calls"] == choice["tool_calls"]
    assert capture["finish_reason"] == choice["finish_reason"] == "tool_calls"
    assert (capture["assembled"]["content"] or "") == choice["content"]


@pytest.mark.parametrize(
    "proxy_name, stream",
    [("llama_proxy", False), ("llama_proxy", True), ("reasoning_proxy", True)],
    ids=["json", "sse", "reasoning-sse"],
)
def test_two_choices_are_recorded_apart(request: pytest.FixtureRequest, proxy_name: str, stream: bool) -> None:
    proxy: InprocProxy = request.getfixturevalue(proxy_name)
    response, capture = _exchange(proxy, _request(GREETING, stream=stream, n=2))
    assert response.status_code == 200, response.text
    sent = _client_view(response, stream)
    assert len(sent["choices"]) == 2 and all(c["content"] == tiny_model.ANSWER for c in sent["choices"])
    recorded = sorted(capture["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in recorded] == [0, 1]
    for mine, theirs in zip(recorded, sent["choices"], strict=True):
        assert _recorded(mine) == {k: theirs[k] for k in ("content", "reasoning", "tool_calls")}
        assert mine["finish_reason"] == theirs["finish_reason"]
    # `assembled` is choice 0 alone, not the two run together.
    assert _recorded(capture["assembled"]) == _recorded(recorded[0])
    assert capture["assembled"]["usage"] == sent["usage"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_context_overflow_keeps_the_engines_error(llama_proxy: InprocProxy, stream: bool) -> None:
    """The client gets the overflow agents compact on (issue 37), with llama-server's own numbers; the
    capture keeps the engine's error as it sent it."""
    response, capture = _exchange(llama_proxy, _request(OVERFLOW, stream=stream))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "messages",
    )
    engines = capture["upstream_error"]
    assert engines["type"] == "exceed_context_size_error" and engines["n_prompt_tokens"] > engines["n_ctx"]
    assert f"maximum context length is {engines['n_ctx']} tokens" in error["message"]
    assert f"resulted in {engines['n_prompt_tokens']} tokens" in error["message"]
    assert capture["status"] == 400
    assert {"upstream_error", "context_overflow"} <= set(capture["flags"])
    row = _listed(llama_proxy, capture["id"])
    assert row["status"] == 400
