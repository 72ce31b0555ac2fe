"""One finish per choice on the Chat Completions stream (issue 31 item 11).

Some servers send a second finish chunk after `finish_reason: "tool_calls"` (a trailing `stop`). Clients
that keep the last finish reason they read (the AI SDK, openai-node's stream helper) then take the turn
for a text answer and drop its calls. The client gets one finish per choice: the first one that went
out (after the repair: the one that keeps the calls), and a later one is taken out of its chunk (the
chunk goes on when it carries anything else, a usage or content). Calls that go out for a choice after
its finish end with their own finish: that one is the one that keeps them.

This works on what the stage sends, whatever path it took (passed at once, released or rebuilt), and looks
inside an event only when its bytes hold a finish (`"finish_reason":"`), or a call after a finish.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.sse import EVENT_END, event_data, format_event
from tapfix.proxy.toolcalls.defects import FINISH_REPEATED
from tapfix.proxy.toolcalls.output import ENVELOPE_KEYS, chunk_json
from tapfix.proxy.toolcalls.plan_types import STAGE

_FINISHES = (b'"finish_reason":"', b'"finish_reason": "')


class OneFinish:
    """Per choice: whether its finish went out (and no call since). `out` filters what the stage sends."""

    __slots__ = ("changes", "defects", "finished", "noted")

    def __init__(self, changes: list[Change], defects: list[str]) -> None:
        self.finished: set[int] = set()
        self.changes = changes  # the stage's: what is dropped is recorded there
        self.defects = defects
        self.noted: set[int] = set()

    def out(self, events: list[bytes], nl: bytes) -> list[bytes]:
        if not events:
            return events
        kept: list[bytes] = []
        for event in events:
            finish = event.find(_FINISHES[0]) >= 0 or event.find(_FINISHES[1]) >= 0
            if not finish and not (self.finished and event.find(b'"tool_calls"') >= 0):
                kept.append(event)
                continue
            kept += self._one(event, nl)
        return kept

    def _one(self, event: bytes, nl: bytes) -> list[bytes]:
        data = event_data(event)
        obj = json_object(data) if data is not None and event.endswith(EVENT_END) else None
        choices = obj.get("choices") if obj is not None else None
        if obj is None or not isinstance(choices, list):
            return [event]
        new: list[Any] = []
        edited = False
        for ch in choices:
            if not isinstance(ch, dict):
                new.append(ch)
                continue
            ci = ch.get("index", 0) if isinstance(ch.get("index", 0), int) else 0
            delta: dict[str, Any] = ch["delta"] if isinstance(ch.get("delta"), dict) else {}
            if delta.get("tool_calls"):
                self.finished.discard(ci)  # calls after the finish: they end with their own
            finish = ch.get("finish_reason")
            if not isinstance(finish, str) or not finish:
                new.append(ch)
                continue
            if ci not in self.finished:
                self.finished.add(ci)
                new.append(ch)
                continue
            edited = True
            self._note(ci, finish)
            ch = {**ch, "finish_reason": None}
            if any(v not in (None, "", [], {}) for v in delta.values()) or ch.get("logprobs"):
                new.append(ch)
        if not edited:
            return [event]
        if not new and set(obj) <= {*ENVELOPE_KEYS, "choices"}:
            return []  # nothing but the repeated finish: the chunk goes
        return [format_event(chunk_json({**obj, "choices": new}), nl)]

    def _note(self, ci: int, finish: str) -> None:
        if ci in self.noted:
            return
        self.noted.add(ci)
        if FINISH_REPEATED not in self.defects:
            self.defects.append(FINISH_REPEATED)
        reason = "a second finish after the choice's finish went out: dropped, one finish per choice (the first)"
        self.changes.append(Change(STAGE, FINISH_REPEATED, f"$.choices[{ci}].finish_reason", finish, None, reason))
