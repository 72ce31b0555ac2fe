"""A response (Chat Completions, Responses, Messages) folded into one assembled message.

This is the dispatcher: it asks `tapfix.proxy.surfaces` which surface a body speaks and hands it
to that surface's fold (`chat`, `evented`); the folds never call back here.
"""

from __future__ import annotations

import orjson
from tapfix.proxy.assemble.chat import assemble_chat_json, assemble_chat_sse
from tapfix.proxy.assemble.evented import assemble_evented_json, assemble_evented_sse
from tapfix.proxy.assemble.result import Assembled
from tapfix.proxy.surfaces import api_surface, evented_body, evented_stream


def assemble_sse(body: bytes | list[bytes], path: str | None = None) -> Assembled:
    """`path` picks the surface (Responses, Messages); without it the stream's first bytes do."""
    chunks = [body] if isinstance(body, bytes) else body
    surface = evented_stream(path, chunks[0] if chunks else b"")
    if surface is not None:
        return assemble_evented_sse(surface, chunks)
    return assemble_chat_sse(chunks)


def assemble_json(body: bytes, path: str | None = None) -> Assembled:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Assembled(malformed_events=1)
    if not isinstance(obj, dict):
        return Assembled()
    surface = evented_body(path, obj)
    # An error body in the surface's own shape (Messages' `{"type": "error", ...}`): the chat fold reads it.
    if surface is not None and not api_surface(surface).error_shaped(obj):
        return assemble_evented_json(surface, obj)
    return assemble_chat_json(obj)


def assemble(body: bytes, content_type: str, path: str | None = None) -> Assembled:
    """One message from a response body; `path` (the request path) names the API surface."""
    if "text/event-stream" in content_type:
        return assemble_sse(body, path)
    if "json" in content_type or body[:1] in (b"{", b"["):
        return assemble_json(body, path)
    return Assembled()


__all__ = ["Assembled", "assemble", "assemble_json", "assemble_sse"]
