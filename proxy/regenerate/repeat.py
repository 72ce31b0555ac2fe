"""What a from-scratch attempt must not say again (issue 19, Chat Completions).

A later attempt sent from scratch (a fresh seed, no continuation) writes its own text before its call. The
client already read attempt 1's; reading a second opening would make the turn say everything twice. The
rule, the same on every surface (evented_seam.py for Responses and Messages): content or reasoning of a
kind the client already received is not repeated, the new attempt's tool calls and finish go out. It runs
after the attempt's own stages, so text that held a leaked call has been turned into a call first.
"""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.regenerate.continuation import STAGE, Received
from tapfix.proxy.sse import event_data, format_event

_FIELDS = {"content": ("content",), "reasoning": ("reasoning_content", "reasoning")}


def repeated_kinds(received: Received) -> tuple[str, ...]:
    """The kinds of text ("content", "reasoning") the client already has, which a from-scratch attempt drops."""
    return tuple(kind for kind, text in (("content", received.content), ("reasoning", received.reasoning)) if text)


def repeat_changes(kinds: tuple[str, ...], number: int) -> list[Change]:
    reason = f"attempt {number} starts from scratch: text of a kind the client already has is not repeated"
    return [Change(STAGE, "drop", f"attempt[{number}].{kind}", None, None, reason) for kind in kinds]


class RepeatDrop:
    """Last stage of a from-scratch attempt: takes the dropped kinds out of every delta, and drops a chunk
    that is left with nothing to say."""

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.keys = frozenset(key for kind in kinds for key in _FIELDS[kind])

    def feed(self, event: bytes) -> list[bytes]:
        data = event_data(event)
        if not self.keys or data is None or not any(b'"' + k.encode() + b'"' in data for k in self.keys):
            return [event]
        obj = json_object(data)
        choices = obj.get("choices") if obj else None
        if obj is None or not isinstance(choices, list):
            return [event]
        changed = False
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict):
                for key in self.keys & delta.keys():
                    del delta[key]
                    changed = True
        if not changed:
            return [event]
        if all(_silent(choice) for choice in choices) and not obj.get("usage"):
            return []
        return [format_event(orjson.dumps(obj), b"\r\n" if event.endswith(b"\r\n\r\n") else b"\n")]

    def flush(self) -> list[bytes]:
        return []


def _silent(choice: Any) -> bool:
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    return not isinstance(delta, dict) or set(delta) <= {"role"}
