"""The engine's own error, for the `error` column: from an HTTP error body or an in-stream error event.

Read from the upstream's bytes, never from what the client received: when tapfix replaces a broken
stream's end with its own retryable error event, the store still says what the engine reported.
Only an answer that really came from the upstream counts: tapfix's own answers (an unknown model, an
unreachable upstream, …: flag `tapfix_answered`) have no upstream first byte, and are never read here.
"""

from __future__ import annotations

import logging

import orjson
from tapfix.proxy.assemble import Assembled, assemble, assemble_sse
from tapfix.proxy.assemble.result import engine_error
from tapfix.proxy.exchange import Exchange

log = logging.getLogger("tapfix.store")
TEXT_LIMIT = 4000  # an error page's text kept as the message (`captures export --response` has all of it)


def upstream_view(ex: Exchange, assembled: Assembled, client: bytes, upstream: bytes) -> Assembled | None:
    """The upstream's answer assembled: `assembled` (what the client received) when nothing differed,
    else the upstream's own bytes, decoded when they came compressed; None when they can't be read."""
    if client is upstream or client == upstream:
        return assembled
    try:
        path = ex.path.split("?", 1)[0]
        if ex.response is None and ex.response_chunks and "event-stream" in ex.content_type:
            return assemble_sse(ex.readable_chunks(), path)
        return assemble(_decoded(ex, upstream), ex.content_type, path)
    except Exception as e:  # noqa: BLE001 - a capture is never lost to its answer's shape
        log.warning("assembling the upstream's answer failed: %s: %s", type(e).__name__, e)
        return None


def upstream_error(ex: Exchange, upstream_answer: Assembled | None, upstream: bytes) -> str | None:
    """JSON text of the engine's error object, or None. `upstream_answer` is `upstream_view`'s."""
    if ex.tapfix_answered or ex.response_started_at is None or ex.status is None or upstream_answer is None:
        return None
    try:
        error = engine_error(upstream_answer.error)
        status = ex.upstream_status if ex.upstream_status is not None else ex.status
        if error is None and status >= 400:  # the engine's status: a 502 tapfix sent is no engine error
            error = _error_page(ex, upstream)
        return None if error is None else orjson.dumps(error).decode()
    except Exception as e:  # noqa: BLE001 - a capture is never lost to its error's shape
        log.warning("reading the upstream's error failed: %s: %s", type(e).__name__, e)
        return None


def _decoded(ex: Exchange, upstream: bytes) -> bytes:
    """The upstream's body as text: its decoded form when it came compressed."""
    if ex.decoded_response is not None:
        return ex.decoded_response
    return upstream if ex.decoded_chunks is None else b"".join(ex.decoded_chunks)


def _error_page(ex: Exchange, body: bytes) -> dict[str, str] | None:
    """An error status whose body has no error object (an HTML page, FastAPI's `{"detail": ...}`):
    the body's text is the message."""
    decoded = ex.decoded_response is not None or ex.decoded_chunks is not None
    body = _decoded(ex, body)
    encoded = not decoded and any(
        k.lower() == "content-encoding" and v.strip().lower() not in ("", "identity") for k, v in ex.response_headers
    )
    text = body.decode("utf-8", errors="replace").strip() if body and not encoded else ""
    if not text:
        return None
    return {"message": text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "…"}
