"""A finished exchange is freed by reference count, not left to the cyclic collector (addons/release.py).

mitmproxy holds each connection's flows in reference cycles until a full collection; what tapfix hangs off
a flow (the exchange, its chunks, the pipeline and stages) must not wait with them: at 128 agents' streams
those full collections were 200 ms pauses of every stream in flight. With the collector off, nothing of a
finished exchange may be left once the writer has stored it.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import httpx
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.response.pipeline import StreamPipeline

from tests.support.inproc import start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawServer, sse_response

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
EVENT = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"w"}}]}\n\n'


def _left(ids: set[str]) -> list[object]:
    return [
        o
        for o in gc.get_objects()
        if (isinstance(o, Exchange) and o.id in ids)
        or (isinstance(o, StreamPipeline) and getattr(o.exchange, "id", None) in ids)
    ]


@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
def test_nothing_of_a_finished_exchange_waits_for_the_collector(tmp_path: Path, stream: bool) -> None:
    def respond(_):
        if stream:
            return sse_response([EVENT] * 8 + [b"data: [DONE]\n\n"], delay=0.002)
        body = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"w"}}]}'
        return [
            (
                0.0,
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body),
            )
        ]

    server = RawServer(respond)
    proxy = start_proxy(tmp_path, server.url)
    gc.collect()
    gc.disable()
    try:
        ids = set()
        for _ in range(3):  # a connection each, closed at the end: its cycles are garbage the collector won't see
            with httpx.Client(base_url=proxy.url, timeout=30) as client:
                body = {"model": "m", "stream": stream, "tools": TOOLS, "messages": [{"role": "user", "content": "x"}]}
                response = client.post("/v1/chat/completions", json=body)
                assert response.status_code == 200
                ids.add(response.headers["x-tapfix-capture-id"])
        for capture_id in ids:
            wait_capture(proxy.extra["db"], capture_id)
        deadline = time.monotonic() + 5
        while _left(ids) and time.monotonic() < deadline:  # the writer lets go once it has stored them
            time.sleep(0.05)
        assert _left(ids) == []
    finally:
        gc.enable()
        proxy.stop()
        server.close()
