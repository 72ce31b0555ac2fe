"""What an answer says about itself that the assembled message doesn't keep: the model and id the
upstream reported (its usage, counted the conventions' way on all three surfaces: assemble/usage.py)."""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.assemble.usage import Usage, usage_counts
from tapfix.proxy.exchange import Exchange

# `Usage` and `usage_counts` live in assemble/usage.py (the store's columns read them too); named here still
# for the modules that import them from telemetry.
__all__ = ["HEAD_BYTES", "Usage", "response_identity", "usage_counts"]
HEAD_BYTES = 16384  # a stream names its model and id in its first event; never read further


def response_identity(ex: Exchange) -> tuple[str | None, str | None]:
    """(model, id) as the upstream answered: a chat body or chunk's `model`/`id`, a Responses
    `response`, a Messages `message` (its `message_start` event in a stream)."""
    if ex.response is not None:
        body = ex.decoded_response if ex.decoded_response is not None else ex.response
        return _identity(_loads(body))
    head = bytearray()
    for chunk in ex.readable_chunks():
        head += chunk
        if len(head) >= HEAD_BYTES:
            break
    for line in bytes(head[:HEAD_BYTES]).splitlines():
        if line.startswith(b"data:"):
            model, ident = _identity(_loads(line[5:].strip()))
            if model is not None or ident is not None:
                return model, ident
    return None, None


def _identity(obj: Any) -> tuple[str | None, str | None]:
    if not isinstance(obj, dict):
        return None, None
    for key in ("response", "message"):  # Responses events and bodies nest it; Messages' message_start too
        inner = obj.get(key)
        if isinstance(inner, dict) and ("model" in inner or "id" in inner):
            obj = inner
            break
    model, ident = obj.get("model"), obj.get("id")
    return (model if isinstance(model, str) else None), (ident if isinstance(ident, str) else None)


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
