"""A loopback TCP relay that records every byte each way, per connection: the witness of what
llama-server really received and sent when tapfix sits in front of it.

It is deliberately independent of tapfix and mitmproxy (plain sockets and threads, its own HTTP/1.1
framing), so a test comparing tapfix's output against it isn't comparing tapfix against itself.
Put it between `tapfix run --upstream <relay.url>` and the server; after a request, `exchanges_since`
gives the HTTP exchanges that crossed it, parsed from the recorded bytes: request and response heads
and bodies de-framed (Content-Length, chunked transfer encoding, or read to close).
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
import orjson

_BUFFER = 65536


@dataclass
class Recording:
    """One relayed connection: the bytes the client side sent toward the server, and the server's."""

    to_server: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)
    server_closed: bool = False  # the server side ended its half: a read-to-close body is complete


@dataclass(frozen=True)
class Message:
    """One HTTP/1.1 request or response as it crossed the wire."""

    start_line: str
    headers: list[tuple[str, str]]  # in order, names as sent
    body: bytes  # de-framed: the payload without chunk sizes
    chunked: bool

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        return ", ".join(values) if values else None

    @property
    def status(self) -> int:
        return int(self.start_line.split(" ", 2)[1])


@dataclass(frozen=True)
class Exchange:
    request: Message
    response: Message


class _Incomplete(Exception):
    """The bytes so far end inside a message."""


def _parse_head(data: bytes, at: int) -> tuple[str, list[tuple[str, str]], int]:
    end = data.find(b"\r\n\r\n", at)
    if end < 0:
        raise _Incomplete
    lines = data[at:end].decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers, end + 4


def _dechunk(data: bytes, at: int) -> tuple[bytes, int]:
    body = bytearray()
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            raise _Incomplete
        size = int(data[at:line_end].split(b";")[0].strip(), 16)
        at = line_end + 2
        if size == 0:
            trailers_end = data.find(b"\r\n", at)  # the empty line, or trailers ending in one
            while trailers_end >= 0 and trailers_end != at:
                at = trailers_end + 2
                trailers_end = data.find(b"\r\n", at)
            if trailers_end < 0:
                raise _Incomplete
            return bytes(body), trailers_end + 2
        if len(data) < at + size + 2:
            raise _Incomplete
        body += data[at : at + size]
        at += size + 2


def _parse_message(data: bytes, at: int, *, response: bool, closed: bool, head_request: bool) -> tuple[Message, int]:
    start_line, headers, at = _parse_head(data, at)
    message = Message(start_line, headers, b"", False)
    if response and (head_request or message.status in (204, 304) or 100 <= message.status < 200):
        return message, at
    if "chunked" in (message.header("transfer-encoding") or "").lower():
        body, at = _dechunk(data, at)
        return Message(start_line, headers, body, True), at
    length = message.header("content-length")
    if length is not None:
        end = at + int(length)
        if len(data) < end:
            raise _Incomplete
        return Message(start_line, headers, data[at:end], False), end
    if not response:
        return message, at
    if not closed:
        raise _Incomplete
    return Message(start_line, headers, data[at:], False), len(data)


def parse_messages(
    data: bytes, *, response: bool, closed: bool = False, head_requests: list[bool] | None = None
) -> list[Message]:
    """The complete messages at the start of `data` (a partial last one is left out)."""
    messages: list[Message] = []
    at = 0
    while at < len(data):
        head_request = bool(head_requests and len(messages) < len(head_requests) and head_requests[len(messages)])
        try:
            message, at = _parse_message(data, at, response=response, closed=closed, head_request=head_request)
        except _Incomplete:
            break
        if response and 100 <= message.status < 200:
            continue  # an interim response (100 Continue) answers nothing on its own
        messages.append(message)
    return messages


class Relay:
    """Listens on a free loopback port and forwards each connection to `upstream_port`, recording it."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._recordings: list[Recording] = []
        self._sockets: list[socket.socket] = []
        self._closing = False
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            recording = Recording()
            with self._lock:
                if self._closing:
                    client.close()
                    server.close()
                    return
                self._recordings.append(recording)
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, recording, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, recording, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, recording: Recording, from_server: bool) -> None:
        """Copy one direction; each chunk is recorded before it is forwarded, so whatever the client has
        seen is already in the recording."""
        buffer = recording.to_client if from_server else recording.to_server
        try:
            while data := source.recv(_BUFFER):
                with self._lock:
                    buffer += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            if from_server:
                with self._lock:
                    recording.server_closed = True
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def mark(self) -> dict[int, int]:
        """How many requests each connection has carried so far: pass it to `exchanges_since`."""
        with self._lock:
            return {i: len(parse_messages(bytes(r.to_server), response=False)) for i, r in enumerate(self._recordings)}

    def _snapshot(self) -> list[tuple[bytes, bytes, bool]]:
        with self._lock:
            return [(bytes(r.to_server), bytes(r.to_client), r.server_closed) for r in self._recordings]

    def exchanges_since(self, mark: dict[int, int], timeout: float = 10.0) -> list[Exchange]:
        """The exchanges begun after `mark`, waiting (up to `timeout`) until every one of them has its
        whole response recorded."""
        deadline = time.monotonic() + timeout
        while True:
            found: list[Exchange] = []
            pending = False
            for i, (sent, received, closed) in enumerate(self._snapshot()):
                requests = parse_messages(sent, response=False)
                heads = [r.start_line.startswith("HEAD ") for r in requests]
                responses = parse_messages(received, response=True, closed=closed, head_requests=heads)
                for n in range(mark.get(i, 0), len(requests)):
                    if n < len(responses):
                        found.append(Exchange(requests[n], responses[n]))
                    else:
                        pending = True
            if not pending and found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"relay: {len(found)} complete exchange(s) since the mark, pending={pending}")
            time.sleep(0.02)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            sockets = list(self._sockets)
        close_all(self._listener, sockets)


def close_all(listener: socket.socket, sockets: list[socket.socket]) -> None:
    """Stop a listener blocked in accept() (shutdown wakes it) and close every connection it served."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()
    for sock in sockets:
        try:
            sock.close()
        except OSError:
            pass


def chat_stream_through(
    proxy_url: str, relay: Relay, body: dict, timeout: float = 60
) -> tuple[bytes, str, bytes, dict]:
    """One streamed chat completion sent to tapfix in front of `relay`: (the bytes the client got, its capture
    id, the bytes the server answered, the request the server received, parsed)."""
    chat = "/v1/chat/completions"
    mark = relay.mark()
    with httpx.Client(timeout=timeout) as client:
        with client.stream("POST", proxy_url + chat, json=body) as response:
            received = b"".join(response.iter_raw())
            capture_id = response.headers["x-tapfix-capture-id"]
    [sent] = [e for e in relay.exchanges_since(mark) if e.request.start_line.startswith(f"POST {chat} ")]
    return received, capture_id, sent.response.body, orjson.loads(sent.request.body)


def split_events(body: bytes) -> list[bytes]:
    """An SSE body's events, each with its blank line."""
    return [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]
