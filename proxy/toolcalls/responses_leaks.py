"""Leaked tool-call markup on the Responses surface: the events and items a recovered call becomes.

A recovered call is a new `function_call` output item, streamed as a model's own call is
(`response.output_item.added` with a minted id and call_id, one `function_call_arguments.delta` with the
arguments, `.done`, `response.output_item.done`); the message item keeps the text outside the markup,
its `.done` forms and the terminal object's copy rewritten to what went out. The rules (what is held,
what counts as a call) are `evented_leaks.py`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.sse import named_event
from tapfix.proxy.toolcalls.cutoff import length_signs
from tapfix.proxy.toolcalls.evented_leaks import (
    LeakDetector,
    Leaked,
    TextHold,
    decode_raw,
    leak_change,
    raw_string,
    unpinned_change,
)
from tapfix.proxy.toolcalls.evented_stage import DenseIndex, IdLedger, as_dict, mint_id, parse
from tapfix.proxy.toolcalls.leaking_stage import LeakingStage
from tapfix.proxy.toolcalls.plan_types import Fatal

# The events that end a message item's text, in order.
_TEXT_ENDS = ("response.output_text.done", "response.content_part.done", "response.output_item.done")


@dataclass(slots=True)
class SentCall:
    """A function_call item as the client received it, next to what the upstream's events carried."""

    position: int
    item: dict[str, Any]  # the `.done` item that went out
    upstream: dict[str, Any]  # id, call_id, name, arguments as the upstream's events had them
    recovered: bool = False  # a call tapfix read out of leaked markup: the upstream's terminal never lists it


class ResponsesLeaks(LeakingStage):
    """The Responses stage's side of leaked markup: the open message item's hold, the reasoning kept for the
    end of the turn, and the recovered calls as items (`ResponsesToolCallRepair` is the rest of the stage)."""

    items: DenseIndex
    ids: IdLedger
    sent: list[SentCall]
    done_items: list[Any]
    seq: int
    cut_turn: bool  # max_tokens ended the response (known at its terminal event)

    def init_leaks(self, tool_format: str | None) -> None:
        self.leaks = LeakDetector(self.schemas, tool_format)
        self.text: TextHold | None = None  # the open message item's text hold
        self.text_key = ""
        self.text_obj: dict[str, Any] = {}  # the last text delta event (the template of a released one)
        self.texts: list[TextHold] = []
        self.sent_texts: dict[str, str] = {}  # message item -> its text as sent, where it differs
        self.after_text: dict[str, Leaked] = {}  # message item -> calls to send after its `.done`
        self.reasoning: list[bytes | str] = []
        self.summary: list[bytes | str] = []
        self.reasoning_key = ""
        self.inserted = 0  # items tapfix added: later upstream items move by this many
        self.upstream_calls = False

    def _renumber(self, event: bytes, obj: dict[str, Any] | None = None) -> bytes:  # pragma: no cover
        raise NotImplementedError

    # -- leaked markup (evented_leaks.py has the rules) ---------------------------------------------
    def _open_text(self, key: str) -> None:
        self.text = TextHold(self.leaks, at_start=not self.texts)
        self.text_key = key
        self.texts.append(self.text)

    def _text_delta(self, event: bytes) -> list[bytes]:
        """A text or reasoning delta: text goes through the hold (the fast path when it can't be markup);
        reasoning goes out as it came, kept for the end of the turn."""
        raw = raw_string(event, b'"delta":')
        if not event.startswith(b"event: response.output_text.delta"):
            store = self.summary if event.startswith(b"event: response.reasoning_summary") else self.reasoning
            if raw is not None:
                store.append(raw)
            elif (obj := parse(event)) is not None and isinstance(obj.get("delta"), str):
                store.append(obj["delta"])
            return [event]
        if self.text is None:
            self._open_text(self.text_key or "#text")
        hold = self.text
        assert hold is not None
        if raw is not None and hold.fast(raw):
            return [event]
        obj = parse(event)
        if obj is None or not isinstance(obj.get("delta"), str):
            return [event]
        self.text_obj = obj
        return hold.feed(event, obj["delta"])

    def _text_event(self, kind: str, obj: dict[str, Any], item: dict[str, Any], event: bytes) -> list[bytes] | None:
        """The end of the open message item's text (`.done` forms rewritten to what went out), and after its
        `output_item.done` the calls its markup held. None: not an event of the text item."""
        key = obj.get("item_id") or item.get("id")
        if kind == "response.output_item.added" and item.get("type") == "reasoning":
            self.reasoning_key = str(item.get("id") or "")
        if key != self.text_key or kind not in _TEXT_ENDS:
            return None
        out = self._end_text() if self.text is not None else []
        if self.ended:
            return out
        sent = self.sent_texts.get(self.text_key)
        if sent is not None:
            if kind == "response.output_text.done":
                obj = {**obj, "text": sent}
            elif kind == "response.content_part.done":
                obj = {**obj, "part": {**as_dict(obj.get("part")), "text": sent}}
            else:
                obj = {**obj, "item": with_text(item, sent)}
            event = named_event(kind, obj, self.nl)
        if kind == "response.output_item.done":
            self.done_items.append(obj.get("item"))
        out.append(self._renumber(event, obj))
        if kind == "response.output_item.done":
            leaked = self.after_text.pop(self.text_key, None)
            if leaked is not None:
                out += self._emit_calls(leaked, f"$.output[?(@.id=='{self.text_key}')].content", "text")
        return out

    def _end_text(self) -> list[bytes]:
        hold, self.text = self.text, None
        if hold is None:
            return []
        where = f"$.output[?(@.id=='{self.text_key}')].content"
        whole = hold.whole_text()
        leaked = hold.finish(where)
        if leaked is None:
            return []
        if leaked.fatal is None:
            sign = length_signs(whole, self.leaks.schemas, self.leaks.formats, hold.at_start, after_calls=False)
            if sign is not None:  # a call max_tokens cut, if that is what ends the response: wait for it
                self.wait_for_end(sign)
        if leaked.fatal is not None:
            if self.policy != "passthrough":
                return self.fatal(leaked.fatal)
            out = self.fatal(leaked.fatal)
            leaked = Leaked("", events=leaked.events)
        else:
            out = []
        for markup in leaked.flagged:
            self._flag_format(markup, where)
        if not leaked.calls:  # no call: the held events go out as they came
            return out + [self._renumber(e) for e in leaked.events]
        if leaked.text:
            template = self.text_obj or {"item_id": self.text_key, "content_index": 0, "output_index": 0}
            body = {**template, "type": "response.output_text.delta", "delta": leaked.text}
            body.pop("obfuscation", None)
            out.append(named_event("response.output_text.delta", body, self.nl))
        if leaked.calls:
            self.sent_texts[self.text_key] = hold.sent_text()
            self.after_text[self.text_key] = leaked
        return out

    def _end_turn(self) -> list[bytes]:
        """At the terminal event: a text item left open is ended; markup last in the reasoning, with no text
        and no call in the turn, becomes calls (the reasoning itself already went out)."""
        out = self._end_text()
        for key, pending in list(self.after_text.items()):
            del self.after_text[key]
            out += self._emit_calls(pending, f"$.output[?(@.id=='{key}')].content", "text")
        if self.ended or self.upstream_calls or self.sent or not (self.reasoning or self.summary):
            return out
        if any(h.sent_text().strip() for h in self.texts):
            return out
        text = "".join(p if isinstance(p, str) else decode_raw(p) for p in (self.reasoning or self.summary))
        where = f"$.output[?(@.id=='{self.reasoning_key}')].content"
        return self._reasoning_calls(out, text, where)

    def new_calls(self, calls: list[tuple[str, str]]) -> list[bytes]:
        """Calls tapfix read out of text, as items of their own after the items so far."""
        return self.new_calls_at([(len(self.items.positions) + k, name, args) for k, (name, args) in enumerate(calls)])

    def new_calls_at(self, calls: list[tuple[int, str, str]]) -> list[bytes]:
        """Calls tapfix read out of text or split off another call's arguments, as items of their own at the
        given output positions (made free for them; ids minted; the terminal object will list them)."""
        out: list[bytes] = []
        for position, name, arguments in calls:
            iid = item_id(self.capture_id, position)
            self.items.positions[iid] = position
            self.items.shifted = True
            self.inserted += 1
            call_id, _ = self.ids.assign(None, position)
            out += call_events(iid, call_id, name, arguments, position, self.seq, self.nl)
            item = call_item(iid, call_id, name, arguments, True)
            self.done_items.append(item)
            self.sent.append(SentCall(position, item, {}, recovered=True))
        return out


def item_id(seed: str, position: int) -> str:
    return "fc_" + hashlib.sha1(f"{seed}:leak:{position}".encode()).hexdigest()[:24]


def call_item(iid: str, call_id: str, name: str, arguments: str, done: bool) -> dict[str, Any]:
    status = "completed" if done else "in_progress"
    return {
        "id": iid,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments if done else "",
        "status": status,
    }


def call_events(iid: str, call_id: str, name: str, arguments: str, position: int, seq: int, nl: bytes) -> list[bytes]:
    """The four events of one recovered call (sequence numbers continue the one before them)."""
    where = {"item_id": iid, "output_index": position}
    bodies = [
        ("response.output_item.added", {"output_index": position, "item": call_item(iid, call_id, name, "", False)}),
        ("response.function_call_arguments.delta", {**where, "delta": arguments}),
        ("response.function_call_arguments.done", {**where, "name": name, "arguments": arguments}),
        (
            "response.output_item.done",
            {"output_index": position, "item": call_item(iid, call_id, name, arguments, True)},
        ),
    ]
    return [named_event(kind, {"type": kind, "sequence_number": seq, **body}, nl) for kind, body in bodies]


def with_text(item: dict[str, Any], text: str) -> dict[str, Any]:
    """A message item whose output_text is `text` (the first output_text part carries it, others emptied)."""
    content, placed = [], False
    for part in item.get("content") or []:
        if isinstance(part, dict) and part.get("type") == "output_text":
            part = {**part, "text": "" if placed else text}
            placed = True
        content.append(part)
    if not placed:
        content.append({"type": "output_text", "text": text, "annotations": []})
    return {**item, "content": content}


def patch_texts(output: list[Any], texts: dict[str, str]) -> list[Any]:
    """The terminal object's message items with the texts the events carried."""
    if not texts:
        return output
    return [
        with_text(item, texts[item["id"]])
        if isinstance(item, dict) and item.get("type") == "message" and item.get("id") in texts
        else item
        for item in output
    ]


def message_text(item: dict[str, Any]) -> str:
    parts = item.get("content") or []
    return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def reasoning_text(item: dict[str, Any]) -> str:
    text = message_text(item)
    if text:
        return text
    return "".join(
        p["text"] for p in item.get("summary") or [] if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def leak_output(
    output: list[Any], detector: LeakDetector, capture_id: str, changes: list[Change]
) -> tuple[list[Any], Fatal | None]:
    """A non-streamed `output` with markup in its message text (and, when nothing follows it, at the end of
    the reasoning) turned into function_call items after the item it came from."""
    if not detector.active:
        return output, None
    new: list[Any] = []
    first_text = True
    pinned = detector.formats.names
    edited: list[str] = []

    def add_calls(leaked: Leaked, where: str, what: str) -> None:
        edited.append(where)
        for name, arguments in leaked.calls:
            position = len(new)
            call_id = mint_id("call_", f"{capture_id}:leak", position)
            new.append(call_item(item_id(capture_id, position), call_id, name, arguments, True))
        changes.append(leak_change(leaked, where, what))

    for position, item in enumerate(output):
        where = f"$.output[{position}]"
        if not isinstance(item, dict) or item.get("type") != "message":
            new.append(item)
            continue
        text = message_text(item)
        leaked = detector.read(text, 0, first_text, where) if text else None
        first_text = first_text and not text
        if leaked is not None and leaked.fatal is not None:
            changes.append(Change("toolcalls", leaked.fatal.kind, where, text, None, leaked.fatal.reason))
            return output, leaked.fatal
        if leaked is None or not leaked.calls:
            if leaked is not None:
                changes.extend(unpinned_change(m, f"{where}.content", pinned) for m in leaked.flagged)
            new.append(item)
            continue
        new.append(with_text(item, leaked.text))
        add_calls(leaked, f"{where}.content", "text")
    if any(isinstance(i, dict) and i.get("type") == "function_call" for i in output) or any(
        isinstance(i, dict) and i.get("type") == "message" and message_text(i).strip() for i in new
    ):
        return (new if edited else output), None
    reasoning = [(k, i) for k, i in enumerate(output) if isinstance(i, dict) and i.get("type") == "reasoning"]
    if reasoning:
        k, item = reasoning[-1]
        leaked = detector.reasoning(reasoning_text(item), f"$.output[{k}]")
        if leaked is not None and leaked.fatal is not None:
            return output, leaked.fatal
        if leaked is not None and leaked.calls:
            add_calls(leaked, f"$.output[{k}].content", "reasoning")
        elif leaked is not None:
            changes.extend(unpinned_change(m, f"$.output[{k}].content", pinned) for m in leaked.flagged)
    return (new if edited else output), None
