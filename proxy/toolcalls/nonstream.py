"""The same repair on a non-streamed `chat.completion` body.

Returns the original bytes when nothing needs repair (byte-exact passthrough). When a call is
unrecoverable, the returned body is the JSON error object the streaming stage would have sent as an
event (`{"error": {"type": "server_error", "code": 502, ...}}` under the default policy): the caller
sends it with HTTP status 502, which every agent retries. Under "fail_fast" the body has no retry
words (send it with a 4xx status, e.g. 422); under "passthrough" the original body is returned.
"""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.config.settings import ToolRepairPolicy
from tapfix.proxy.errors import tool_call_error_json
from tapfix.proxy.toolcalls.accumulate import CallAccumulator
from tapfix.proxy.toolcalls.output import finish_reason_change
from tapfix.proxy.toolcalls.plan import STAGE, Part, plan_choice
from tapfix.proxy.toolcalls.schema import ToolSchemas


def repair_chat_completion(
    body: bytes, tools: list[Any] | None, *, capture_id: str = "", policy: ToolRepairPolicy = "error"
) -> tuple[bytes, list[Change], str]:
    """(body, changes, outcome) with outcome "untouched" | "repaired" | "unrecoverable"."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body, [], "untouched"
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return body, [], "untouched"
    schemas = ToolSchemas(tools)
    changes: list[Change] = []
    new_choices: list[Any] = []
    for position, ch in enumerate(choices):
        message = ch.get("message") if isinstance(ch, dict) else None
        if not isinstance(message, dict):
            new_choices.append(ch)
            continue
        ci = ch.get("index", position)
        ci = ci if isinstance(ci, int) else position
        acc = CallAccumulator()
        tool_calls = message.get("tool_calls")
        for i, tc in enumerate(tool_calls if isinstance(tool_calls, list) else []):
            acc.add({**tc, "index": tc.get("index", i)} if isinstance(tc, dict) else tc)
        content = message.get("content")
        parts = [Part(0, content)] if isinstance(content, str) and content else []
        if not acc.calls and not (schemas and parts):
            new_choices.append(ch)
            continue
        plan = plan_choice(
            acc.calls,
            [1] * len(acc.calls),
            parts,
            schemas,
            ch.get("finish_reason"),
            ci,
            True,
            f"{obj.get('id', '')}:{capture_id}",
            path_prefix="message",
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
        if plan.untouched:
            new_choices.append(ch)
            continue
        changes.extend(plan.changes)
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
        if message.get("tool_calls") and ch.get("finish_reason") == "stop":
            ch["finish_reason"] = "tool_calls"
            changes.append(finish_reason_change(ci))
        new_choices.append(ch)
    if not changes:
        return body, [], "untouched"
    return orjson.dumps({**obj, "choices": new_choices}), changes, "repaired"
