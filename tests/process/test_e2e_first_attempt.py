"""Issue 34: a request that may be regenerated costs what any other request costs until it needs another
attempt. Its first attempt is mitmproxy's own upstream request: the upstream's bytes are read and parsed
once, by the connection tapfix opened for the client's, with no hop through a second HTTP server or
client inside tapfix (the regeneration relay of issue 19 took one for every streamed request with tools).
And both legs send small writes at once: TCP_NODELAY on the client's connection and on the upstream's
(Nagle's algorithm against delayed ACKs shows as ~40 ms of added time to first token)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.builders import tool
from tests.support.procs import Proc, start_proxy
from tests.support.rawserver import RawServer, sse_response
from tests.support.sockets import ESTABLISHED, LISTEN, TcpSocket, option, tcp_sockets

CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'
PAUSE_S = 1.5  # the upstream holds the stream open this long after its first event
WINDOW = ("--context-window", "32768")  # given: tapfix asks the upstream nothing of its own (addons/window.py)
BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "tools": [tool("write")]}


def paused_stream(_: object) -> list[tuple[float, bytes]]:
    script = sse_response([CHUNK % b"one", CHUNK % b"two", b"data: [DONE]\n\n"])
    head, first, *rest = script
    return [head, first, (PAUSE_S, rest[0][1]), *rest[1:]]


@pytest.fixture
def upstream() -> Iterator[RawServer]:
    with RawServer(paused_stream) as server:
        yield server


def sockets_mid_stream(proxy: Proc, body: dict, nodelay: dict[int, int] | None = None) -> list[TcpSocket]:
    """tapfix's TCP sockets while the upstream pauses inside a streamed answer, and that the stream then
    ends whole. `nodelay`: filled with each established socket's TCP_NODELAY (by fd), read while it is open."""
    first = threading.Event()
    seen: list[TcpSocket] = []
    received = bytearray()

    def read() -> None:
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=30) as r:
            for data in r.iter_raw():
                received.extend(data)
                first.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert first.wait(20), "no first event"
        seen = tcp_sockets(proxy.proc.pid)
        for s in seen if nodelay is not None else []:
            if s.state == ESTABLISHED:
                nodelay[s.fd] = option(proxy.proc.pid, s.fd, socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        reader.join(30)
    assert received.count(b"data: ") == 3 and received.endswith(b"data: [DONE]\n\n"), bytes(received)
    return seen


@pytest.mark.parametrize("regenerate", ["1", "0"])
def test_a_streamed_request_with_tools_takes_one_upstream_connection_and_no_hop_inside_tapfix(
    tmp_path: Path, upstream: RawServer, regenerate: str
) -> None:
    proxy = start_proxy(tmp_path, upstream.url, "--regenerate", regenerate, *WINDOW)
    try:
        seen = sockets_mid_stream(proxy, BODY)
        health = httpx.get(proxy.url + "/tapfix/health").json()
    finally:
        proxy.stop()
    listening = sorted(s.local[1] for s in seen if s.state == LISTEN)
    assert listening == [proxy.port], f"tapfix listens on its own port only, no relay's: {seen}"
    established = [s for s in seen if s.state == ESTABLISHED]
    to_client = [s for s in established if s.local[1] == proxy.port]
    to_upstream = [s for s in established if s.remote[1] == upstream.port]
    assert len(to_client) == 1 and len(to_upstream) == 1, seen
    assert len(established) == 2, f"no other connection (a loopback hop to itself): {established}"
    assert len(upstream.requests) == 1 and health["later_attempts"] == 0


def test_both_legs_send_small_writes_at_once(tmp_path: Path, upstream: RawServer) -> None:
    proxy = start_proxy(tmp_path, upstream.url, *WINDOW)
    try:
        options: dict[int, int] = {}
        seen = sockets_mid_stream(proxy, BODY, options)
    finally:
        proxy.stop()
    legs = {
        "client": [s for s in seen if s.state == ESTABLISHED and s.local[1] == proxy.port],
        "upstream": [s for s in seen if s.state == ESTABLISHED and s.remote[1] == upstream.port],
    }
    nodelay = {leg: [options[s.fd] for s in found] for leg, found in legs.items()}
    assert nodelay["client"] and nodelay["upstream"], legs
    assert all(nodelay["client"]) and all(nodelay["upstream"]), nodelay
