"""Issue 34's "done when": a first attempt takes no relay hop. Each streamed request with tools, regeneration
armed (the default), reaches the upstream over one connection of tapfix's, and tapfix reads the upstream's
answer as HTTP once: mitmproxy's own HTTP/1 client parses the response head, and nothing else in tapfix
does (the regeneration relay of issue 19 parsed it with httpx, then mitmproxy parsed the relay's copy).
Only a request whose first attempt the splice refuses pays for another parse: its later attempt's, by
tapfix's own client. (The router's reachability check, addons/runner/runtime.py, still opens a TCP
connection that carries no request when tapfix hasn't heard from the upstream for REACHABLE_FOR_S: not an
HTTP exchange, so it is told apart here, not counted as one.)

In the test process, so the parsers themselves are counted: mitmproxy's `http1.read_response_head` and
h11's response events (the HTTP/1 parser under httpx), on the proxy's thread only (the test's own client
parses its answers with h11 too)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from mitmproxy.net.http import http1

from tests.support.builders import tool
from tests.support.inproc import start_proxy
from tests.support.rawserver import RawRequest, RawServer, sse_response

CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
CUT_CALL = (  # a call cut by max_tokens: the splice asks for another attempt
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"id":"call_1","type":"function","function":{"name":"write","arguments":"{\\"pa"}}]}}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'
    b"\n\n"
)
REQUESTS = 3
WINDOW = ("--context-window", "32768")


def body(content: str) -> dict[str, Any]:
    return {"model": "m", "stream": True, "messages": [{"role": "user", "content": content}], "tools": [tool("write")]}


def answer(request: RawRequest) -> list[tuple[float, bytes]]:
    sent = json.loads(request.body)
    broken = sent["messages"][0]["content"] == "break" and "seed" not in sent  # a later attempt carries a seed
    return sse_response([CHUNK, *([CUT_CALL] if broken else []), b"data: [DONE]\n\n"])


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Response heads parsed on the in-process proxy's thread, by parser."""
    counts: Counter[str] = Counter()

    def on_proxy_thread() -> bool:
        return threading.current_thread().name.startswith("tapfix-inproc-")

    read_response_head = http1.read_response_head

    def mitmproxy_reads(*args: Any, **kwargs: Any) -> Any:
        if on_proxy_thread():
            counts["mitmproxy"] += 1
        return read_response_head(*args, **kwargs)

    next_event = h11.Connection.next_event

    def h11_reads(self: h11.Connection) -> Any:
        event = next_event(self)
        if isinstance(event, h11.Response) and on_proxy_thread():
            counts["h11"] += 1
        return event

    monkeypatch.setattr(http1, "read_response_head", mitmproxy_reads)
    monkeypatch.setattr(h11.Connection, "next_event", h11_reads)
    return counts


@pytest.fixture
def upstream() -> Iterator[RawServer]:
    with RawServer(answer) as server:
        yield server


def stream(url: str, content: str, **extra: Any) -> bytes:
    """One request on a connection of its own (a fresh client), read to its end."""
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", url + "/v1/chat/completions", json=body(content) | extra) as r:
            assert r.status_code == 200
            return b"".join(r.iter_raw())


def test_a_first_attempt_is_one_upstream_connection_and_one_parse(
    tmp_path: Path, upstream: RawServer, parsed: Counter[str]
) -> None:
    # --regenerate 1: the default. The window is given, so tapfix asks the upstream nothing of its own here
    # (an engine that reports it is asked once: test_an_upstream_that_tells_no_window_is_not_asked_per_request).
    proxy = start_proxy(tmp_path, upstream.url, *WINDOW)
    try:
        for k in range(REQUESTS):
            assert stream(proxy.url, f"turn {k}").endswith(b"data: [DONE]\n\n")
        first = dict(parsed), [n for n in upstream.served if n], len(upstream.requests)
        assert first == ({"mitmproxy": REQUESTS}, [1] * REQUESTS, REQUESTS), "one connection, request, parse each"
        health = httpx.get(proxy.url + "/tapfix/health").json()
        assert health["later_attempts"] == 0
        # The control: a request whose first attempt the splice refuses costs a second attempt, and that
        # attempt's parse is seen by the same counters (so a hop through an HTTP client would be too).
        got = stream(proxy.url, "break")
        health = httpx.get(proxy.url + "/tapfix/health").json()
    finally:
        proxy.stop()
    assert health["later_attempts"] == 1
    assert b'\\"pa' not in got and got.endswith(b"data: [DONE]\n\n"), "the client got attempt 2, not the cut call"
    assert dict(parsed) == {"mitmproxy": REQUESTS + 1, "h11": 1}
    assert [n for n in upstream.served if n] == [1] * (REQUESTS + 2)  # attempt 2 on a connection of its own


def test_an_upstream_that_tells_no_window_is_not_asked_per_request(tmp_path: Path) -> None:
    """An engine asked for its window (`GET /v1/models`, --engine vllm) that doesn't tell it is asked again
    only after a while, not before every request (each ask was an upstream round trip before the request
    was sent, on the agents' path as on every other)."""
    models = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"data":[]}'

    def answer_or_list(request: RawRequest) -> list[tuple[float, bytes]]:
        return [(0.0, models)] if request.path.startswith("/v1/models") else answer(request)

    upstream = RawServer(answer_or_list)
    try:
        proxy = start_proxy(tmp_path, upstream.url, "--engine", "vllm")
        try:
            for k in range(REQUESTS):
                # an output budget: what makes tapfix want the window (to clamp it)
                assert stream(proxy.url, f"turn {k}", max_tokens=1024).endswith(b"data: [DONE]\n\n")
        finally:
            proxy.stop()
        paths = [r.path for r in upstream.requests]
    finally:
        upstream.close()
    assert paths == ["/v1/models", *["/v1/chat/completions"] * REQUESTS], paths
