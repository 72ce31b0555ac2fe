"""Tool-call repair of a non-streamed Responses body (`/v1/responses` with `stream: false`).

The same rules as the stream (`responses.py`), applied to the `output` list at once: leaked markup in
the message items is read first (`responses_leaks.leak_output`), then each function_call item is
judged (`evented_stage.decide`) and given its one unique call_id. Apart from the stream stage because
it shares none of its event bookkeeping, only the judging it imports.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.errors import tool_call_error_json
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.toolcalls.cutoff import Sign, cut_off, turn_sign
from tapfix.proxy.toolcalls.defects import WRONG_INDEX
from tapfix.proxy.toolcalls.evented_leaks import LeakDetector
from tapfix.proxy.toolcalls.evented_stage import (
    HeldCall,
    IdLedger,
    decide,
    fatal_change,
    normalize_tools,
    repair_change,
    unknown_tool_change,
)
from tapfix.proxy.toolcalls.plan_types import STAGE
from tapfix.proxy.toolcalls.responses_leaks import call_item, item_id, leak_output, message_text, reasoning_text
from tapfix.proxy.toolcalls.schema import ToolSchemas
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy


def repair_responses_body(
    body: bytes,
    tools: list[Any] | None,
    *,
    capture_id: str = "",
    policy: ToolRepairPolicy = "error",
    tool_format: str | None = None,
) -> tuple[bytes, list[Change], str]:
    """A non-streamed `response` object: (body, changes, outcome); an unrecoverable call gives the
    error body to send with status 502 (policy "error") or 422 ("fail_fast"). The same invariants as the
    stream: each function_call has one unique call_id (minted when missing or used), names are matched
    to the offered tools (an unknown one is flagged, the body unchanged)."""
    obj = json_object(body)
    if obj is None or not isinstance(obj.get("output"), list):
        return body, [], "untouched"
    schemas = ToolSchemas(normalize_tools(tools))
    ids = IdLedger("call_", capture_id)
    changes: list[Change] = []
    detector = LeakDetector(schemas, tool_format)
    upstream_output, leak_fatal = leak_output(obj["output"], detector, capture_id, changes)
    if leak_fatal is None and obj.get("status") == "incomplete" and detector.active:
        sign = _cut_output(obj["output"], detector)
        if sign is not None:
            leak_fatal = cut_off(sign)
            changes.append(fatal_change(leak_fatal, "$.output"))
    if leak_fatal is not None:
        if policy == "passthrough":
            return body, changes, "unrecoverable"
        return tool_call_error_json(leak_fatal, policy, capture_id), changes, "unrecoverable"
    output: list[Any] = []
    edited = upstream_output is not obj["output"]
    recovered = {id(i) for i in upstream_output} - {id(i) for i in obj["output"]}  # judged already, when read
    for position, item in enumerate(upstream_output):
        if id(item) in recovered and isinstance(item, dict) and item.get("type") == "function_call":
            ids.assign(item.get("call_id"), position)
            output.append(item)
            continue
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
        call_id, id_reason = ids.assign(call.call_id, position)
        verdict = decide(call, schemas)
        where = f"$.output[{position}]"
        if verdict.fatal is not None:
            changes.append(fatal_change(verdict.fatal, f"{where}.arguments"))
            if policy == "passthrough":
                return body, changes, "unrecoverable"
            return tool_call_error_json(verdict.fatal, policy, capture_id), changes, "unrecoverable"
        if verdict.unknown_tool:
            changes.append(unknown_tool_change(call.name, f"{where}.name"))
        new = dict(item)
        if verdict.arguments is not None:
            changes.append(
                repair_change(verdict, f"{where}.arguments", item.get("name"), text, verdict.arguments, "repair")
            )
            new["arguments"] = verdict.arguments
            if verdict.name:
                new["name"] = verdict.name
        if id_reason:
            before, after = {"call_id": call.call_id}, {"call_id": call_id}
            changes.append(Change(STAGE, WRONG_INDEX, f"{where}.call_id", before, after, id_reason))
            new["call_id"] = call_id
        edited = edited or new != item
        output.append(new)
        for glued_name, glued_args in verdict.glued:  # calls split off its arguments follow it
            call_id, _ = ids.assign(None, len(output))
            output.append(call_item(item_id(capture_id, len(output)), call_id, glued_name, glued_args, True))
    if not edited:
        return body, changes, "untouched"
    return orjson.dumps({**obj, "output": output}), changes, "repaired"


def _cut_output(output: list[Any], detector: LeakDetector) -> Sign | None:
    """A response `max_tokens` left incomplete: the text after its last function_call item (all its text
    when it has none, then its last reasoning) judged as the stream judges it (`cutoff.turn_sign`)."""
    items = [i for i in output if isinstance(i, dict)]
    calls = [k for k, i in enumerate(items) if i.get("type") == "function_call"]
    after = items[calls[-1] + 1 :] if calls else items
    text = "".join(message_text(i) for i in after if i.get("type") == "message")
    reasoning = [reasoning_text(i) for i in items if i.get("type") == "reasoning"]
    last_call = str(items[calls[-1]].get("name") or "?") if calls else None
    return turn_sign(
        text, detector.schemas, detector.formats, last_call, reasoning[-1] if reasoning and not calls else None
    )
