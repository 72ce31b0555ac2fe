"""A later attempt (issue 19) reaches the upstream with the headers mitmproxy forwarded for attempt 1, and
nothing more: attempt 1 of a streamed request with tools under the default `--regenerate 1` is sent as
under `--regenerate 0`, and attempt 2, sent by tapfix's own client, repeats its headers. httpx's defaults
once added an `accept-encoding` the router strips, so an upstream that honours it compressed the stream and
regeneration silently never happened."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx

from tests.support.builders import tool
from tests.support.inproc import start_proxy
from tests.support.rawserver import RawRequest, RawServer, sse_response

# W3C trace context with OTLP export off: noted in the store, forwarded byte for byte on either path.
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACESTATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
CUT_CALL = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"id":"call_1","type":"function","function":{"name":"write","arguments":"{\\"pa"}}]}}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'
    b"\n\n"
)
HEADERS = {"user-agent": "agent/1", "accept-encoding": "gzip", "traceparent": TRACEPARENT, "tracestate": TRACESTATE}


def header_names(request: RawRequest) -> list[str]:
    return sorted(line.split(b":", 1)[0].decode().lower() for line in request.head.split(b"\r\n")[1:] if line)


def test_a_later_attempt_reaches_the_upstream_with_attempt_1s_headers(tmp_path: Path) -> None:
    def answer(request: RawRequest) -> list[tuple[float, bytes]]:
        broken = "seed" not in json.loads(request.body)  # attempt 2 (from scratch) carries a fresh seed
        return sse_response([CHUNK, *([CUT_CALL] if broken else []), b"data: [DONE]\n\n"])

    server = RawServer(answer)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "tools": [tool("write")]}
    seen: dict[str, list[RawRequest]] = {}
    try:
        for regenerate in ("1", "0"):
            db = tmp_path / f"{regenerate}.db"
            # the window given: tapfix asks the upstream nothing of its own (addons/window.py), only attempts go
            proxy = start_proxy(tmp_path, server.url, "--regenerate", regenerate, "--context-window", "32768", db=db)
            before = len(server.requests)
            try:
                with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers=HEADERS) as r:
                    assert b"".join(r.iter_raw()).startswith(CHUNK)
                health = httpx.get(proxy.url + "/tapfix/health").json()
            finally:
                proxy.stop()
            seen[regenerate] = server.requests[before:]
            assert health["later_attempts"] == (1 if regenerate == "1" else 0)
            assert len(seen[regenerate]) == 1 + health["later_attempts"]
            for request in seen[regenerate]:
                assert request.header("accept-encoding") in (None, "identity"), request.head
                assert request.header("user-agent") == "agent/1"
                assert (request.header("traceparent"), request.header("tracestate")) == (TRACEPARENT, TRACESTATE)
                assert json.loads(request.body)["tools"]
            with sqlite3.connect(tmp_path / f"{regenerate}.db") as conn:
                stored = conn.execute("select trace_id, span_id, parent_span_id from exchanges where attempt = 1")
                assert stored.fetchall() == [("4bf92f3577b34da6a3ce929d0e0e4736", None, "00f067aa0ba902b7")]
    finally:
        server.close()
    first, second = seen["1"]
    assert header_names(first) == header_names(seen["0"][0]), "attempt 1 goes as without regeneration"
    hop_by_hop = {"connection", "keep-alive"}  # each connection's own (RFC 9110 §7.6.1)
    assert [h for h in header_names(second) if h not in hop_by_hop] == [
        h for h in header_names(first) if h not in hop_by_hop
    ], (first.head, second.head)
