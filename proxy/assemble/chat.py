"""Chat Completions (and legacy completions) assembly: a stream or body → one message.

Runs in the writer thread, off the event loop. Accumulates tool calls strictly by index, as a
spec-following client does, so the stored message is what a correct client would have built.
"""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.assemble.result import Assembled
from tapfix.proxy.sse import SSESplitter, event_data


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
            arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
        )


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


def assemble_chat_sse(chunks: list[bytes]) -> Assembled:
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


def assemble_chat_json(obj: dict[str, Any]) -> Assembled:
    result = Assembled()
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
        _apply_choice(
            result,
            {},
            {**choice, "message": {k: v for k, v in message.items() if k != "tool_calls"}}
            if isinstance(message, dict)
            else choice,
        )
    result.tool_calls = [_joined(calls[i]) for i in sorted(calls)]
    return result.join_parts()
