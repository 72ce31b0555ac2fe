"""Tool-call repair for the Anthropic Messages stream (`/v1/messages`, what Claude Code speaks).

A call is a `tool_use` content block: `content_block_start` (id, name, `input: {}`) →
`content_block_delta` with `input_json_delta.partial_json` × n → `content_block_stop`. The block's
events (and anything interleaved, e.g. `ping`) are held until the stop; valid JSON that fits the
`input_schema` is released byte for byte. A block with no `partial_json` at all means `{}` (the
SDKs read it so), so it is valid unless the schema requires something. A repaired call goes out as
its start event, one `input_json_delta` with the repaired arguments, and its stop event.

Unrecoverable (policy "error"): the held block is dropped and the stream ends with
`event: error` / `{"type": "error", "error": {"type": "api_error", "message": "upstream server
error: …"}}`. The anthropic SDK raises `APIStatusError` on any `event: error` (`_streaming.py`,
via `make_status_error`); "api_error" and "server error" are what clients read as transient.
"fail_fast" uses `invalid_request_error` and a message without retry words.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.config.settings import ToolRepairPolicy
from tapfix.proxy.errors import messages_tool_call_error
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.sse import named_event
from tapfix.proxy.toolcalls.evented_stage import (
    HeldCall,
    HoldingStage,
    as_dict,
    decide,
    fatal_change,
    normalize_tools,
    parse,
    repair_change,
)
from tapfix.proxy.toolcalls.plan import Fatal, cut_by_upstream_error
from tapfix.proxy.toolcalls.schema import ToolSchemas


class MessagesToolCallRepair(HoldingStage):
    path_prefix = "$.content"

    def __init__(
        self, tools: list[Any] | None, policy: ToolRepairPolicy = "error", capture_id: str = "", **kw: Any
    ) -> None:
        super().__init__(tools, policy, capture_id, **kw)
        self.repaired: dict[int, tuple[str, str | None]] = {}

    def on_event(self, event: bytes) -> list[bytes]:
        if not self.holding and b"tool_use" not in event:
            return [event]
        obj = parse(event)
        if obj is None:
            return self.hold(event)
        kind = obj.get("type")
        index = obj.get("index")
        block = as_dict(obj.get("content_block"))
        if kind == "content_block_start" and block.get("type") == "tool_use" and isinstance(index, int):
            self.calls[index] = HeldCall(index, block.get("name") or None, block.get("id") or None)
            self.held.append(event)
            return []
        if not self.holding:
            return [event]
        call = self.calls.get(index) if isinstance(index, int) else None
        if kind == "content_block_delta" and call is not None:
            delta = obj.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("partial_json"), str):
                call.frags.append(delta["partial_json"])
        elif kind == "content_block_stop" and call is not None:
            call.closed = True
        elif kind == "error":
            error = obj.get("error")
            message = str(error.get("message") if isinstance(error, dict) else error)
            self.note_upstream_error(message)
            first = next(iter(self.calls.values()))
            return self.fatal(
                Fatal(first.name or "?", cut_by_upstream_error(message), "missing_last_chunk"), upstream=event
            )
        elif kind in ("message_delta", "message_stop"):
            # The message ended with a block still open: judge it on what arrived.
            stop = obj.get("delta", {}).get("stop_reason") if isinstance(obj.get("delta"), dict) else None
            for c in self.calls.values():
                c.closed = True
                c.finish = "length" if stop == "max_tokens" else c.finish
            out = self._finalize()
            return out if self.ended else out + [event]
        self.held.append(event)
        if all(c.closed for c in self.calls.values()):
            return self._finalize()
        return []

    def _finalize(self) -> list[bytes]:
        verdicts = {key: decide(call, self.schemas, empty_is_object=True) for key, call in self.calls.items()}
        fatal = next((v.fatal for v in verdicts.values() if v.fatal), None)
        if fatal is not None:
            return self.fatal(fatal)
        if all(v.arguments is None for v in verdicts.values()):
            released, self.held, self.calls = self.held, [], {}
            return released
        repaired: dict[int, tuple[str, str | None]] = {}
        for key, verdict in verdicts.items():
            if verdict.arguments is not None:
                self.note(verdict, self.calls[key], f"$.content[{key}].input", verdict.arguments)
                repaired[key] = (verdict.arguments, verdict.name)
        self.repaired.update(repaired)
        out: list[bytes] = []
        sent: set[int] = set()
        for raw in self.held:
            obj = parse(raw)
            index = obj.get("index") if obj else None
            if obj is None or index not in repaired:
                out.append(raw)
                continue
            arguments, name = repaired[index]
            kind = obj.get("type")
            if kind == "content_block_start":
                if name:
                    obj = {**obj, "content_block": {**obj["content_block"], "name": name}}
                    raw = named_event("content_block_start", obj, self.nl)
                out.append(raw)
            elif kind == "content_block_delta":
                if index not in sent:
                    sent.add(index)
                    out.append(self._delta(index, arguments))
            elif kind == "content_block_stop":
                if index not in sent:
                    sent.add(index)
                    out.append(self._delta(index, arguments))
                out.append(raw)
            else:
                out.append(raw)
        self.held, self.calls = [], {}
        return out

    def _delta(self, index: int, arguments: str) -> bytes:
        delta = {"type": "input_json_delta", "partial_json": arguments}
        body = {"type": "content_block_delta", "index": index, "delta": delta}
        return named_event("content_block_delta", body, self.nl)

    def error_events(self, fatal: Fatal, held: list[bytes]) -> list[bytes]:
        keep = [raw for raw in held if parse(raw) is None or (parse(raw) or {}).get("type") == "ping"]
        error = messages_tool_call_error(fatal, self.policy, self.capture_id)
        return keep + [named_event("error", error, self.nl)]


def repair_messages_body(
    body: bytes, tools: list[Any] | None, *, capture_id: str = "", policy: ToolRepairPolicy = "error"
) -> tuple[bytes, list[Change], str]:
    """A non-streamed `message`: (body, changes, outcome); unrecoverable → Anthropic's error body,
    sent with status 502 (policy "error") or 422 ("fail_fast")."""
    obj = json_object(body)
    if obj is None or obj.get("type") != "message" or not isinstance(obj.get("content"), list):
        return body, [], "untouched"
    schemas = ToolSchemas(normalize_tools(tools))
    changes: list[Change] = []
    content: list[Any] = []
    for position, block in enumerate(obj["content"]):
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            content.append(block)
            continue
        value = block.get("input")
        text = value if isinstance(value, str) else json.dumps(value if value is not None else {}, ensure_ascii=False)
        call = HeldCall(
            position,
            block.get("name") or None,
            block.get("id"),
            [text],
            finish="length" if obj.get("stop_reason") == "max_tokens" else None,
        )
        verdict = decide(call, schemas, empty_is_object=True)
        where = f"$.content[{position}].input"
        if verdict.fatal is not None:
            changes.append(fatal_change(verdict.fatal, where))
            if policy == "passthrough":
                return body, changes, "unrecoverable"
            return orjson.dumps(messages_tool_call_error(verdict.fatal, policy, capture_id)), changes, "unrecoverable"
        if verdict.arguments is None and isinstance(value, dict):
            content.append(block)
            continue
        arguments = verdict.arguments if verdict.arguments is not None else text
        changes.append(
            repair_change(verdict, where, block.get("name"), text, arguments, "invalid_json", "input sent as a string")
        )
        new = {**block, "input": json.loads(arguments)}
        if verdict.name:
            new["name"] = verdict.name
        content.append(new)
    if not changes:
        return body, [], "untouched"
    return orjson.dumps({**obj, "content": content}), changes, "repaired"
