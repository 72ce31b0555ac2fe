"""The regeneration relay (addons/relay.py) forwards what mitmproxy would, and nothing more: a streamed
request with tools (relayed under the default `--regenerate 1`) reaches the upstream with the same headers
as under `--regenerate 0` (direct). httpx's defaults once added an `accept-encoding` the router strips, so
an upstream that honours it compressed the stream and regeneration silently never happened."""

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


def header_names(request: RawRequest) -> list[str]:
    return sorted(line.split(b":", 1)[0].decode().lower() for line in request.head.split(b"\r\n")[1:] if line)


def test_a_relayed_request_reaches_the_upstream_with_the_direct_paths_headers(tmp_path: Path) -> None:
    server = RawServer(lambda _: sse_response([CHUNK, b"data: [DONE]\n\n"]))
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "tools": [tool("write")]}
    seen: dict[str, list[str]] = {}
    try:
        for regenerate in ("1", "0"):
            proxy = start_proxy(tmp_path, server.url, "--regenerate", regenerate, db=tmp_path / f"{regenerate}.db")
            try:
                headers = {
                    "user-agent": "agent/1",
                    "accept-encoding": "gzip",
                    "traceparent": TRACEPARENT,
                    "tracestate": TRACESTATE,
                }
                with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert b"".join(r.iter_raw()).startswith(CHUNK)
                health = httpx.get(proxy.url + "/tapfix/health").json()
            finally:
                proxy.stop()
            assert health["relayed_requests"] == (1 if regenerate == "1" else 0)
            request = server.requests[-1]
            seen[regenerate] = header_names(request)
            assert request.header("accept-encoding") in (None, "identity"), request.head
            assert request.header("user-agent") == "agent/1"
            assert (request.header("traceparent"), request.header("tracestate")) == (TRACEPARENT, TRACESTATE)
            with sqlite3.connect(tmp_path / f"{regenerate}.db") as conn:
                stored = conn.execute("select trace_id, span_id, parent_span_id from exchanges").fetchall()
            assert stored == [("4bf92f3577b34da6a3ce929d0e0e4736", None, "00f067aa0ba902b7")]
            assert json.loads(request.body)["tools"]
    finally:
        server.close()
    hop_by_hop = {"connection", "keep-alive"}  # each hop's own (RFC 9110 §7.6.1): the relay's hop has its own
    assert [h for h in seen["1"] if h not in hop_by_hop] == [h for h in seen["0"] if h not in hop_by_hop], seen
