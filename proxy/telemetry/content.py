"""Prompts and answers in the GenAI conventions' message form, for a user who opted in to content.

`gen_ai.input.messages` / `gen_ai.output.messages` / `gen_ai.system_instructions` hold JSON arrays
of `{role, parts: [{type, ...}]}` whatever the surface, so a receiver renders chat, Responses and
Messages turns alike. Built on the writer thread, with every secret the store would hide redacted
(`store.redact.redact_content`: the exchange's own credential header values wherever they appear,
key-looking values, bearer credentials, secret-named fields, secret URL query keys), and only when
bodies are stored: `--no-bodies` wins over any content mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.store.redact import redact_content
from tapfix.proxy.surfaces import api_surface


@dataclass(frozen=True, slots=True)
class TurnContent:
    input_messages: str  # JSON, redacted
    output_messages: str
    system_instructions: str | None


def turn_content(
    surface: str, body: dict[str, Any], assembled: Assembled | None, secrets: tuple[str, ...] = ()
) -> TurnContent:
    api = api_surface(surface)
    system = _parts(body.get(api.instructions)) if api.instructions is not None else []
    if api.item_turns:
        raw = body.get(api.conversation or "")
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw if isinstance(raw, list) else []
        messages = [_item(i) for i in items if isinstance(i, dict)]
    elif api.prompt_only:
        messages = [{"role": "user", "parts": _parts(body.get("prompt"))}]
    else:
        messages = [_message(m) for m in body.get("messages") or [] if isinstance(m, dict)]
    return TurnContent(
        _dump(messages, secrets), _dump(_output(assembled), secrets), _dump(system, secrets) if system else None
    )


def _dump(value: Any, secrets: tuple[str, ...]) -> str:
    return redact_content(orjson.dumps(value).decode(), secrets)


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}]
    if not isinstance(content, list):
        return []
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            parts.append({"type": "text", "content": part})
        elif isinstance(part, dict):
            parts.append(_part(part))
    return parts


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text") or "text" in part:
        return {"type": "text", "content": part.get("text", "")}
    if kind == "tool_use":
        return {"type": "tool_call", "id": part.get("id"), "name": part.get("name"), "arguments": part.get("input")}
    if kind == "tool_result":
        return {"type": "tool_call_response", "id": part.get("tool_use_id"), "response": part.get("content")}
    return {"type": str(kind or "unknown")}  # images and files: their kind, not their bytes


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A chat or Messages message."""
    role = m.get("role") or "user"
    parts = _parts(m.get("content"))
    for call in m.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function")
            fn = function if isinstance(function, dict) else {}
            parts.append(
                {"type": "tool_call", "id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}
            )
    if role == "tool":
        return {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": m.get("tool_call_id"), "response": m.get("content")}],
        }
    return {"role": role, "parts": parts}


def _item(item: dict[str, Any]) -> dict[str, Any]:
    """A Responses input item."""
    kind = item.get("type")
    if kind == "function_call":
        call = {
            "type": "tool_call",
            "id": item.get("call_id"),
            "name": item.get("name"),
            "arguments": item.get("arguments"),
        }
        return {"role": "assistant", "parts": [call]}
    if kind == "function_call_output":
        return {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": item.get("call_id"), "response": item.get("output")}],
        }
    return {"role": item.get("role") or "user", "parts": _parts(item.get("content"))}


def _output(assembled: Assembled | None) -> list[dict[str, Any]]:
    if assembled is None:
        return []
    out = []
    for choice in assembled.choices or [assembled]:
        parts: list[dict[str, Any]] = []
        if choice.reasoning:
            parts.append({"type": "reasoning", "content": choice.reasoning})
        if choice.content:
            parts.append({"type": "text", "content": choice.content})
        for call in choice.tool_calls:
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": call.get("name"),
                    "arguments": call.get("arguments"),
                }
            )
        out.append({"role": "assistant", "parts": parts, "finish_reason": choice.finish_reason or ""})
    return out
