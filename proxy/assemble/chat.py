"""Assemble what the client saw: a streamed or plain response body → one message.

Runs in the writer thread, off the event loop. Accumulates tool calls strictly by index, as a
spec-following client does, so the stored message is what a correct client would have built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.sse import SSESplitter, event_data
from tapfix.proxy.surfaces import evented_body, evented_stream


@dataclass
class Assembled:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: Any = None
    events: int = 0
    malformed_events: int = 0
    first_token_chunk: int | None = None  # index of the input chunk that completed the first token event
    done: bool = False
    # Text arrives in thousands of small deltas: collect pieces and join once (`+=` on an attribute
    # copies the whole string every time, which made a 1 MB answer cost seconds of writer CPU).
    _parts: dict[str, list[str]] = field(default_factory=dict, repr=False, compare=False)

    def append(self, key: str, text: str) -> None:
        parts = self._parts.get(key)
        if parts is None:
            self._parts[key] = [text]
        else:
            parts.append(text)

    def join_parts(self) -> Assembled:
        for key, parts in self._parts.items():
            setattr(self, key, getattr(self, key) + "".join(parts))
        self._parts.clear()
        return self

    def as_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "error": self.error,
            "done": self.done,
        }


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", 0)
    if not isinstance(index, int):
        index = 0
    call = calls.setdefault(index, {"id": None, "name": "", "arguments": ""})
    if delta.get("id"):
        call["id"] = call["id"] or delta["id"]
    function = delta.get("function") or {}
    if function.get("name"):
        call["name"] += function["name"]
    arguments = function.get("arguments")
    if arguments is not None:
        call.setdefault("_parts", []).append(
            arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode())


def _joined(call: dict[str, Any]) -> dict[str, Any]:
    parts = call.pop("_parts", None)
    if parts:
        call["arguments"] += "".join(parts)
    return call


def _apply_choice(result: Assembled, calls: dict[int, dict[str, Any]], choice: dict[str, Any]) -> bool:
    """Fold one streamed choice into the message; True if it carried a token."""
    delta = choice.get("delta") or choice.get("message") or {}
    token = False
    if isinstance(delta, dict):
        if isinstance(delta.get("content"), str) and delta["content"]:
            result.append("content", delta["content"])
            token = True
        for key in ("reasoning", "reasoning_content"):
            if isinstance(delta.get(key), str) and delta[key]:
                result.append("reasoning", delta[key])
                token = True
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                _merge_tool_call(calls, call)
                token = True
    if "text" in choice and isinstance(choice["text"], str) and choice["text"]:  # legacy completions
        result.append("content", choice["text"])
        token = True
    if choice.get("finish_reason"):
        result.finish_reason = choice["finish_reason"]
    return token


def assemble_sse(body: bytes | list[bytes], path: str | None = None) -> Assembled:
    """`path` picks the surface (Responses, Messages); without it the stream's first bytes do."""
    chunks = [body] if isinstance(body, bytes) else body
    surface = evented_stream(path, chunks[0] if chunks else b"")
    if surface is not None:
        from tapfix.proxy.assemble.evented import assemble_surface_sse

        return assemble_surface_sse(surface, chunks)
    result = Assembled()
    calls: dict[int, dict[str, Any]] = {}
    splitter = SSESplitter()
    for chunk_index, events in enumerate([*(splitter.feed(c) for c in chunks), splitter.flush()]):
        for event in events:
            _fold_event(result, calls, event, min(chunk_index, len(chunks) - 1))
    result.tool_calls = [_joined(calls[i]) for i in sorted(calls)]
    return result.join_parts()


def _fold_event(result: Assembled, calls: dict[int, dict[str, Any]], event: bytes, chunk_index: int) -> None:
    data = event_data(event)
    if data is None:
        return
    result.events += 1
    if data[:1] != b"{" and data.strip() == b"[DONE]":
        result.done = True
        return
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        result.malformed_events += 1
        return
    if not isinstance(obj, dict):
        result.malformed_events += 1
        return
    choices = obj.get("choices")
    # Most events are one choice carrying one content delta: fold those without the general walk
    # (this runs in the writer for every chunk of every stream).
    if choices.__class__ is list and len(choices) == 1 and not obj.get("usage") and "error" not in obj:
        choice = choices[0]
        if choice.__class__ is dict and not choice.get("finish_reason"):
            delta = choice.get("delta")
            if delta.__class__ is dict and len(delta) == 1:
                text = delta.get("content")
                if text.__class__ is str:
                    if text:
                        result.append("content", text)
                        if result.first_token_chunk is None:
                            result.first_token_chunk = chunk_index
                    return
    if "error" in obj:
        result.error = obj["error"]
    if obj.get("usage"):
        result.usage = obj["usage"]
    for choice in choices or ():
        if isinstance(choice, dict) and _apply_choice(result, calls, choice):
            if result.first_token_chunk is None:
                result.first_token_chunk = chunk_index


def assemble_json(body: bytes, path: str | None = None) -> Assembled:
    result = Assembled()
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        result.malformed_events = 1
        return result
    if not isinstance(obj, dict):
        return result
    from tapfix.proxy.assemble.evented import assemble_surface_json

    surface = evented_body(path, obj)
    if surface is not None and (obj.get("type") != "error" or surface != "messages"):
        return assemble_surface_json(surface, obj)
    result.error = obj.get("error")
    result.usage = obj.get("usage")
    calls: dict[int, dict[str, Any]] = {}
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = choice.get("message") or {}
        if isinstance(message, dict):
            for i, call in enumerate(message.get("tool_calls") or ()):
                if isinstance(call, dict):
                    call = {**call, "index": call.get("index", i)}
                    _merge_tool_call(calls, call)
        _apply_choice(result, {}, {**choice, "message": {k: v for k, v in message.items() if k != "tool_calls"}}
                      if isinstance(message, dict) else choice)
    result.tool_calls = [_joined(calls[i]) for i in sorted(calls)]
    return result.join_parts()


def assemble(body: bytes, content_type: str, path: str | None = None) -> Assembled:
    """One message from a response body; `path` (the request path) names the API surface."""
    if "text/event-stream" in content_type:
        return assemble_sse(body, path)
    if "json" in content_type or body[:1] in (b"{", b"["):
        return assemble_json(body, path)
    return Assembled()
