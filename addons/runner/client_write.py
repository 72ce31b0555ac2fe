"""Send more of a streamed response to its client from an async hook: a later attempt's bytes (issue 34).

mitmproxy streams only what arrives from the server connection (docs/regenerate.md, "Where a new attempt
can plug in"). A later attempt of a regenerated stream is read by tapfix's own upstream client while the
flow's `response` (or `error`) hook is awaited, and its bytes must reach the client before mitmproxy ends
the response. This injects them as an event, as mitmproxy's own `inject.websocket` does, and a small
wrapper around the HTTP layer's event handler routes it straight to the client connection's HTTP/1 or
HTTP/2 layer as response data of the flow's stream: so they are framed (chunked, or DATA frames) and
encrypted like every other byte of the response. The flow's stream itself is paused in the hook and is
not involved. Installed once, by the runner; every other event costs one `isinstance`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mitmproxy import http
from mitmproxy.proxy import events
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import HttpLayer
from mitmproxy.proxy.layers.http._events import ResponseData

_installed = False


@dataclass
class ToClient(events.MessageInjected[bytes]):
    """Bytes for the client of `flow`'s response (`message`), sent as the response's next data."""


def install() -> None:
    global _installed
    if _installed:
        return
    original = HttpLayer._handle_event

    def to_client(self: HttpLayer, event: ToClient) -> CommandGenerator[None]:
        stream = next((s for s in self.streams.values() if s.flow is event.flow), None)
        conn = self.connections.get(self.context.client)
        if stream is not None and conn is not None and event.message:
            yield from self.event_to_child(conn, ResponseData(stream.stream_id, event.message))

    def _handle_event(self: HttpLayer, event: events.Event) -> Any:
        if isinstance(event, ToClient):
            return to_client(self, event)
        return original(self, event)

    HttpLayer._handle_event = _handle_event  # type: ignore[method-assign]  # patching mitmproxy's method is the point
    _installed = True


class ClientWriter:
    """Writes to one flow's client through its connection handler (mitmproxy's `proxyserver` addon)."""

    def __init__(self, flow: http.HTTPFlow, proxyserver: Any) -> None:
        self.flow = flow
        self.proxyserver = proxyserver

    @property
    def connected(self) -> bool:
        return bool(self.flow.client_conn.connected)

    async def send(self, data: bytes | list[bytes]) -> None:
        """Send `data` as the response's next bytes and wait until the socket takes them (backpressure)."""
        if isinstance(data, list):
            data = b"".join(data)
        handler = self.proxyserver.connections.get(self.flow.client_conn.id) if data else None
        if handler is None:
            return
        await handler.server_event(ToClient(self.flow, data))
        await handler.drain_writers()
