"""Tool-call repair for the OpenAI Responses stream (`/v1/responses`, what Codex speaks).

A call is a `function_call` output item: `response.output_item.added` (name, call_id, empty
arguments) → `response.function_call_arguments.delta` × n → `.done` (the whole arguments again) →
`response.output_item.done` (the item with its arguments). From `.added` to `.output_item.done`
every event is held; a call whose arguments are valid JSON that fits the schema is released byte
for byte. A repaired call goes out as the same events with one delta carrying the repaired
arguments, the `.done` events rewritten to match, and the terminal `response.completed` patched so
a client reading the final object sees the same call.

Unrecoverable (policy "error"): the held call is dropped and the stream ends with an `error` event
— whose data also carries an `error` object, which is what makes the openai SDK raise `APIError`
(`_streaming.py` raises on any event whose data has a truthy `error`) — then a `response.failed`
event (what Codex reads; it retries a failed response). Retry words as in clients.md §8.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.config.settings import ToolRepairPolicy
from tapfix.proxy.errors import responses_tool_call_error_events, tool_call_error_json
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.sse import named_event
from tapfix.proxy.toolcalls.evented_stage import (
    HeldCall,
    HoldingStage,
    as_dict,
    decide,
    event_name,
    fatal_change,
    normalize_tools,
    parse,
    repair_change,
)
from tapfix.proxy.toolcalls.plan import Fatal, cut_by_upstream_error
from tapfix.proxy.toolcalls.schema import ToolSchemas

_TERMINAL = (b"response.completed", b"response.incomplete")


class ResponsesToolCallRepair(HoldingStage):
    path_prefix = "$.output"

    def __init__(
        self, tools: list[Any] | None, policy: ToolRepairPolicy = "error", capture_id: str = "", **kw: Any
    ) -> None:
        super().__init__(tools, policy, capture_id, **kw)
        self.repaired: dict[str, tuple[str, str | None]] = {}  # item id -> (arguments, name)
        self.response: dict[str, Any] = {}  # the latest response envelope (for response.failed)
        self.done_items: list[Any] = []
        self.seq = 0

    def on_event(self, event: bytes) -> list[bytes]:
        interesting = (
            self.holding
            or b"function_call" in event
            or (self.repaired and any(t in event for t in _TERMINAL))
            or b"response.created" in event
        )
        if not interesting:
            self._track_seq(event)
            return [event]
        obj = parse(event)
        if obj is None:
            return self.hold(event)
        kind = obj.get("type") or event_name(event)
        if isinstance(obj.get("sequence_number"), int):
            self.seq = obj["sequence_number"]
        if kind in ("response.created", "response.in_progress") and isinstance(obj.get("response"), dict):
            self.response = obj["response"]
            return self.hold(event)
        item = as_dict(obj.get("item"))
        if kind == "response.output_item.added" and item.get("type") == "function_call":
            key = str(item.get("id") or f"#{obj.get('output_index')}")
            self.calls[key] = HeldCall(key, item.get("name") or None, item.get("call_id") or None)
            self.held.append(event)
            return []
        if not self.holding:
            if kind in ("response.completed", "response.incomplete") and self.repaired:
                return [self._patch_terminal(event, obj)]
            if kind == "response.output_item.done":
                self.done_items.append(item)
            return [event]
        call = self._call_for(obj, item)
        if kind == "response.function_call_arguments.delta" and call is not None:
            if isinstance(obj.get("delta"), str):
                call.frags.append(obj["delta"])
        elif kind == "response.function_call_arguments.done" and call is not None:
            if isinstance(obj.get("arguments"), str):
                call.final = obj["arguments"]
        elif kind == "response.output_item.done" and call is not None:
            if isinstance(item.get("arguments"), str) and call.final is None:
                call.final = item["arguments"]
            if item.get("status") == "incomplete":
                call.finish = "length"
            call.closed = True
        elif kind in ("error", "response.failed"):
            message = _message(obj)
            self.note_upstream_error(message)
            call = next(iter(self.calls.values()))
            return self.fatal(
                Fatal(call.name or "?", cut_by_upstream_error(message), "missing_last_chunk"), upstream=event
            )
        elif kind in ("response.completed", "response.incomplete"):
            for c in self.calls.values():
                c.closed = True
                if kind == "response.incomplete":
                    c.finish = "length"
            out = self._finalize()
            if self.ended:
                return out
            return out + [self._patch_terminal(event, obj) if self.repaired else event]
        self.held.append(event)
        if all(c.closed for c in self.calls.values()):
            return self._finalize()
        return []

    def _track_seq(self, event: bytes) -> None:
        at = event.find(b'"sequence_number":')
        if at >= 0:
            digits = event[at + 18 : at + 30].lstrip().split(b",")[0].split(b"}")[0]
            if digits.isdigit():
                self.seq = int(digits)

    def _call_for(self, obj: dict[str, Any], item: dict[str, Any]) -> HeldCall | None:
        key = obj.get("item_id") or item.get("id")
        if isinstance(key, str) and key in self.calls:
            return self.calls[key]
        if item and item.get("type") != "function_call":
            return None
        open_calls = [c for c in self.calls.values() if not c.closed]
        return open_calls[0] if len(open_calls) == 1 else None

    def _finalize(self) -> list[bytes]:
        verdicts = {key: decide(call, self.schemas) for key, call in self.calls.items()}
        fatal = next((v.fatal for v in verdicts.values() if v.fatal), None)
        if fatal is not None:
            return self.fatal(fatal)
        if all(v.arguments is None for v in verdicts.values()):
            out, self.held, self.calls = self.held, [], {}
            return out
        for key, verdict in verdicts.items():
            if verdict.arguments is not None:
                call = self.calls[key]
                self.note(verdict, call, f"$.output[?(@.id=='{key}')].arguments", verdict.arguments)
                self.repaired[key] = (verdict.arguments, verdict.name)
        out = self._rebuild(self.held)
        self.held, self.calls = [], {}
        return out

    def _rebuild(self, held: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        sent_delta: set[str] = set()
        for raw in held:
            obj = parse(raw)
            kind = obj.get("type") if obj else None
            key = obj.get("item_id") if obj else None
            item = as_dict(obj.get("item")) if obj else {}
            key = key or item.get("id")
            if obj is None or key not in self.repaired:
                out.append(raw)
                continue
            arguments, name = self.repaired[key]
            if kind == "response.function_call_arguments.delta":
                if key not in sent_delta:
                    sent_delta.add(key)
                    out.append(named_event(kind, {**obj, "delta": arguments}, self.nl))
                continue
            if kind == "response.function_call_arguments.done":
                if key not in sent_delta:  # no delta came: the client still gets one
                    sent_delta.add(key)
                    delta = {k: v for k, v in obj.items() if k not in ("arguments", "name")}
                    out.append(
                        named_event(
                            "response.function_call_arguments.delta",
                            {**delta, "type": "response.function_call_arguments.delta", "delta": arguments},
                            self.nl,
                        )
                    )
                obj = {**obj, "arguments": arguments}
                if name and "name" in obj:
                    obj["name"] = name
                out.append(named_event(kind, obj, self.nl))
                continue
            if kind in ("response.output_item.added", "response.output_item.done"):
                new_item = dict(item)
                if name:
                    new_item["name"] = name
                if kind.endswith(".done"):
                    new_item["arguments"] = arguments
                    self.done_items.append(new_item)
                out.append(named_event(kind, {**obj, "item": new_item}, self.nl))
                continue
            out.append(raw)
        return out

    def _patch_terminal(self, event: bytes, obj: dict[str, Any]) -> bytes:
        response = obj.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("output"), list):
            return event
        output = []
        for item in response["output"]:
            if isinstance(item, dict) and item.get("id") in self.repaired:
                arguments, name = self.repaired[item["id"]]
                item = {**item, "arguments": arguments, **({"name": name} if name else {})}
            output.append(item)
        kind = obj.get("type") or event_name(event) or "response.completed"
        return named_event(kind, {**obj, "response": {**response, "output": output}}, self.nl)

    def error_events(self, fatal: Fatal, held: list[bytes]) -> list[bytes]:
        keep = [raw for raw in held if b"function_call" not in raw]
        events = responses_tool_call_error_events(
            fatal,
            self.policy,
            self.capture_id,
            seq=self.seq,
            response=self.response,
            output=self.done_items,
            newline=self.nl,
        )
        self.seq += len(events)
        return keep + events


def _message(obj: dict[str, Any]) -> str:
    error = obj.get("error")
    if not isinstance(error, dict) and isinstance(obj.get("response"), dict):
        error = obj["response"].get("error")
    if isinstance(error, dict) and isinstance(message := error.get("message"), str):
        return message
    return str(obj.get("message") or "")


def repair_responses_body(
    body: bytes, tools: list[Any] | None, *, capture_id: str = "", policy: ToolRepairPolicy = "error"
) -> tuple[bytes, list[Change], str]:
    """A non-streamed `response` object: (body, changes, outcome); an unrecoverable call gives the
    error body to send with status 502 (policy "error") or 422 ("fail_fast")."""
    obj = json_object(body)
    if obj is None or not isinstance(obj.get("output"), list):
        return body, [], "untouched"
    schemas = ToolSchemas(normalize_tools(tools))
    changes: list[Change] = []
    output: list[Any] = []
    for position, item in enumerate(obj["output"]):
        if not isinstance(item, dict) or item.get("type") != "function_call":
            output.append(item)
            continue
        args = item.get("arguments")
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        call = HeldCall(
            item.get("id"),
            item.get("name") or None,
            item.get("call_id"),
            [text] if text else [],
            finish="length" if item.get("status") == "incomplete" else None,
        )
        verdict = decide(call, schemas)
        where = f"$.output[{position}].arguments"
        if verdict.fatal is not None:
            changes.append(fatal_change(verdict.fatal, where))
            if policy == "passthrough":
                return body, changes, "unrecoverable"
            return tool_call_error_json(verdict.fatal, policy, capture_id), changes, "unrecoverable"
        if verdict.arguments is None:
            output.append(item)
            continue
        changes.append(repair_change(verdict, where, item.get("name"), text, verdict.arguments, "repair"))
        renamed = {"name": verdict.name} if verdict.name else {}
        output.append({**item, "arguments": verdict.arguments, **renamed})
    if not changes:
        return body, [], "untouched"
    return orjson.dumps({**obj, "output": output}), changes, "repaired"
