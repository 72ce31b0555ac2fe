"""Let an SSE client see a clean error event when the upstream resets mid-stream.

mitmproxy has no hook to write to the client after an upstream error: once the server connection
breaks it closes the client's connection, and the agent sees a truncated chunked body (a transport
error, which some agents don't retry). tapfix wants to first flush what it held back and send an SSE
`server_error` event, which every agent retries (clients.md §8). The error hook stores those bytes on
the client connection; this small wrapper around mitmproxy's HTTP/1 server writes them (and the
chunked terminator) before mitmproxy closes the connection. Installed once, by the runner.

Before any response head went out, an error ends with mitmproxy's HTML error page instead; a hook
that stores a whole response under `REPLY_ATTR` (the shutdown grace's JSON 503) has it sent instead.
"""

from __future__ import annotations

from mitmproxy.connection import ConnectionState
from mitmproxy.proxy import commands
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._events import HttpEvent, ResponseProtocolError
from tapfix.proxy.chunked import frame

TAIL_ATTR = "_tapfix_tail"
REPLY_ATTR = "_tapfix_reply"
# ex.extra: an error hook put a whole answer in `flow.response` (the next route's, addons/route_fallback.py); the
# stream owner's error hook runs the body stages on it and stores it under REPLY_ATTR
REPLY_AFTER_ERROR = "reply_after_error"
_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    original = _http1.Http1Server.send

    def send_tail_first(self: _http1.Http1Server, event: HttpEvent, tail: bytes) -> CommandGenerator[None]:
        setattr(self.conn, TAIL_ATTR, None)
        response = self.response
        if response is not None and "chunked" in response.headers.get("transfer-encoding", "").lower():
            yield commands.SendData(self.conn, frame(tail) + b"0\r\n\r\n")
        else:
            yield commands.SendData(self.conn, tail)
        yield from original(self, event)

    def send_reply(self: _http1.Http1Server, reply: bytes) -> CommandGenerator[None]:
        setattr(self.conn, REPLY_ATTR, None)
        yield commands.SendData(self.conn, reply)
        yield commands.CloseConnection(self.conn)

    def send(self: _http1.Http1Server, event: HttpEvent) -> CommandGenerator[None]:
        # Not a generator itself: the per-chunk path stays mitmproxy's own, one isinstance away.
        if isinstance(event, ResponseProtocolError) and self.conn.state & ConnectionState.CAN_WRITE:
            if self.response is not None:
                tail = getattr(self.conn, TAIL_ATTR, None)
                if tail is not None:  # b"": the stream's end already went out, only the body's end is due
                    return send_tail_first(self, event, tail)
            elif reply := getattr(self.conn, REPLY_ATTR, None):
                return send_reply(self, reply)
        return original(self, event)

    _http1.Http1Server.send = send  # type: ignore[method-assign]  # patching mitmproxy's method is the point
    _installed = True
