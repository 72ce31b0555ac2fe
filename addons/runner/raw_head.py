"""Keep the bytes of a request head mitmproxy rejects, for the malformed-request record.

mitmproxy 12 answers a head it can't parse (a bad request line, a header line without a colon) with
its HTML 400, logs one line and closes: no flow, no hook sees the bytes, and the head's lines are
already gone from the buffer by then. This wrapper around the HTTP/1 server's `read_headers` keeps,
on the client connection, the first 4 KiB of what arrived, what mitmproxy answered and, when no flow
follows, mitmproxy's message. addons/malformed.py turns that into the record. Installed once, by the
runner; a head that parses costs one 4 KiB copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from mitmproxy.proxy import commands, events
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.utils import human

REJECTED_ATTR = "_tapfix_rejected_head"
HEAD_BYTES = 4096
_installed = False


@dataclass
class RejectedHead:
    data: bytes  # the first HEAD_BYTES of the request as it arrived
    sent: bytes  # what mitmproxy answered (its 400), exactly
    message: str | None = None  # mitmproxy's message when the head did not parse (then there is no flow)


def install() -> None:
    global _installed
    if _installed:
        return
    original = _http1.Http1Server.read_headers

    def watched(self: _http1.Http1Server, event: events.DataReceived) -> CommandGenerator[None]:
        data = bytes(self.buf._data[:HEAD_BYTES])
        for command in original(self, event):
            if isinstance(command, commands.SendData) and command.connection is self.conn:
                # read_headers itself sends only the 400 for a head it rejects, which ends the connection:
                # one per connection (an outer call, reading the request before, must not overwrite it)
                if getattr(self.conn, REJECTED_ATTR, None) is None:
                    setattr(self.conn, REJECTED_ATTR, RejectedHead(data, command.data))
            elif isinstance(command, commands.Log) and self.request is None:
                rejected = getattr(self.conn, REJECTED_ATTR, None)
                if rejected is not None:
                    rejected.message = command.message.removeprefix(f"{human.format_address(self.conn.peername)}: ")
            yield command

    def read_headers(self: _http1.Http1Server, event: events.ConnectionEvent) -> CommandGenerator[None]:
        if isinstance(event, events.DataReceived) and self.request is None and self.buf:
            return watched(self, event)
        return original(self, event)

    _http1.Http1Server.read_headers = read_headers  # type: ignore[method-assign]  # patching is the point
    _installed = True
