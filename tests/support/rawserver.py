"""A byte-precise scripted upstream: records each request exactly and answers with scripted TCP writes.

`tapfix mock` plays a realistic server; this one exists for the framing tests that need control over
TCP chunk boundaries (a UTF-8 character split across writes, CRLF, comments) and abrupt resets.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# (seconds to wait first, bytes to write); b"<RESET>" aborts the socket, b"<CLOSE>" closes it (a FIN, no answer)
Script = list[tuple[float, bytes]]


@dataclass
class RawRequest:
    head: bytes
    body: bytes

    @property
    def path(self) -> str:
        return self.head.split(b" ", 2)[1].decode()

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode()
        return None


def framed(piece: bytes) -> bytes:
    """`piece` as one HTTP/1.1 chunk, written out here (the test's own framing, not tapfix's)."""
    return b"%x\r\n%s\r\n" % (len(piece), piece)


def sse_response(
    events: list[bytes], *, split: Callable[[bytes], list[bytes]] | None = None, delay: float = 0.0
) -> Script:
    """A chunked text/event-stream response whose body is written in the given pieces."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
    )
    script: Script = [(0.0, head)]
    for event in events:
        for piece in split(event) if split else [event]:
            script.append((delay, framed(piece)))
    script.append((0.0, b"0\r\n\r\n"))
    return script


@dataclass
class RawServer:
    respond: Callable[[RawRequest], Script]
    requests: list[RawRequest] = field(default_factory=list)
    served: list[int] = field(default_factory=list)  # requests read on each connection accepted, in order
    port: int = 0
    host: str = "127.0.0.1"  # "::1" for an IPv6 upstream

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://{self.hostport}"

    @property
    def hostport(self) -> str:
        """`host:port` as a URL or a Host header names it: an IPv6 literal in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, self.host, 0))
        self.port = server.sockets[0].getsockname()[1]
        self._server = server
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = len(self.served)
        self.served.append(0)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request = RawRequest(head, b"")
                length = int(request.header("content-length") or 0)
                request.body = await reader.readexactly(length) if length else b""
                self.requests.append(request)
                self.served[connection] += 1
                for wait, data in self.respond(request):
                    if wait:
                        await asyncio.sleep(wait)
                    if data == b"<RESET>":
                        writer.transport.abort()
                        return
                    if data == b"<CLOSE>":
                        return  # `finally` closes it
                    writer.write(data)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        """Stop listening, end the connections still open (a client's keep-alive one waits in `_handle`),
        then the loop. A handler left pending would be destroyed later by the garbage collector, inside
        whichever test runs then (an unraisable-exception warning, an error under filterwarnings)."""

        async def shutdown() -> None:
            self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_reply(body: bytes) -> bytes:
    """A whole `200 OK` answer carrying the JSON `body`."""
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


JSON_OK = json_reply(b"{}")


@contextmanager
def json_upstreams(count: int, host: str = "127.0.0.1") -> Iterator[list[RawServer]]:
    """`count` upstreams that record each request and answer every one `200 {}`: for tests about what
    reaches an upstream, not about its answer."""
    servers = [RawServer(lambda _: [(0.0, JSON_OK)], host=host) for _ in range(count)]
    try:
        yield servers
    finally:
        for server in servers:
            server.close()


def json_ok(_: RawRequest) -> list[tuple[float, bytes]]:
    """A responder that answers every request `200 {}`."""
    return [(0.0, JSON_OK)]


@contextmanager
def raw_servers() -> Iterator[Callable[..., RawServer]]:
    """A maker of RawServers (`make(respond)`), every one closed at the end: a test's `raw` fixture."""
    servers: list[RawServer] = []

    def make(respond: Callable[..., Any]) -> RawServer:
        server = RawServer(respond)
        servers.append(server)
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.close()
