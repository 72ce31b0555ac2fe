"""tapfix in front of a real llama-server passes its answers through byte for byte.

What the server really sent is recorded by an independent loopback relay (tests/process/realengine/relay.py)
between `tapfix run` and llama-server, so every comparison is against the same request's bytes on the
wire: llama-server's random ids, `created` and `timings` differ per request, and a second request could
never stand in for the first. Tool-call repair is armed (tapfix run's default) and must stay silent on
the engine's valid answers: the capture records no response-side change. With the defaults the request
body goes upstream byte for byte; the one request change is the recorded drop of Accept-Encoding (tapfix
asks for an identity response so it can read it), and the headers llama-server gets are checked to be
the client's with exactly the recorded changes applied.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Store
from tests.process.engine_suite import relayed
from tests.process.realengine import tiny_model as tm
from tests.process.realengine.relay import Exchange, Relay
from tests.support.inproc import InprocProxy
from tests.support.procs import wait_capture

pytestmark = [pytest.mark.realengine]

CHAT = "/v1/chat/completions"
TOOLS = [tm.WRITE_TOOL]
HI = [{"role": "user", "content": "hi"}]
AFTER_THE_CALL = tm.after_the_call()

# name -> (request body, what the server's answer must show for the case to test what it says)
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "stream": ({"messages": HI, "stream": True}, "answer"),
    "stream_usage": ({"messages": HI, "stream": True, "stream_options": {"include_usage": True}}, "usage_chunk"),
    "stream_tool_call": ({"messages": HI, "tools": TOOLS, "stream": True}, "call"),
    "stream_tool_required": ({"messages": HI, "tools": TOOLS, "tool_choice": "required", "stream": True}, "call"),
    "stream_n2": ({"messages": HI, "n": 2, "stream": True}, "two_answers"),
    "stream_tool_result": ({"messages": AFTER_THE_CALL, "tools": TOOLS, "stream": True}, "answer"),
    "plain": ({"messages": HI}, "answer"),
    "tool_call": ({"messages": HI, "tools": TOOLS}, "call"),
    "n2": ({"messages": HI, "n": 2}, "two_answers"),
}
# A context overflow no longer passes through byte for byte: the client gets the overflow agents compact on,
# the capture keeps llama-server's error (issue 37; test_captures.py's test_context_overflow_keeps_the_engines_error).
# What tapfix may ask the engine itself beside a request (issue 37): its window, and the prompt's count.
WINDOW_READS = ("GET /v1/models ", "GET /props ", "POST /tokenize ", "POST /apply-template ")

# Headers that frame one hop of HTTP/1.1, not the answer: each hop may set its own.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade"}
TAPFIX_OWN = {"x-tapfix-capture-id"}  # names the capture; a client that doesn't know it ignores it


relay, proxy = relayed("llama")


# --- reading the answers, independently of tapfix ------------------------------------------------


def sse_chunks(body: bytes) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE body (the `[DONE]` sentinel left out)."""
    chunks = []
    for line in body.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            chunks.append(json.loads(line[5:]))
    return chunks


def choices(body: bytes, stream: bool) -> dict[int, dict[str, Any]]:
    """Each choice's content, tool calls (arguments as text) and finish reason, assembled from the deltas
    when streamed."""
    if not stream:
        return {
            c["index"]: {
                "content": c["message"].get("content") or "",
                "tool_calls": [{"id": t.get("id"), **t["function"]} for t in c["message"].get("tool_calls") or []],
                "finish_reason": c["finish_reason"],
            }
            for c in json.loads(body)["choices"]
        }
    assembled: dict[int, dict[str, Any]] = {}
    for chunk in sse_chunks(body):
        for c in chunk["choices"]:
            choice = assembled.setdefault(c["index"], {"content": "", "calls": {}, "finish_reason": None})
            delta = c.get("delta") or {}
            choice["content"] += delta.get("content") or ""
            for t in delta.get("tool_calls") or []:
                call = choice["calls"].setdefault(t["index"], {"id": None, "name": "", "arguments": ""})
                call["id"] = t.get("id") or call["id"]
                call["name"] += (t.get("function") or {}).get("name") or ""
                call["arguments"] += (t.get("function") or {}).get("arguments") or ""
            choice["finish_reason"] = c.get("finish_reason") or choice["finish_reason"]
    return {
        i: {
            "content": c["content"],
            "tool_calls": [c["calls"][k] for k in sorted(c["calls"])],
            "finish_reason": c["finish_reason"],
        }
        for i, c in assembled.items()
    }


def assert_the_case_is_what_it_says(expect: str, status: int, body: bytes, stream: bool) -> None:
    """The server's own answer shows the feature the case is named for (else the case tests nothing)."""
    assert status == 200
    answer = choices(body, stream)
    if expect == "call":
        [call] = answer[0]["tool_calls"]
        assert (call["name"], json.loads(call["arguments"])) == (tm.CALL_NAME, tm.CALL_ARGUMENTS)
        assert answer[0]["finish_reason"] == "tool_calls"
        return
    assert sorted(answer) == ([0, 1] if expect == "two_answers" else [0])
    assert all(c["content"] == tm.ANSWER and c["finish_reason"] == "stop" for c in answer.values())
    if expect == "usage_chunk":
        last = sse_chunks(body)[-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0


# --- the capture -------------------------------------------------------------------------------------


def recorded_changes(db: Path, capture_id: str) -> list[dict[str, Any]]:
    """The capture's change rows (the writer commits an exchange and its changes in one transaction)."""
    wait_capture(db, capture_id)
    return Store(db).changes(capture_id)


# --- the comparison ----------------------------------------------------------------------------------


@dataclass
class Seen:
    """A message as the client saw it: the request it sent (no status) or the response tapfix gave it."""

    status: int | None
    headers: httpx.Headers
    body: bytes


def one_exchange(relay: Relay, mark: dict[int, int]) -> Exchange:
    """The one request tapfix sent upstream for the client's (anything else only reads the engine's window)."""
    seen = relay.exchanges_since(mark)
    [exchange] = [e for e in seen if e.request.start_line.startswith(f"POST {CHAT} ")]
    assert all(e is exchange or e.request.start_line.startswith(WINDOW_READS) for e in seen), seen
    return exchange


REQUEST_STAGES = {"router", "policy", "sampling", "reasoning", "framing"}


def as_forwarded(sent: Seen, changes: list[dict[str, Any]]) -> tuple[dict[str, str], Any]:
    """The client's request headers and JSON with the recorded changes applied: what llama-server must
    have received if the capture tells the whole truth. Every change must be a request-side one on a
    header or a top-level field (the answers are valid, so nothing touches the response)."""
    headers = {k.lower(): v for k, v in sent.headers.items()}
    body = json.loads(sent.body)
    for change in changes:
        assert change["stage"] in REQUEST_STAGES, f"a response-side change on a valid answer: {change}"
        path = change["path"]
        if path.startswith("headers."):
            assert change["kind"] == "drop" and headers.get(path[8:]) == change["before"], change
            del headers[path[8:]]
        else:
            key = path.removeprefix("$.")
            assert path.startswith("$.") and key.isidentifier(), f"unexpected change path: {change}"
            assert change["kind"] == "rename" or body.get(key) == change["before"], change
            if change["kind"] == "drop":
                del body[key]
            elif change["kind"] == "rename":  # before/after are the old and new names
                body[change["after"]] = body.pop(key)
            else:
                body[key] = change["after"]
    return headers, body


def assert_forwarded(sent: Seen, exchange: Exchange, changes: list[dict[str, Any]]) -> None:
    """llama-server received the client's request plus exactly the recorded changes: byte for byte when no
    change touched the body, and no header tapfix didn't record."""
    want_headers, want_body = as_forwarded(sent, changes)
    upstream = exchange.request
    if not any(c["path"].startswith("$.") for c in changes):
        assert upstream.body == sent.body, "the request llama-server received differs from the client's"
    assert json.loads(upstream.body) == want_body
    got_headers = {k.lower(): v for k, v in upstream.headers}
    framing = HOP_BY_HOP | {"host"}  # host names the upstream in reverse mode
    assert {k: v for k, v in got_headers.items() if k not in framing} == {
        k: v for k, v in want_headers.items() if k not in framing
    }


def assert_passed_back(received: Seen, exchange: Exchange) -> None:
    """The client got the server's status, body and meaningful headers, and no header that changes meaning."""
    server = exchange.response
    assert received.status == server.status
    assert received.body == server.body, "the body the client received differs from llama-server's"
    server_headers = {k.lower(): v for k, v in server.headers}
    for name, value in server_headers.items():
        if name not in HOP_BY_HOP:
            assert received.headers.get(name) == value, f"{name}: llama-server sent {value!r}"
    added = {k.lower() for k in received.headers} - set(server_headers) - HOP_BY_HOP - TAPFIX_OWN
    assert not added, f"tapfix added headers: {added}"
    assert "content-encoding" not in received.headers  # the bytes compared are the bytes on the wire
    if "content-length" in received.headers:
        assert int(received.headers["content-length"]) == len(received.body)


def post(proxy: InprocProxy, body: dict[str, Any]) -> tuple[Seen, Seen]:
    """The request as the client sent it, and the response as it received it (undecoded, de-chunked)."""
    with httpx.Client(timeout=30) as client:
        with client.stream(
            "POST", proxy.url + CHAT, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
        ) as response:
            raw = b"".join(response.iter_raw())
    sent = Seen(None, response.request.headers, response.request.content)
    return sent, Seen(response.status_code, response.headers, raw)


def check_passthrough(proxy: InprocProxy, relay: Relay, body: dict[str, Any], expect: str) -> list[dict[str, Any]]:
    """Send `body` through tapfix, check every passthrough promise against the relay's record of the same
    request, and return the capture's changes."""
    mark = relay.mark()
    sent, received = post(proxy, body)
    exchange = one_exchange(relay, mark)
    stream = bool(body.get("stream"))
    changes = recorded_changes(proxy.extra["db"], received.headers["x-tapfix-capture-id"])

    assert_the_case_is_what_it_says(expect, exchange.response.status, exchange.response.body, stream)
    assert_passed_back(received, exchange)
    # repair is armed but silent on valid answers: the only changes recorded are request-side ones,
    # and llama-server got the client's request with exactly those applied
    assert_forwarded(sent, exchange, changes)
    if stream:
        assert exchange.response.header("content-type") == received.headers["content-type"] == "text/event-stream"
        assert exchange.response.header("x-accel-buffering") == received.headers["x-accel-buffering"] == "no"
    # the answer (tool calls, ids included) the client assembles is the server's
    assert choices(received.body, stream) == choices(exchange.response.body, stream)
    return changes


GREEDY = {"temperature": 0, "seed": 1, "max_tokens": 64}


@pytest.mark.parametrize("name", list(CASES))
def test_the_client_gets_exactly_what_llama_server_sent(proxy: InprocProxy, relay: Relay, name: str) -> None:
    request, expect = CASES[name]
    changes = check_passthrough(proxy, relay, {**request, **GREEDY}, expect)
    # with tapfix run's defaults (no --generation-config, no --engine) the body goes upstream untouched
    assert not [c for c in changes if not c["path"].startswith("headers.")]


def test_sampling_defaults_reach_the_server_as_recorded_and_the_answer_still_passes(
    tapfix_in_front: Callable[..., InprocProxy], relay: Relay, tmp_path: Path
) -> None:
    """With a generation_config tapfix does change the request: llama-server must get the client's JSON
    plus exactly the recorded injections, and the answer must still pass untouched."""
    config = tmp_path / "generation_config.json"
    config.write_text(json.dumps({"top_k": 20, "top_p": 0.8, "temperature": 0.7}))
    proxy = tapfix_in_front(relay, "--generation-config", str(config), "--engine", "llamacpp")
    request, expect = CASES["stream_tool_call"]
    # The client asks for usage: with --engine tapfix would ask for it otherwise, and the client would get the
    # stream without llama-server's usage chunk (issue 37, tests/process/realengine/test_usage.py)
    request = {**request, "stream_options": {"include_usage": True}}
    changes = check_passthrough(proxy, relay, {**request, **GREEDY}, expect)
    injected = {c["path"]: c["after"] for c in changes if c["stage"] == "sampling"}
    assert injected == {"$.top_k": 20, "$.top_p": 0.8}  # the client's own temperature 0 stands


class TeeTransport(httpx.BaseTransport):
    """The openai SDK's transport, keeping the bytes it sends and the raw bytes it receives, so the
    SDK's own parsing can be checked against the relay's record."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[httpx.Request] = []
        self.received: list[tuple[httpx.Response, bytearray]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.sent.append(request)
        response = self.inner.handle_request(request)
        raw = bytearray()
        upstream = response.stream
        assert isinstance(upstream, httpx.SyncByteStream)

        class Tee(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for chunk in upstream:
                    raw.extend(chunk)
                    yield chunk

            def close(self) -> None:
                upstream.close()

        self.received.append((response, raw))
        return httpx.Response(
            response.status_code, headers=response.headers, stream=Tee(), extensions=response.extensions
        )

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_the_openai_sdk_assembles_the_servers_tool_call(proxy: InprocProxy, relay: Relay, stream: bool) -> None:
    import openai

    tee = TeeTransport()
    client = openai.OpenAI(
        base_url=proxy.url + "/v1", api_key="unused", max_retries=0, http_client=httpx.Client(transport=tee)
    )
    mark = relay.mark()
    with client:
        answer = client.chat.completions.create(
            model="tiny",
            messages=HI,
            tools=TOOLS,
            stream=stream,
            **GREEDY,
        )
        if stream:
            calls: dict[int, dict[str, Any]] = {}
            for chunk in answer:
                deltas = [d for c in chunk.choices for d in c.delta.tool_calls or []]
                for delta in deltas:
                    call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = delta.id or call["id"]
                    if delta.function is not None:
                        call["name"] += delta.function.name or ""
                        call["arguments"] += delta.function.arguments or ""
            sdk_calls = [calls[i] for i in sorted(calls)]
        else:
            sdk_calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in answer.choices[0].message.tool_calls or []
            ]
    exchange = one_exchange(relay, mark)
    [(response, raw)] = tee.received
    [request] = tee.sent
    server_calls = choices(exchange.response.body, stream)[0]["tool_calls"]

    assert_the_case_is_what_it_says("call", exchange.response.status, exchange.response.body, stream)
    assert bytes(raw) == exchange.response.body
    assert sdk_calls == server_calls
    changes = recorded_changes(proxy.extra["db"], response.headers["x-tapfix-capture-id"])
    assert_forwarded(Seen(None, request.headers, request.content), exchange, changes)
