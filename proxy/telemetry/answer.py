"""What an answer says about itself that the assembled message doesn't keep: the model and id the
upstream reported, and its usage counted the conventions' way, on all three surfaces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from tapfix.proxy.exchange import Exchange

HEAD_BYTES = 16384  # a stream names its model and id in its first event; never read further


@dataclass(frozen=True, slots=True)
class Usage:
    input: int | None = None
    output: int | None = None
    reasoning: int | None = None
    cached: int | None = None
    cache_write: int | None = None  # Messages' cache_creation_input_tokens


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


def usage_counts(usage: dict[str, Any] | None) -> Usage:
    """Tokens in, out, of reasoning and read from cache, from a chat, Responses or Messages usage.

    Messages counts cache reads and writes apart from `input_tokens`; the conventions' input count
    includes them, so they are added back."""
    if not isinstance(usage, dict):
        return Usage()
    if "prompt_tokens" in usage or "completion_tokens" in usage:  # chat, legacy completions
        return Usage(
            _int(usage.get("prompt_tokens")),
            _int(usage.get("completion_tokens")),
            _int(_get(usage, "completion_tokens_details", "reasoning_tokens")),
            _int(_get(usage, "prompt_tokens_details", "cached_tokens")),
        )
    cache_read = _int(usage.get("cache_read_input_tokens"))
    input_tokens = _int(usage.get("input_tokens"))
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:  # Messages
        if input_tokens is not None:
            input_tokens += (cache_read or 0) + (_int(usage.get("cache_creation_input_tokens")) or 0)
        cache_write = _int(usage.get("cache_creation_input_tokens"))
        return Usage(input_tokens, _int(usage.get("output_tokens")), None, cache_read, cache_write)
    return Usage(  # Responses (and Messages without cache fields)
        input_tokens,
        _int(usage.get("output_tokens")),
        _int(_get(usage, "output_tokens_details", "reasoning_tokens")),
        _int(_get(usage, "input_tokens_details", "cached_tokens")),
    )


def _get(obj: dict[str, Any], key: str, inner: str) -> Any:
    nested = obj.get(key)
    return nested.get(inner) if isinstance(nested, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
