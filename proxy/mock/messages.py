"""The mock's Anthropic Messages wire format (`POST /v1/messages`), streamed and not.

Event order as Anthropic (and vLLM/SGLang/llama.cpp's `/v1/messages`) sends it: `message_start`
(the message with empty content and the input usage), one `ping`, then per content block
`content_block_start` → `content_block_delta` × n (`thinking_delta`, `text_delta`,
`input_json_delta.partial_json`) → `content_block_stop`, then `message_delta` (`stop_reason`,
output usage) and `message_stop`. Each event is `event: NAME\\ndata: {compact JSON}\\n\\n`.
"""

from __future__ import annotations

import json
from typing import Any

from tapfix.proxy.mock.chat import dumps
from tapfix.proxy.mock.surface_script import Part, Script

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _event(kind: str, body: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + dumps({"type": kind, **body}) + b"\n\n"


def _tool_id(part: Part) -> str:
    return "toolu_" + part.call_id[-24:]


def _block(part: Part, done: bool) -> dict[str, Any]:
    text = "".join(part.pieces) if done else ""
    if part.kind == "reasoning":
        return {"type": "thinking", "thinking": text, "signature": ""}
    if part.kind == "text":
        return {"type": "text", "text": text}
    value: Any = {}
    if done:
        try:
            value = json.loads(text) if text else {}
        except ValueError:
            value = text  # a broken call: a non-streamed answer carries the raw text
    return {"type": "tool_use", "id": _tool_id(part), "name": part.name, "input": value}


def _message(script: Script, digest: str, model: str, prompt_tokens: int, done: bool) -> dict[str, Any]:
    return {
        "id": "msg_" + digest[:24],
        "type": "message",
        "role": "assistant",
        "content": [_block(p, True) for p in script.parts] if done else [],
        "model": model,
        "stop_reason": STOP_REASONS.get(script.finish, "end_turn") if done else None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": script.completion_tokens if done else 0},
    }


def messages_events(script: Script, digest: str, model: str, prompt_tokens: int) -> list[bytes]:
    events = [
        _event("message_start", {"message": _message(script, digest, model, prompt_tokens, False)}),
        _event("ping", {}),
    ]
    for index, part in enumerate(script.parts):
        events.append(_event("content_block_start", {"index": index, "content_block": _block(part, False)}))
        for piece in part.pieces:
            if part.kind == "reasoning":
                delta = {"type": "thinking_delta", "thinking": piece}
            elif part.kind == "text":
                delta = {"type": "text_delta", "text": piece}
            else:
                delta = {"type": "input_json_delta", "partial_json": piece}
            events.append(_event("content_block_delta", {"index": index, "delta": delta}))
        events.append(_event("content_block_stop", {"index": index}))
    stop = STOP_REASONS.get(script.finish, "end_turn")
    events.append(
        _event(
            "message_delta",
            {
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": script.completion_tokens},
            },
        )
    )
    events.append(_event("message_stop", {}))
    return events


def messages_body(script: Script, digest: str, model: str, prompt_tokens: int) -> bytes:
    return dumps(_message(script, digest, model, prompt_tokens, True))


def messages_error(message: str, status: int) -> bytes:
    kind = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    return dumps({"type": "error", "error": {"type": kind, "message": message}})
