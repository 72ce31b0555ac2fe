"""Writing the events that replace held ones: the upstream's envelope and framing, whole calls.

Each repaired call goes out whole in one chunk (all agents accept that, clients.md §8 row 3), with the
first envelope of the stream (one stable response id) and the upstream's line endings. In prefix mode
(prefix.py) a call whose start was already streamed gets only its remaining arguments instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.sse import EVENT_END, event_data, format_event
from tapfix.proxy.toolcalls.plan_types import ChoicePlan, OutCall

ENVELOPE_KEYS = ("id", "object", "created", "model", "system_fingerprint")


@dataclass(slots=True)
class Item:
    raw: bytes
    obj: dict[str, Any] | None
    parts: dict[int, int] = field(default_factory=dict)  # choice -> index into that choice's parts


class Writer:
    __slots__ = ("envelope", "nl")

    def __init__(self) -> None:
        self.envelope: dict[str, Any] = {}
        self.nl = b"\n"

    def rebuild(
        self,
        held: list[Item],
        plans: dict[int, ChoicePlan],
        synthesize_finish: bool,
        strip_all: bool = False,
    ) -> list[bytes]:
        out: list[bytes] = []
        cut: list[bytes] = []  # an event the stream ended inside: nothing may follow it, or it merges
        inserted: set[int] = set()
        for item in held:
            if item.obj is None:
                if strip_all and event_data(item.raw) is not None:
                    # Data that isn't JSON in a discarded message: mostly the event a reset cut inside a
                    # call. The client would read it as broken JSON instead of the error that follows.
                    continue
                (out if item.raw.endswith(EVENT_END) else cut).append(item.raw)
                continue
            dirty = False
            before: list[bytes] = []
            new_choices = []
            choices = item.obj.get("choices")
            for ch in choices if isinstance(choices, list) else []:
                ci = ch.get("index", 0) if isinstance(ch, dict) else 0
                plan = plans.get(ci if isinstance(ci, int) else 0)
                if not isinstance(ch, dict) or (not strip_all and (plan is None or plan.untouched)):
                    new_choices.append(ch)
                    continue
                ch = dict(ch)
                delta = dict(ch["delta"]) if isinstance(ch.get("delta"), dict) else {}
                if "tool_calls" in delta and (strip_all or (plan and not plan.structured_clean)):
                    del delta["tool_calls"]
                    dirty = True
                part = item.parts.get(ci)
                if plan is not None and part is not None and part in plan.content_edits:
                    delta["content"] = plan.content_edits[part]
                    dirty = True
                ch["delta"] = delta
                finish = ch.get("finish_reason")
                if strip_all and finish:
                    ch["finish_reason"] = None
                    dirty = True
                elif plan is not None and finish:
                    if plan.calls and ci not in inserted:
                        before += self.call_events(ci, plan.calls)
                        inserted.add(ci)
                    if plan.finish_edit is not None and finish != plan.finish_edit:
                        ch["finish_reason"] = plan.finish_edit  # the plan recorded the change
                        dirty = True
                if _empty(ch):
                    dirty = True
                    continue
                new_choices.append(ch)
            out += before
            if not dirty:
                out.append(item.raw)
            elif new_choices or any(k not in (*ENVELOPE_KEYS, "choices") for k in item.obj):
                out.append(format_event(chunk_json({**item.obj, "choices": new_choices}), self.nl))
        for ci, plan in plans.items():
            if plan.calls and ci not in inserted:
                out += self.call_events(ci, plan.calls)
                if synthesize_finish:
                    out.append(self.chunk(ci, {}, "tool_calls"))
        return out + cut

    def call_events(self, ci: int, calls: list[OutCall]) -> list[bytes]:
        """Whole calls; a continued call (prefix mode) only as its remaining arguments, if any."""
        return [self.call_event(ci, c) for c in calls if c.arguments or not c.continued]

    def call_event(self, ci: int, call: OutCall) -> bytes:
        tool: dict[str, Any]
        if call.continued:
            tool = {"index": call.index, "function": {"arguments": call.arguments}}
        else:
            tool = {
                "index": call.index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        return self.chunk(ci, {"tool_calls": [tool]}, None)

    def chunk(self, ci: int, delta: dict[str, Any], finish: str | None) -> bytes:
        body = {**self.envelope, "choices": [{"index": ci, "delta": delta, "finish_reason": finish}]}
        return format_event(chunk_json(body), self.nl)


def chunk_json(obj: Any) -> bytes:
    """orjson refuses lone surrogates (a `\\ud83d` cut from its pair, kept by a repair); escape them."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def _empty(ch: dict[str, Any]) -> bool:
    if ch.get("finish_reason") or ch.get("logprobs"):
        return False
    delta = ch.get("delta") or {}
    return not any(v not in (None, "", [], {}) for v in delta.values())
