"""The mock's OpenAI Responses wire format (`POST /v1/responses`), streamed and not.

Event order and fields follow what OpenAI and vLLM's `serving_responses` put on the wire:
`response.created`, `response.in_progress`, then per output item `response.output_item.added` →
its deltas (`response.reasoning_text.delta`, `response.output_text.delta` inside a content part,
`response.function_call_arguments.delta`, or `response.custom_tool_call_input.delta` for a custom
(freeform) tool such as Codex's `apply_patch`) → their `.done` → `response.output_item.done`, and
finally `response.completed` (or `response.incomplete` with `incomplete_details.reason:
max_output_tokens`) carrying the whole `response` with its `output` and `usage`. Each event is
`event: NAME\\ndata: {compact JSON}\\n\\n` with a running `sequence_number`.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.mock.chat import dumps
from tapfix.proxy.mock.surface_script import Part, Script


class _Seq:
    def __init__(self) -> None:
        self.n = -1
        self.events: list[bytes] = []

    def emit(self, kind: str, body: dict[str, Any]) -> None:
        self.n += 1
        data = {"type": kind, "sequence_number": self.n, **body}
        self.events.append(b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n")


def _item_id(prefix: str, digest: str, index: int) -> str:
    return f"{prefix}_{digest[:24]}{index:02d}"


def _item(part: Part, digest: str, index: int, done: bool) -> dict[str, Any]:
    text = "".join(part.pieces)
    status = "completed" if done else "in_progress"
    if part.kind == "reasoning":
        content: list[dict[str, Any]] = [{"type": "reasoning_text", "text": text}] if done else []
        return {
            "id": _item_id("rs", digest, index),
            "type": "reasoning",
            "summary": [],
            "content": content,
            "encrypted_content": None,
            "status": status,
        }
    if part.kind == "text":
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []
        item_id = _item_id("msg", digest, index)
        return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}
    call_id = "call_" + part.call_id[-24:]
    if part.custom:
        return {
            "id": _item_id("ctc", digest, index),
            "type": "custom_tool_call",
            "status": status,
            "call_id": call_id,
            "name": part.name,
            "input": text if done else "",
        }
    return {
        "id": _item_id("fc", digest, index),
        "type": "function_call",
        "call_id": call_id,
        "name": part.name,
        "arguments": text if done else "",
        "status": status,
    }


def response_object(
    script: Script, req: dict[str, Any], digest: str, created: int, model: str, prompt_tokens: int, done: bool
) -> dict[str, Any]:
    incomplete = script.finish == "length"
    reasoning_tokens = sum(len(p.pieces) for p in script.parts if p.kind == "reasoning")
    status = ("incomplete" if incomplete else "completed") if done else "in_progress"
    reasoning = req.get("reasoning")
    if not isinstance(reasoning, dict):
        reasoning = {"effort": None, "summary": None}
    return {
        "id": "resp_" + digest[:32],
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if done and incomplete else None,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "model": model,
        "output": [_item(p, digest, i, True) for i, p in enumerate(script.parts)] if done else [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": reasoning,
        "temperature": req.get("temperature", 1.0),
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": script.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": prompt_tokens + script.completion_tokens,
        }
        if done
        else None,
        "metadata": {},
    }


def responses_events(
    script: Script, req: dict[str, Any], digest: str, created: int, model: str, prompt_tokens: int
) -> list[bytes]:
    seq = _Seq()
    start = response_object(script, req, digest, created, model, prompt_tokens, done=False)
    seq.emit("response.created", {"response": start})
    seq.emit("response.in_progress", {"response": start})
    for index, part in enumerate(script.parts):
        item = _item(part, digest, index, False)
        item_id = item["id"]
        where = {"item_id": item_id, "output_index": index}
        seq.emit("response.output_item.added", {"output_index": index, "item": item})
        text = "".join(part.pieces)
        if part.kind == "reasoning":
            for piece in part.pieces:
                seq.emit("response.reasoning_text.delta", {**where, "content_index": 0, "delta": piece})
            seq.emit("response.reasoning_text.done", {**where, "content_index": 0, "text": text})
        elif part.kind == "text":
            empty = {"type": "output_text", "text": "", "annotations": []}
            seq.emit("response.content_part.added", {**where, "content_index": 0, "part": empty})
            for piece in part.pieces:
                delta = {**where, "content_index": 0, "delta": piece, "logprobs": []}
                seq.emit("response.output_text.delta", delta)
            seq.emit("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []})
            done = {**where, "content_index": 0, "part": {**empty, "text": text}}
            seq.emit("response.content_part.done", done)
        elif part.custom:
            for piece in part.pieces:
                seq.emit("response.custom_tool_call_input.delta", {**where, "delta": piece})
            seq.emit("response.custom_tool_call_input.done", {**where, "input": text})
        else:
            for piece in part.pieces:
                seq.emit("response.function_call_arguments.delta", {**where, "delta": piece})
            seq.emit("response.function_call_arguments.done", {**where, "name": part.name, "arguments": text})
        finished = _item(part, digest, index, True)
        seq.emit("response.output_item.done", {"output_index": index, "item": finished})
    final = response_object(script, req, digest, created, model, prompt_tokens, done=True)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    seq.emit(kind, {"response": final})
    return seq.events


def responses_body(
    script: Script, req: dict[str, Any], digest: str, created: int, model: str, prompt_tokens: int
) -> bytes:
    return dumps(response_object(script, req, digest, created, model, prompt_tokens, done=True))


def responses_error(message: str, status: int) -> bytes:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
