"""The same repair on a non-streamed `chat.completion` body.

Returns the original bytes when nothing needs repair (byte-exact passthrough). When a call is
unrecoverable, the returned body is the JSON error object the streaming stage would have sent as an
event (`{"error": {"type": "server_error", "code": 502, ...}}` under the default policy): the caller
sends it with HTTP status 502, which every agent retries. Under "fail_fast" the body has no retry
words (send it with a 4xx status, e.g. 422); under "passthrough" the original body is returned.

The structural invariants of `plan.py` hold here too, per choice (n > 1: each choice is planned on its
own, a fine one is kept as it came): dense calls with their own ids and offered names (an unknown name
only flagged, the body unchanged), and a finish_reason that matches the calls: `tool_calls` with no
call is the error body, `stop` or a complete `length` with calls becomes `tool_calls`, except `stop`
with the call a named `tool_choice` forced.
"""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.errors import tool_call_error_json
from tapfix.proxy.toolcalls.accumulate import CallAccumulator
from tapfix.proxy.toolcalls.leaks import formats_for
from tapfix.proxy.toolcalls.plan import named_tool, plan_choice
from tapfix.proxy.toolcalls.plan_types import STAGE, Part
from tapfix.proxy.toolcalls.schema import ToolSchemas
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy


def repair_chat_completion(
    body: bytes,
    tools: list[Any] | None,
    *,
    capture_id: str = "",
    policy: ToolRepairPolicy = "error",
    tool_choice: Any = None,
    tool_format: str | None = None,
) -> tuple[bytes, list[Change], str]:
    """(body, changes, outcome) with outcome "untouched" | "repaired" | "unrecoverable".

    An "untouched" body may still come with changes that only flag (an unknown tool name).
    `tool_format`: the one registered format armed (UnknownFormat otherwise); another registered
    format's markup then passes, flagged `unpinned_tool_format`. With the content blank and no
    tool_calls, markup last in the reasoning (`reasoning_content` / `reasoning`) is the message's call,
    by the stream's rule (the reasoning is kept as it came)."""
    formats = formats_for(tool_format)
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, [], "untouched"
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return body, [], "untouched"
    schemas = ToolSchemas(tools)
    named = named_tool(tool_choice)
    changes: list[Change] = []
    edited = False
    new_choices: list[Any] = []
    for position, ch in enumerate(choices):
        message = ch.get("message") if isinstance(ch, dict) else None
        if not isinstance(message, dict):
            new_choices.append(ch)
            continue
        ci = ch.get("index", position)
        ci = ci if isinstance(ci, int) else position
        acc = CallAccumulator(schemas.schemas)
        tool_calls = message.get("tool_calls")
        for i, tc in enumerate(tool_calls if isinstance(tool_calls, list) else []):
            acc.add({**tc, "index": tc.get("index", i)} if isinstance(tc, dict) else tc)
        content = message.get("content")
        parts = [Part(0, content)] if isinstance(content, str) and content else []
        field, reasoning = _reasoning(message) if not acc.calls and not (content or "").strip() else ("", None)
        finish = ch.get("finish_reason")
        if not acc.calls and not (schemas and (parts or finish == "tool_calls" or reasoning)):
            new_choices.append(ch)
            continue
        plan = plan_choice(
            acc.calls,
            [1] * len(acc.calls),
            parts,
            schemas,
            finish if isinstance(finish, str) else None,
            ci,
            True,
            f"{obj.get('id', '')}:{capture_id}",
            path_prefix="message",
            named=named,
            formats=formats,
            reasoning=reasoning,
            reasoning_field=field or "reasoning_content",
        )
        if plan.fatal is not None:
            changes.append(
                Change(
                    STAGE,
                    plan.fatal.kind,
                    f"$.choices[{ci}].message.tool_calls",
                    {"name": plan.fatal.name},
                    None,
                    f"unrecoverable ({plan.fatal.reason})",
                )
            )
            if policy == "passthrough":
                return body, changes, "unrecoverable"
            return tool_call_error_json(plan.fatal, policy, capture_id), changes, "unrecoverable"
        changes.extend(plan.changes)
        if plan.untouched:
            new_choices.append(ch)
            continue
        edited = True
        message = dict(message)
        if not plan.structured_clean or plan.calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in plan.calls
            ]
        if 0 in plan.content_edits:
            text = plan.content_edits[0]
            message["content"] = text if text.strip() or not message.get("tool_calls") else None
        ch = {**ch, "message": message}
        if plan.finish_edit is not None:
            ch["finish_reason"] = plan.finish_edit  # the plan recorded the change
        new_choices.append(ch)
    if not edited:
        return body, changes, "untouched"
    return orjson.dumps({**obj, "choices": new_choices}), changes, "repaired"


def _reasoning(message: dict[str, Any]) -> tuple[str, str | None]:
    """The message's reasoning field and text (vLLM's `reasoning_content`, newer servers' `reasoning`)."""
    for field in ("reasoning_content", "reasoning"):
        text = message.get(field)
        if isinstance(text, str) and text.strip():
            return field, text
    return "", None
