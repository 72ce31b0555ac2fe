"""What a from-scratch attempt must not say again (issue 19, Chat Completions).

A later attempt sent from scratch (a fresh seed, no continuation) writes its own text before its call. The
client already read attempt 1's; reading a second opening would make the turn say everything twice. The
rule, the same on every surface (evented_seam.py for Responses and Messages): content or reasoning of a
kind the client already received is not repeated, the new attempt's tool calls and finish go out. An
attempt that answers in text alone (no call) is the exception: its text is the answer, so it goes out,
after what the client already read (it is held until the attempt calls a tool or finishes). It runs after
the attempt's own stages, so text that held a leaked call has been turned into a call first.
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
    that is left with nothing to say. Only once the attempt calls a tool, though: until then its text is
    held, and an attempt that finishes without a call (it answers in text) sends it, after what the
    client already read, since that text is its answer. `changes` (the attempt's regenerate rows) gets
    a `drop` row per kind when text is dropped."""

    def __init__(self, kinds: tuple[str, ...], number: int = 0, changes: list[Change] | None = None) -> None:
        self.kinds = kinds
        self.keys = frozenset(key for kind in kinds for key in _FIELDS[kind])
        self.number = number
        self.changes = changes if changes is not None else []
        self.held: list[bytes] = []  # text events of this attempt, until it calls a tool or finishes
        self.calling = False  # a tool call came: from here text of the dropped kinds is dropped
        self.recorded = False

    def feed(self, event: bytes) -> list[bytes]:
        data = event_data(event)
        if not self.keys or data is None:
            return [event]
        if data.strip() == b"[DONE]":
            return [*self._release(), event]
        obj = json_object(data)
        choices = obj.get("choices") if obj else None
        if obj is None or not isinstance(choices, list):
            return [event]
        deltas: list[dict[str, Any]] = [
            c["delta"] for c in choices if isinstance(c, dict) and isinstance(c.get("delta"), dict)
        ]
        if not self.calling and any(d.get("tool_calls") for d in deltas):
            self.calling = True
            self._drop(bool(self.held))
            self.held = []
        if not self.calling:
            if any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
                return [*self._release(), event]  # it answered without a call: its text is the answer
            if any(self.keys & d.keys() for d in deltas):
                self.held.append(event)
                return []
            return [event]
        changed = False
        for delta in deltas:
            for key in self.keys & delta.keys():
                del delta[key]
                changed = True
        if not changed:
            return [event]
        self._drop(True)
        if all(_silent(choice) for choice in choices) and not obj.get("usage"):
            return []
        return [format_event(orjson.dumps(obj), b"\r\n" if event.endswith(b"\r\n\r\n") else b"\n")]

    def flush(self) -> list[bytes]:
        """The attempt ended with neither a call nor a finish (it broke off, or its call was held back as
        unrecoverable): what it said before is no answer, and the client has its own text."""
        self._drop(bool(self.held))
        self.held = []
        return []

    def _release(self) -> list[bytes]:
        out, self.held = self.held, []
        return out

    def _drop(self, dropped: bool) -> None:
        if dropped and not self.recorded:
            self.recorded = True
            self.changes.extend(repeat_changes(self.kinds, self.number))


def _silent(choice: Any) -> bool:
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    return not isinstance(delta, dict) or set(delta) <= {"role"}
