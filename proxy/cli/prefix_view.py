"""How `captures show`, `captures tail` and the browser say where a turn's prompt stopped matching the one
before (`exchanges.prefix_break`, store/prefix_breaks.py), beside the prompt tokens the engine reused."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tapfix.proxy.surfaces import is_inference
from tapfix.proxy.telemetry.answer import usage_counts

_CACHE_N = re.compile(rb'"cache_n"\s*:\s*(\d+)')


def cached_prompt_tokens(capture: dict[str, Any], response: Callable[[], bytes] | None = None) -> int | None:
    """Prompt tokens the engine served from its cache, where it says: `usage.prompt_tokens_details.cached_tokens`
    (vLLM, SGLang, OpenAI), Responses' `input_tokens_details`, Messages' `cache_read_input_tokens`, else
    llama.cpp's `timings.cache_n` in the response body (its last one: a stream's final chunk), read only then."""
    usage = capture.get("usage")
    cached = usage_counts(usage if isinstance(usage, dict) else None).cached
    if cached is None and response is not None and is_inference(capture.get("path") or ""):
        found = _CACHE_N.findall(response())
        cached = int(found[-1]) if found else None
    return cached


def prefix_line(capture: dict[str, Any], cached: int | None) -> str | None:
    """One line for `captures show`; None for what is no turn (not an inference request)."""
    if not is_inference(capture.get("path") or ""):
        return None
    found = capture.get("prefix_break")
    tokens = ""
    if cached is not None:
        prompt = capture.get("prompt_tokens")
        tokens = f"; {cached:,} of {prompt:,} prompt tokens from cache" if prompt else f"; {cached:,} tokens from cache"
    if not isinstance(found, dict):
        return f"  prefix: no break (extends the previous request of its thread, or starts one){tokens}"
    why = found.get("reason") or found.get("cause")
    return (
        f"  prefix break at {found.get('path')}, byte {found.get('offset')}: {why}"
        f" ({found.get('cause')}; previous: {found.get('previous')}){tokens}"
    )


def excerpt_lines(capture: dict[str, Any]) -> list[str]:
    found = capture.get("prefix_break")
    if not isinstance(found, dict):
        return []
    return [f"    was: {found.get('old')!r}", f"    now: {found.get('new')!r}"]


def tail_mark(row: dict[str, Any]) -> str:
    """A short mark after a `captures tail` line: the break's cause."""
    found = row.get("prefix_break")
    return f"  ✂ {found.get('cause')}" if isinstance(found, dict) else ""
