"""What a later attempt sends and how its answer is judged, pure: shared by the streamed attempt loop
(addons/attempts.py) and the whole-body one (addons/regenerate_body.py).

A later attempt goes upstream with the headers mitmproxy forwarded for attempt 1, less each hop's own
(the attempt's client frames its own request). While the client waits for it, a streaming client gets a
`: keep-alive` comment now and then (an SSE comment every client ignores).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "content-length",
        "host",
    }
)
KEEPALIVE: Final = b": keep-alive\n\n"
# How often a pending attempt looks whether the client left (mitmproxy marks its connection closed), so a
# cancelled attempt stops within it.
CLOSE_CHECK_S: Final = 0.2


def unspliceable(status: int, content_type: str) -> str | None:
    """Why an upstream answer is no event stream the pipeline can splice (None: it is one)."""
    if status != 200:
        return f"the upstream answered {status}"
    if "text/event-stream" not in content_type:
        return f"the upstream answered {content_type or 'no content type'}, not an event stream"
    return None


def forwardable(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Headers without the hop-by-hop ones and Host."""
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


def header(headers: Iterable[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)
