"""The body relay: a streamed response's middle goes from socket to socket past mitmproxy's layers (issue 34).

mitmproxy hands each chunk of a streamed body through its whole sans-IO stack: the server connection's
reader task, a lock, the HTTP/1 client layer (h11's reader), the HTTP layer, the flow's stream, the
HTTP/1 server layer, a command, the writer, a drain. At the agents' pace (one SSE event a read, every
20 ms per stream) that stack is more than half of a chunk's CPU (a stream of 256 events 1 ms apart: 50.0
µs a chunk with every chunk on it, 23.7 with the relay, one run), and it kept one process from holding 128
streams. So once a streamed response is running and both legs are plain HTTP/1.1 with a chunked
body, tapfix swaps the server socket's protocol for its own: each read goes through the chunked reader
(proxy/chunked.py) and the flow's stream callable (the same StreamPipeline, so the taps, repair and
records are the ones mitmproxy's path runs), and its output is framed and written to the client's
socket. At the body's last chunk, a bad frame, the server's EOF or a closed connection, the socket goes
back to mitmproxy with the bytes from that boundary on: the end of the body (the callable's `b""`, the
`response` hook, later attempts, the error hook's tail) stays mitmproxy's, as it was.

The hand-over happens only where the two readers agree on the state: mitmproxy's HTTP/1 client layer
has nothing buffered and stands at a chunk boundary (checked on the layer itself, after the chunk
mitmproxy delivered last has been processed whole), the flow's stream is in its body, and mitmproxy
keeps no copy of streamed bodies. Anything else (TLS on a leg, HTTP/2, a body that isn't chunked, a
layer mid-chunk) leaves the stream on mitmproxy's path, where the next chunk tries again. When mitmproxy's
reader has bytes waiting that it hasn't read (the loop lags the socket: under load, most take-overs), the
relay takes the socket in two steps: it holds what arrives until that read is processed, then starts at
the boundary it ended on, or gives the held bytes back to mitmproxy's reader (measured at 8 paced streams:
streams taken over 62% → 99.8%, their chunks on mitmproxy's path from ~7 of 16 to ~2).

What it relies on of mitmproxy: the proxyserver's `connections`, a handler's `transports` and
`timeout_watchdog`, the HTTP layer's `connections` and `streams`, the HTTP/1 client layer's `buf`,
`state` and h11 `ChunkedReader`; of asyncio, a StreamReader's `_buffer` and `_paused`. A mitmproxy whose
insides moved leaves every stream on its own path (the relay steps aside on an AttributeError).
tests/inproc/test_e2e_body_relay.py holds each of them to it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from h11._readers import ChunkedReader as H11ChunkedReader
from mitmproxy import http
from mitmproxy.proxy.layers.http import HttpClient, HttpLayer, HttpStream
from mitmproxy.proxy.layers.http._http1 import Http1Client, Http1Server
from tapfix.proxy.chunked import ChunkedReader, frame
from tapfix.proxy.response.pipeline import StreamPipeline

logger = logging.getLogger(__name__)

VARIABLE = "TAPFIX_BODY_RELAY"  # "off": every chunk on mitmproxy's path (a bench's side-by-side, a bug's bisection)
HIGH_WATER = 64 * 1024  # client-bound bytes buffered before the server socket waits for the client (asyncio's mark)
SETTLE_TRIES = 4  # loop turns a two-step take-over waits for mitmproxy's reader task before handing back


class Tally:
    """What the relay did in this process: how a test tells it ran (the bytes are the same either way)."""

    taken = 0  # streams taken over
    waited = 0  # times the server socket waited for a slow client


def enabled() -> bool:
    return os.environ.get(VARIABLE, "on").lower() not in ("off", "0", "no")


class BodyRelay:
    """One streamed response's relay: offered after each chunk mitmproxy delivers until it takes over."""

    def __init__(self, flow: http.HTTPFlow, stream: StreamPipeline, proxyserver: Any) -> None:
        self.flow = flow
        self.stream = stream
        self.proxyserver = proxyserver
        self.scheduled = False
        self.running = False
        self.ended = False  # the socket went back to mitmproxy: the body's end is its own
        self.holding: _RelayProtocol | None = None  # the first of a two-step take-over (`take_over`)

    def offer(self) -> None:
        """Called in mitmproxy's layer, mid-event: the check waits until the event is processed whole."""
        if not (self.scheduled or self.running or self.ended or self.holding):
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.take_over)

    def take_over(self) -> None:
        self.scheduled = False
        if self.running or self.ended or self.holding:
            return
        ready = self._ready()
        if ready is None:
            return
        handler, server_io, client_io, h11_reader = ready
        transport, reader = server_io.writer.transport, server_io.reader
        protocol = _RelayProtocol(
            self, transport, transport.get_protocol(), client_io.writer, handler.timeout_watchdog, h11_reader
        )
        if not len(reader._buffer):
            self._start(protocol)
            transport.set_protocol(protocol)
            return
        # Bytes mitmproxy's reader task has been woken for, or will read next, are its to read (taking them would
        # hand its read an empty result, which it takes for the peer's EOF). Under load that is most of the time
        # (the loop lags the socket), so the take-over goes in two steps: what arrives from now on waits in the
        # relay; once mitmproxy's reader has taken its bytes, the relay starts at the boundary they end on, or
        # hands what it held back to mitmproxy's reader (mid-chunk, the body's end, a reader still busy).
        protocol.held = bytearray()
        self.holding = protocol
        transport.set_protocol(protocol)
        asyncio.get_running_loop().call_soon(self._settle, protocol, reader, SETTLE_TRIES)

    def _ready(self) -> tuple[Any, Any, Any, H11ChunkedReader] | None:
        """`_parts`, when the flow is live, both sockets are open and mitmproxy's reader is neither paused nor done."""
        if not self.flow.live or self.flow.error is not None:
            return None
        try:
            parts = _parts(self.flow, self.proxyserver)
        except (AttributeError, KeyError, TypeError):  # a mitmproxy whose insides moved: its own path, as before
            logger.debug("body relay: mitmproxy's layers are not as expected", exc_info=True)
            self.ended = True
            return None
        if parts is None:
            return None
        server_io, client_io = parts[1], parts[2]
        reader = server_io.reader
        if server_io.writer.transport.is_closing() or client_io.writer.transport.is_closing():
            return None
        if reader.exception() is not None or reader.at_eof() or reader._paused:
            return None
        return parts

    def _settle(self, protocol: _RelayProtocol, reader: Any, tries: int) -> None:
        """The second step: mitmproxy's reader has had its turn at the bytes it was woken for. `reader`: its
        asyncio.StreamReader, whose `_buffer` is read (see the module's docstring)."""
        if self.holding is not protocol:  # given back meanwhile (EOF, a closed connection)
            return
        if len(reader._buffer) and tries > 1:  # its task hasn't run yet
            asyncio.get_running_loop().call_soon(self._settle, protocol, reader, tries - 1)
            return
        self.holding = None
        ready = None if len(reader._buffer) else self._ready()
        if ready is None or ready[3] is not protocol.h11_reader:
            protocol.release()
            return
        self._start(protocol)
        protocol.begin()

    def _start(self, protocol: _RelayProtocol) -> None:
        self.running = True
        Tally.taken += 1
        self.stream.after_chunk = None


def _parts(flow: http.HTTPFlow, proxyserver: Any) -> tuple[Any, Any, Any, H11ChunkedReader] | None:
    """The flow's connection handler and both legs' streams, when mitmproxy's side is where the relay can
    start: else None (the next chunk asks again)."""
    if flow.client_conn.tls or flow.server_conn.tls or flow.response is None:
        return None
    if "chunked" not in flow.response.headers.get("transfer-encoding", "").lower():
        return None
    handler = proxyserver.connections.get(flow.client_conn.id) if proxyserver is not None else None
    if handler is None or handler.layer.context.options.store_streamed_bodies:
        return None
    server_io = handler.transports.get(flow.server_conn)
    client_io = handler.transports.get(flow.client_conn)
    if server_io is None or client_io is None:
        return None
    if not isinstance(server_io.reader, asyncio.StreamReader) or not isinstance(client_io.writer, asyncio.StreamWriter):
        return None
    layer = _http_layer(handler.layer)
    if layer is None:
        return None
    wrapper = layer.connections.get(flow.server_conn)
    upstream = wrapper.child_layer if isinstance(wrapper, HttpClient) else None
    downstream = layer.connections.get(flow.client_conn)
    stream = next((s for s in layer.streams.values() if s.flow is flow), None)
    if not (
        type(upstream) is Http1Client
        and isinstance(downstream, Http1Server)
        and isinstance(stream, HttpStream)
        and stream.server_state == stream.state_stream_response_body
        and downstream.response is flow.response
        and upstream.state == upstream.read_body
        and not len(upstream.buf)
        and type(upstream.body_reader) is H11ChunkedReader
    ):
        return None
    h11_reader = upstream.body_reader
    if h11_reader._bytes_in_chunk or h11_reader._bytes_to_discard or h11_reader._reading_trailer:
        return None
    return handler, server_io, client_io, h11_reader


def _http_layer(layer: Any) -> HttpLayer | None:
    """The HTTP layer under a client connection's root layer (modes, TLS, NextLayer wrappers between). A layer
    names its child `child_layer` (NextLayer: `layer`), or only hands its events on to it (regular mode's
    HttpProxy rebinds `_handle_event` to the child's `handle_event`)."""
    for _ in range(16):
        if isinstance(layer, HttpLayer):
            return layer
        child = getattr(layer, "child_layer", None) or getattr(layer, "layer", None)
        if child is None:
            handed_to = getattr(vars(layer).get("_handle_event"), "__self__", None)
            child = handed_to if handed_to is not layer else None
        if child is None:
            return None
        layer = child
    return None


class _RelayProtocol(asyncio.Protocol):
    """Stands in for mitmproxy's StreamReaderProtocol on the server socket while the body's middle runs."""

    def __init__(
        self, relay: BodyRelay, transport: Any, original: Any, client: Any, watchdog: Any, h11_reader: H11ChunkedReader
    ) -> None:
        self.h11_reader = h11_reader
        self.relay = relay
        self.transport = transport
        self.original = original
        self.writer = client
        self.client = client.transport
        self.watchdog = watchdog
        self.chunks = ChunkedReader()
        self.paused = False
        self.drain: asyncio.Task[None] | None = None  # while paused: waits for the client to take its bytes
        self.held: bytearray | None = None  # a two-step take-over's first step: what arrived, not yet read

    def data_received(self, data: bytes) -> None:
        self.watchdog.register_activity()
        if self.held is not None:
            self.held += data
            if not self.paused and len(self.held) > HIGH_WATER:
                self.paused = True
                self.transport.pause_reading()
            return
        pieces, rest = self.chunks.feed(data)
        if pieces:
            self._send(pieces)
        if rest is not None:
            self._give_back(rest)

    def _send(self, pieces: list[bytes]) -> None:
        stream = self.relay.stream
        frames: list[bytes] = []
        for piece in pieces:
            try:
                out = stream(piece)
            except Exception:  # mitmproxy's layer would log it and go on: so does the relay
                logger.exception("the stream callable failed on a relayed chunk")
                continue
            frames += [frame(chunk) for chunk in ((out,) if isinstance(out, bytes) else out) if chunk]
        client = self.client
        if not frames or client.is_closing():
            return
        client.write(frames[0] if len(frames) == 1 else b"".join(frames))
        if not self.paused and client.get_write_buffer_size() > HIGH_WATER:
            self.paused = True
            Tally.waited += 1
            self.transport.pause_reading()
            self.drain = asyncio.get_running_loop().create_task(self._resume_when_drained())

    async def _resume_when_drained(self) -> None:
        try:
            await self.writer.drain()
        except OSError:
            pass  # the client is gone: mitmproxy closes the server connection, connection_lost gives it back
        self.paused, self.drain = False, None
        if self.relay.running and not self.transport.is_closing():
            self.transport.resume_reading()

    def begin(self) -> None:
        """The second step: the relay runs from the boundary mitmproxy's reader stopped at, held bytes first."""
        held, self.held = self.held, None
        self._resume()  # paused by the holding: reads resume in a later turn of the loop, after these
        if held:
            self.data_received(bytes(held))

    def release(self) -> None:
        """No second step: the socket back to mitmproxy's reader, with the bytes held meanwhile."""
        held, self.held = self.held, None
        self._to_mitmproxy(bytes(held or b""))

    def _hand_back(self) -> None:
        if self.held is not None:  # still the first step
            if self.relay.holding is self:
                self.relay.holding = None
            self.release()
        else:
            self._give_back(self.chunks.held())

    def _give_back(self, rest: bytes) -> None:
        """The socket back to mitmproxy's reader, `rest` first: it reads on from the boundary the relay stopped at."""
        if not self.relay.running:
            return
        self.relay.running = False
        self.relay.ended = True
        # mitmproxy's reader goes on from where the relay's stands, mid-chunk included (a reset, a bad footer):
        # so its errors are word for word the ones it gives without the relay
        self.h11_reader._bytes_in_chunk, self.h11_reader._bytes_to_discard = self.chunks.inside()
        self._to_mitmproxy(rest)

    def _to_mitmproxy(self, rest: bytes) -> None:
        """mitmproxy's protocol back on the server socket, reading, `rest` first."""
        self.transport.set_protocol(self.original)
        self._resume()
        if rest:
            self.original.data_received(rest)

    def _resume(self) -> None:
        if self.paused:
            self.paused = False
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        self._hand_back()
        keep_open: bool | None = self.original.eof_received()
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self._hand_back()
        self.original.connection_lost(exc)

    def pause_writing(self) -> None:
        self.original.pause_writing()

    def resume_writing(self) -> None:
        self.original.resume_writing()
