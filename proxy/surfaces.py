"""Which API surface an exchange speaks: from its request path, a stream's first bytes, or a body.

Every stage that reads or rewrites a body needs to know the wire format, and they must agree: the
router fills sampling per surface, the stream owner picks the repair stage, the writer assembles and
flags, all by the same answer. The request path decides when it names a surface; the bytes decide
only when no path is known (a stored body, a replayed one) or the path names none.
"""

from __future__ import annotations

import re
from typing import Any, Literal

Surface = Literal["chat", "completions", "responses", "messages"]
# The surfaces whose streams are named events (`event: NAME`) and whose bodies are not chat-shaped.
Evented = Literal["responses", "messages"]

_PATH = re.compile(r"(?:^|/)(chat/completions|completions|responses|messages)/?$")
_BY_PATH: dict[str, Surface] = {
    "chat/completions": "chat",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
}
_SNIFF_BYTES = 4096


def surface_for(path: str) -> Surface | None:
    """Which API a request path is, with or without `/v1` and with any prefix before it."""
    m = _PATH.search(path.split("?", 1)[0])
    return _BY_PATH[m.group(1)] if m else None


def is_inference(path: str) -> bool:
    """A request to one of the surfaces (not `/v1/models`, embeddings, health, ...)."""
    return surface_for(path) is not None


def sniff_stream(head: bytes) -> Evented | None:
    """`responses` or `messages` from the first bytes of an SSE stream or JSON body, else None."""
    head = head[:_SNIFF_BYTES]
    if b"event: response." in head or b'"type":"response.' in head or b'"type": "response.' in head:
        return "responses"
    for marker in (b"message_start", b"content_block_start"):
        if b"event: " + marker in head or b'"type":"' + marker in head or b'"type": "' + marker in head:
            return "messages"
    return None


def sniff_body(obj: Any) -> Evented | None:
    """`responses` or `messages` from a parsed response body, else None (chat-shaped or unknown)."""
    if not isinstance(obj, dict):
        return None
    if obj.get("object") == "response":
        return "responses"
    if obj.get("type") == "message" and isinstance(obj.get("content"), list):
        return "messages"
    return None


def evented_stream(path: str | None, head: bytes) -> Evented | None:
    """The evented surface of a response stream, None when it is chat-shaped (chat, legacy completions).

    A path that names a surface decides; without one, the stream's first bytes do.
    """
    if path is not None:
        surface = surface_for(path)
        if surface == "responses" or surface == "messages":
            return surface
        if surface is not None:
            return None
    return sniff_stream(head)


def evented_body(path: str | None, obj: Any) -> Evented | None:
    """The evented surface of a parsed response body, None when it is chat-shaped.

    A Responses or Messages path decides; otherwise (a chat path too) the body's own shape does.
    """
    if path is not None:
        surface = surface_for(path)
        if surface == "responses" or surface == "messages":
            return surface
    return sniff_body(obj)
