"""A loopback HTTP/1.1 relay that breaks one streamed answer, the way a dropped connection or a crashing
engine does, and passes everything else through byte for byte.

The real engine never breaks a call on demand, so the regeneration tests put this between `tapfix run`
and llama-server: the FIRST 200 chunked response to a streamed POST .../chat/completions is cut at a
point found in its de-chunked body (`Cut`), after the engine's real bytes up to there went out; every
later request and response crosses untouched. Like relay.py it is independent of tapfix and mitmproxy
(plain sockets, a thread per connection, its own framing), and it records each exchange: the request,
the whole body the server sent (read on to its end even past a cut) and the body the client got.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import socket
import struct
import termios
import threading
import time
from dataclasses import dataclass

from tests.process.realengine.relay import Message, close_all

_BUFFER = 65536


@dataclass(frozen=True)
class Cut:
    """Where the broken answer stops: `offset` bytes after the start of the `nth` `needle` in the body
    (then, with `event_end`, on to the end of the SSE event holding that point); `reset` ends the
    connection with a TCP reset instead of a clean last chunk."""

    needle: bytes = b'"tool_calls"'
    nth: int = 1
    offset: int = 0
    event_end: bool = False
    reset: bool = False

    def at(self, body: bytes) -> int | None:
        """The cut's position in `body`, or None while the body doesn't reach it yet."""
        found = -1
        for _ in range(self.nth):
            found = body.find(self.needle, found + 1)
            if found < 0:
                return None
        at = found + self.offset
        if self.event_end:
            end = body.find(b"\n\n", at)
            return None if end < 0 else end + 2
        return at if at <= len(body) else None


@dataclass(frozen=True)
class Passed:
    """One exchange that crossed the relay."""

    request: Message
    status: int
    upstream: bytes  # the de-framed body as the server sent it, whole
    delivered: bytes  # the de-framed body the client got
    cut: bool
    arrived: int  # the request's place in the order requests reached the relay

    @property
    def json(self) -> dict:
        return json.loads(self.request.body)


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        data = self.sock.recv(_BUFFER)
        self.buffer += data
        return bool(data)

    def until(self, delimiter: bytes) -> bytes | None:
        """Up to and including `delimiter`; None at a clean end before any byte of it."""
        while delimiter not in self.buffer:
            if not self._fill():
                if self.buffer:
                    raise ConnectionError("the peer closed inside a message")
                return None
        end = self.buffer.index(delimiter) + len(delimiter)
        out, self.buffer = self.buffer[:end], self.buffer[end:]
        return out

    def exact(self, count: int) -> bytes:
        while len(self.buffer) < count:
            if not self._fill():
                raise ConnectionError("the peer closed inside a body")
        out, self.buffer = self.buffer[:count], self.buffer[count:]
        return out

    def rest(self) -> bytes:
        while self._fill():
            pass
        out, self.buffer = self.buffer, b""
        return out


def _head(raw: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = raw.decode("latin-1").rstrip("\r\n").split("\r\n")
    return lines[0], [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:])]


def _header(headers: list[tuple[str, str]], name: str) -> str:
    return ", ".join(v for k, v in headers if k.lower() == name.lower())


def _reset(sock: socket.socket, timeout: float = 5.0) -> None:
    """End the connection with a TCP reset once the peer has every byte written so far: a close with
    SO_LINGER 0 drops what is still in the send queue, and a reset can overtake what the peer hasn't
    read yet, so the cut would land earlier than the test meant (then before the call, at random)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        unacked = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        if unacked == 0:
            break
        time.sleep(0.005)
    time.sleep(0.2)  # the peer reads what it has before the reset arrives
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, not a FIN: the client reads ECONNRESET


class FaultRelay:
    """Listens on a free loopback port and forwards each connection to `upstream_port`, cutting one answer."""

    def __init__(self, upstream_port: int, cut: Cut) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.cut = cut
        self._armed = True
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._arrivals = itertools.count()
        self._passed: list[Passed] = []
        self.errors: list[str] = []  # what broke a connection besides the cut (the client leaving included)
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="fault-relay-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def chat(self, count: int, timeout: float = 30.0) -> list[Passed]:
        """The chat completion exchanges so far, once there are `count` of them, in the order their requests came:
        an exchange is kept when its answer is over, and a cut answer is still read to its end while the next
        attempt runs (a real vLLM finished the continuation first)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [p for p in self._passed if p.request.start_line.split(" ")[1].endswith("/chat/completions")]
            if len(found) >= count or time.monotonic() > deadline:
                return sorted(found, key=lambda p: p.arrived)
            time.sleep(0.02)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _claim(self, request: Message, status: int, headers: list[tuple[str, str]]) -> bool:
        """Whether this is the one answer to cut: the first 200 chunked stream of a streamed chat POST."""
        method, path = request.start_line.split(" ")[:2]
        if method != "POST" or not path.endswith("/chat/completions") or status != 200:
            return False
        if "chunked" not in _header(headers, "transfer-encoding").lower():
            return False
        try:
            streamed = json.loads(request.body).get("stream") is True
        except ValueError:
            return False
        with self._lock:
            claimed, self._armed = self._armed and streamed, self._armed and not streamed
        return claimed

    def _serve(self, client: socket.socket) -> None:
        try:
            from_client = _Reader(client)
            while self._exchange(client, from_client):
                pass
        except OSError as e:
            with self._lock:
                self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            client.close()

    def _exchange(self, client: socket.socket, fc: _Reader) -> bool:
        """Relay one request and its response; False when the client's connection is over. Each request
        gets a server connection of its own: llama-server now and then closes a kept-alive connection
        right after a stream, and that race is not the fault under test."""
        raw_head = fc.until(b"\r\n\r\n")
        if raw_head is None:
            return False
        start, headers = _head(raw_head)
        length = _header(headers, "content-length")
        body = fc.exact(int(length)) if length else b""  # tapfix's httpx always frames a body by length
        request = Message(start, headers, body, False)
        with self._lock:
            arrived = next(self._arrivals)
        with socket.create_connection(self.upstream, timeout=60) as server:
            with self._lock:
                self._sockets.append(server)
            server.sendall(raw_head + body)
            return self._respond(client, request, _Reader(server), arrived)

    def _respond(self, client: socket.socket, request: Message, fs: _Reader, arrived: int) -> bool:
        start = request.start_line
        while True:
            raw_response = fs.until(b"\r\n\r\n")
            if raw_response is None:
                return False
            status_line, response_headers = _head(raw_response)
            status = int(status_line.split(" ")[1])
            if not 100 <= status < 200:
                break
            client.sendall(raw_response)
        cutting = self._claim(request, status, response_headers)
        client.sendall(raw_response)
        upstream, delivered, cut_done = b"", b"", False
        if start.startswith("HEAD ") or status in (204, 304):
            pass
        elif "chunked" in _header(response_headers, "transfer-encoding").lower():
            while True:
                size_line = fs.until(b"\r\n")
                if size_line is None:
                    raise ConnectionError("the server closed inside a chunked body")
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    trailers = b""
                    while (line := fs.until(b"\r\n")) not in (b"\r\n", None):
                        trailers += line
                    if not cut_done:
                        client.sendall(size_line + trailers + b"\r\n")
                    break
                data = fs.exact(size)
                fs.exact(2)
                before = len(upstream)
                upstream += data
                if cut_done:
                    continue
                at = self.cut.at(upstream) if cutting else None
                if at is None:
                    client.sendall(size_line + data + b"\r\n")
                    delivered += data
                    continue
                part = data[: max(0, at - before)]
                if part:
                    client.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
                    delivered += part
                cut_done = True
                if self.cut.reset:
                    _reset(client)
                else:
                    client.sendall(b"0\r\n\r\n")
        elif length := _header(response_headers, "content-length"):
            upstream = delivered = fs.exact(int(length))
            client.sendall(upstream)
        else:
            upstream = delivered = fs.rest()
            client.sendall(upstream)
            cut_done = True  # read to close: the connection ends with it
        with self._lock:
            self._passed.append(Passed(request, status, upstream, delivered, cutting, arrived))
        return not (cut_done and (self.cut.reset or not cutting))

    def close(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        close_all(self._listener, sockets)
