"""Flags computed for every captured response (filterable with `captures list --flag`).

Called by the store writer for every capture, so everything here is cheap and never raises: a
detector that fails is logged and skipped, it never costs the capture. `tools` (the request's
tool list, `Exchange.tools`) enables `invalid_tool_call` against the schemas; `request_body` (the
client's request bytes) tells whether the conversation is in Latin script, so `script_drift` also
catches answers that are CJK from their first word.
"""

from __future__ import annotations

import logging
from typing import Any

from tapfix.proxy.assemble.degeneration import (
    has_cjk,
    repetition_loop,
    request_language,
    script_drift,
    tool_call_problems,
)
from tapfix.proxy.assemble.result import Assembled

log = logging.getLogger("tapfix.flags")


def response_flags(
    assembled: Assembled,
    status: int | None,
    stream: bool,
    *,
    tools: list[Any] | None = None,
    request_body: bytes | None = None,
) -> set[str]:
    """The answer's flags. With several choices (`n > 1`) each is judged alone, its flags kept in its
    `Assembled.flags` (the store's `choices` rows), and the answer's flags are their union."""
    if status is None or status >= 400 or assembled.error is not None:
        return set()
    if not assembled.choices:
        assembled.flags = _choice_flags(assembled, stream, tools, request_body)
        return set(assembled.flags)
    union: set[str] = set()
    for choice in assembled.choices:
        choice.flags = _choice_flags(choice, stream, tools, request_body)
        union |= choice.flags
    return union


def _choice_flags(assembled: Assembled, stream: bool, tools: list[Any] | None, request_body: bytes | None) -> set[str]:
    flags: set[str] = set()
    if not assembled.content.strip() and not assembled.tool_calls and not assembled.reasoning.strip():
        flags.add("empty_answer")
    if assembled.finish_reason in ("length", "max_tokens", "max_output_tokens"):  # chat, messages, responses
        flags.add("runaway_length")
    if stream and not assembled.done and assembled.events:
        flags.add("stream_incomplete")
    try:
        flags |= degeneration_flags(assembled, tools=tools, request_body=request_body)
    except Exception as e:  # noqa: BLE001 - a flag is never worth a lost capture
        log.warning("degeneration detectors failed: %s: %s", type(e).__name__, e)
    return flags


def degeneration_flags(
    assembled: Assembled, *, tools: list[Any] | None = None, request_body: bytes | None = None
) -> set[str]:
    """script_drift, repetition_loop and invalid_tool_call for one assembled answer."""
    flags: set[str] = set()
    texts = [t for t in (assembled.content, assembled.reasoning) if t]
    if texts:
        if any(script_drift(t) for t in texts) or (
            request_body
            and any(has_cjk(t) for t in texts)  # parse the request only when it matters
            and request_language(request_body)
            and any(script_drift(t, conversation_latin=True) for t in texts)
        ):
            flags.add("script_drift")
        if any(repetition_loop(t) for t in texts):
            flags.add("repetition_loop")
    if assembled.tool_calls and tool_call_problems(assembled.tool_calls, tools):
        flags.add("invalid_tool_call")
    return flags
