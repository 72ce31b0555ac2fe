"""Token counts from an answer's usage, on all three surfaces (chat, Responses, Messages): one reading of
them for the store's columns (store/exchange_row.py), the telemetry (telemetry/answer.py) and the views."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    input: int | None = None
    output: int | None = None
    reasoning: int | None = None
    cached: int | None = None
    cache_write: int | None = None  # Messages' cache_creation_input_tokens


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
