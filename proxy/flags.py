"""Flags computed for every captured response (filterable with `captures list --flag`)."""

from __future__ import annotations

from .assemble import Assembled


def response_flags(assembled: Assembled, status: int | None, stream: bool) -> set[str]:
    flags: set[str] = set()
    if status is None or status >= 400 or assembled.error is not None:
        return flags
    if not assembled.content.strip() and not assembled.tool_calls and not assembled.reasoning.strip():
        flags.add("empty_answer")
    if assembled.finish_reason == "length":
        flags.add("runaway_length")
    if stream and not assembled.done and assembled.events:
        flags.add("stream_incomplete")
    return flags
