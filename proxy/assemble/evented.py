"""Assembly of the OpenAI Responses and Anthropic Messages surfaces into the chat-shaped `Assembled`.

The store, the browser and the flags read one shape (content, reasoning, tool_calls, finish_reason,
usage), whatever API the exchange used, so each surface's stream or body is folded into it here:

- Responses: `output_text` deltas → content; reasoning text and reasoning *summaries* → reasoning;
  `function_call` items (+ argument deltas) → tool_calls `{id: call_id, name, arguments}`; the
  response `status` (or the `incomplete_details.reason`) → finish_reason; `usage` as sent.
- Messages: `text` blocks → content; `thinking` blocks → reasoning; `tool_use` blocks (+
  `input_json_delta.partial_json`) → tool_calls `{id, name, arguments}`; `stop_reason` →
  finish_reason; usage from `message_start`, updated by `message_delta`.

Folding is event by event, as a client does, so a stream cut short still gives what arrived. For a
Responses stream, a terminal `response.*` object that lists its output is authoritative over the
deltas (it is what a client that reads the final object keeps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from tapfix.proxy.assemble.result import Assembled
from tapfix.proxy.sse import SSESplitter, event_data
from tapfix.proxy.surfaces import MESSAGES, RESPONSES, Evented, PerSurface

_TERMINAL = ("response.completed", "response.incomplete", "response.failed")


# -- Responses ---------------------------------------------------------------------------------
class _ResponsesFold:
    def __init__(self) -> None:
        self.result = Assembled()
        self.calls: dict[str, dict[str, Any]] = {}  # item id -> call
        self.order: list[str] = []
        self.final: dict[str, Any] | None = None

    def event(self, obj: dict[str, Any], chunk_index: int) -> None:
        kind = obj.get("type")
        r = self.result
        token = False
        if kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
            r.append("content", obj["delta"])
            token = bool(obj["delta"])
        elif kind in ("response.reasoning_text.delta", "response.reasoning_summary_text.delta"):
            if isinstance(obj.get("delta"), str):
                r.append("reasoning", obj["delta"])
                token = bool(obj["delta"])
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                call = self._call(item.get("id") or f"#{obj.get('output_index')}")
                call["id"] = item.get("call_id") or call["id"]
                call["name"] = item.get("name") or call["name"]
                if kind.endswith(".done") and isinstance(item.get("arguments"), str):
                    call["arguments"] = item["arguments"]
                token = True
        elif kind == "response.function_call_arguments.delta" and isinstance(obj.get("delta"), str):
            self._call(str(obj.get("item_id"))).setdefault("_frags", []).append(obj["delta"])
            token = True
        elif kind == "response.function_call_arguments.done" and isinstance(obj.get("arguments"), str):
            self._call(str(obj.get("item_id")))["arguments"] = obj["arguments"]
        elif kind == "error":
            r.error = obj.get("error") or {k: v for k, v in obj.items() if k != "type"}
        elif kind in _TERMINAL:
            r.done = True
            response = obj.get("response")
            if isinstance(response, dict):
                self.final = response
        if token and r.first_token_chunk is None:
            r.first_token_chunk = chunk_index

    def _call(self, key: str) -> dict[str, Any]:
        if key not in self.calls:
            self.calls[key] = {"id": None, "name": "", "arguments": None}
            self.order.append(key)
        return self.calls[key]

    def finish(self) -> Assembled:
        r = self.result
        calls = []
        for key in self.order:
            call = self.calls[key]
            frags = call.pop("_frags", [])
            if call["arguments"] is None:
                call["arguments"] = "".join(frags)
            calls.append(call)
        r.tool_calls = calls
        r.join_parts()
        if self.final is not None:
            _from_response(r, self.final, keep_deltas=True)
        return r


def _from_response(r: Assembled, response: dict[str, Any], keep_deltas: bool = False) -> None:
    """Fill `r` from a Responses `response` object (a body, or a stream's terminal event)."""
    status = response.get("status")
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    r.finish_reason = reason if status == "incomplete" and isinstance(reason, str) else status
    if response.get("usage") is not None:
        r.usage = response["usage"]
    if response.get("error"):
        r.error = response["error"]
    output = response.get("output")
    if not isinstance(output, list) or not output:
        return
    content, reasoning, calls = "", "", []
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    content += part["text"]
        elif kind == "reasoning":
            texts = [p.get("text") for p in (item.get("content") or []) if isinstance(p, dict)]
            texts = [t for t in texts if isinstance(t, str)] or [
                p.get("text") for p in (item.get("summary") or []) if isinstance(p, dict)
            ]
            reasoning += "".join(t for t in texts if isinstance(t, str))
        elif kind == "function_call":
            args = item.get("arguments")
            calls.append(
                {
                    "id": item.get("call_id") or item.get("id"),
                    "name": item.get("name") or "",
                    "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                }
            )
    if not keep_deltas or content:
        r.content = content
    if not keep_deltas or reasoning:
        r.reasoning = reasoning
    if not keep_deltas or calls:
        r.tool_calls = calls


def assemble_responses_sse(chunks: list[bytes]) -> Assembled:
    fold = _ResponsesFold()
    _each_event(chunks, fold.result, fold.event)
    return fold.finish()


def assemble_responses_json(obj: dict[str, Any]) -> Assembled:
    r = Assembled()
    _from_response(r, obj)
    r.done = True
    return r


# -- Messages ----------------------------------------------------------------------------------
class _MessagesFold:
    def __init__(self) -> None:
        self.result = Assembled()
        self.blocks: dict[int, dict[str, Any]] = {}
        self.order: list[int] = []

    def event(self, obj: dict[str, Any], chunk_index: int) -> None:
        kind = obj.get("type")
        r = self.result
        token = False
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            usage = obj["message"].get("usage")
            if isinstance(usage, dict):
                r.usage = dict(usage)
        elif kind == "content_block_start" and isinstance(obj.get("content_block"), dict):
            sent_index = obj.get("index")
            index = sent_index if isinstance(sent_index, int) else len(self.order)
            block = dict(obj["content_block"])
            self.blocks[index] = block
            self.order.append(index)
            if block.get("type") == "tool_use":
                block["_json"] = []
                token = True
            elif block.get("type") == "text" and block.get("text"):
                r.append("content", block["text"])
                token = True
        elif kind == "content_block_delta" and isinstance(obj.get("delta"), dict):
            delta = obj["delta"]
            dtype = delta.get("type")
            if dtype == "text_delta" and isinstance(delta.get("text"), str):
                r.append("content", delta["text"])
                token = bool(delta["text"])
            elif dtype == "thinking_delta" and isinstance(delta.get("thinking"), str):
                r.append("reasoning", delta["thinking"])
                token = bool(delta["thinking"])
            elif dtype == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                held = self.blocks.get(obj.get("index"))  # type: ignore[arg-type]  # an odd index finds no block
                if held is not None and "_json" in held:
                    held["_json"].append(delta["partial_json"])
                    token = True
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason"):
                r.finish_reason = delta["stop_reason"]
            usage = obj.get("usage")
            if isinstance(usage, dict):
                r.usage = {**(r.usage or {}), **{k: v for k, v in usage.items() if v is not None}}
        elif kind == "message_stop":
            r.done = True
        elif kind == "error":
            r.error = obj.get("error") or obj
        if token and r.first_token_chunk is None:
            r.first_token_chunk = chunk_index

    def finish(self) -> Assembled:
        calls = []
        for index in self.order:
            block = self.blocks[index]
            if block.get("type") != "tool_use":
                continue
            raw = "".join(block.get("_json") or ())
            if not raw and block.get("input"):
                raw = orjson.dumps(block["input"]).decode()
            calls.append({"id": block.get("id"), "name": block.get("name") or "", "arguments": raw or "{}"})
        self.result.tool_calls = calls
        return self.result.join_parts()


def assemble_messages_sse(chunks: list[bytes]) -> Assembled:
    fold = _MessagesFold()
    _each_event(chunks, fold.result, fold.event)
    return fold.finish()


def assemble_messages_json(obj: dict[str, Any]) -> Assembled:
    r = Assembled(done=True)
    if obj.get("type") == "error":
        r.error = obj.get("error")
        return r
    for block in obj.get("content") or ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            r.append("content", block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            r.append("reasoning", block["thinking"])
        elif kind == "tool_use":
            args = block.get("input")
            text = args if isinstance(args, str) else orjson.dumps(args or {}).decode()
            r.tool_calls.append({"id": block.get("id"), "name": block.get("name") or "", "arguments": text})
    r.finish_reason = obj.get("stop_reason")
    r.usage = obj.get("usage")
    return r.join_parts()


# -- shared ------------------------------------------------------------------------------------
def _each_event(chunks: list[bytes], result: Assembled, fold: Any) -> None:
    splitter = SSESplitter()
    last = max(0, len(chunks) - 1)
    for chunk_index, events in enumerate([*(splitter.feed(c) for c in chunks), splitter.flush()]):
        for event in events:
            data = event_data(event)
            if data is None or not data.strip():
                continue
            result.events += 1
            obj = result.event_object(data)
            if obj is None:
                continue
            if isinstance(obj.get("timings"), dict):  # llama.cpp's, on a Responses stream's last event
                result.timings = obj["timings"]
            fold(obj, min(chunk_index, last))


# Each evented surface's folds, streamed and whole.
_SSE_FOLDS: PerSurface[Callable[[list[bytes]], Assembled]] = PerSurface(
    {RESPONSES: assemble_responses_sse, MESSAGES: assemble_messages_sse}
)
_JSON_FOLDS: PerSurface[Callable[[dict[str, Any]], Assembled]] = PerSurface(
    {RESPONSES: assemble_responses_json, MESSAGES: assemble_messages_json}
)


def assemble_evented_sse(surface: Evented, chunks: list[bytes]) -> Assembled:
    return _SSE_FOLDS[surface](chunks)


def assemble_evented_json(surface: Evented, obj: dict[str, Any]) -> Assembled:
    return _JSON_FOLDS[surface](obj)
