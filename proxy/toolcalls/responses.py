"""Tool-call repair for the OpenAI Responses stream (`/v1/responses`, what Codex speaks).

A call is a `function_call` output item: `response.output_item.added` (name, call_id, empty
arguments) → `response.function_call_arguments.delta` × n → `.done` (the whole arguments again) →
`response.output_item.done` (the item with its arguments). From the first call's `.added` to the
terminal `response.completed` every event is held (no call goes out in a turn that a later cut call
ends with the error); a call whose arguments are valid JSON that fits the schema is released byte
for byte. A repaired call goes out as the same events with one delta carrying the repaired
arguments, the `.done` events rewritten to match, and the terminal `response.completed` patched so
a client reading the final object sees the same call.

Unrecoverable (policy "error"): the held call is dropped and the stream ends with an `error` event
— whose data also carries an `error` object, which is what makes the openai SDK raise `APIError`
(`_streaming.py` raises on any event whose data has a truthy `error`) — then a `response.failed`
event (what Codex reads; it retries a failed response). Retry words as in clients.md §8.

The terminal object's reconciliation is `responses_terminal.py`; a non-streamed body is repaired by
`responses_body.py`, with the same judging.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.errors import responses_tool_call_error_events
from tapfix.proxy.sse import named_event
from tapfix.proxy.toolcalls.cutoff import Sign, cut_off, quote
from tapfix.proxy.toolcalls.defects import WRONG_INDEX
from tapfix.proxy.toolcalls.evented_stage import (
    DenseIndex,
    HeldCall,
    IdLedger,
    Verdict,
    as_dict,
    decide,
    event_name,
    make_room,
    parse,
)
from tapfix.proxy.toolcalls.plan_types import Fatal, cut_by_upstream_error
from tapfix.proxy.toolcalls.responses_leaks import ResponsesLeaks, SentCall, patch_texts
from tapfix.proxy.toolcalls.responses_terminal import reconcile_output, without_gaps

# Text and reasoning deltas, most of a stream's events: they never open, carry or end a call.
_TEXT_DELTAS = (
    b"event: response.output_text.delta",
    b"event: response.reasoning_text.delta",
    b"event: response.reasoning_summary_text.delta",
)


class ResponsesToolCallRepair(ResponsesLeaks):
    """Per call: hold, judge, release. Per answer: output_index dense over the items in order of first
    appearance, one unique call_id per function_call item (the `.added` one, minted when missing or used),
    and the terminal `response.completed`/`.incomplete` object listing the calls the events carried."""

    path_prefix = "$.output"

    def init_surface(self, capture_id: str) -> None:
        self.repaired: dict[str, tuple[str | None, str | None, str | None]] = {}  # key -> (arguments, name, call_id)
        self.response: dict[str, Any] = {}  # the latest response envelope (for response.failed)
        self.done_items: list[Any] = []
        self.sent: list[SentCall] = []
        self.items = DenseIndex()
        self.ids = IdLedger("call_", capture_id)
        self.split_ids: dict[str, Any] = {}  # item -> the other call_id its `.done` carried than its `.added`
        self.room: dict[Any, list[tuple[int, str, str]]] = {}  # item -> the calls split off it, at their places
        self.seq = 0

    def on_event(self, event: bytes) -> list[bytes]:
        if event.startswith(_TEXT_DELTAS) and self.leaks.active:
            self._track_seq(event)
            out = self._text_delta(event)
            if self.items.shifted:
                out = [self._renumber(e) for e in out]
            if self.holding:
                self.held += out
                return []
            return out
        if not self.calls and event.startswith(_TEXT_DELTAS):  # the hot events: one prefix check
            self._track_seq(event)
            return [self._renumber(event)] if self.items.shifted else [event]
        interesting = (
            self.leaks.active
            or self.holding
            or event.find(b"function_call") >= 0
            or event.find(b"output_item.added") >= 0
            or event.find(b"response.completed") >= 0
            or event.find(b"response.incomplete") >= 0
            or event.find(b"response.created") >= 0
        )
        if not interesting:
            self._track_seq(event)
            return [self._renumber(event)] if self.items.shifted else [event]
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
        leaked: list[bytes] = []
        if kind in ("response.completed", "response.incomplete"):
            self.cut_turn = kind == "response.incomplete"
        if self.leaks.active:
            if kind in ("response.completed", "response.incomplete"):
                leaked = self._end_turn()
                if self.until_end is not None and not self.ended:
                    self.until_end += leaked
                    leaked = self.settle(self.cut_turn)
                if self.ended:
                    return leaked
                if self.holding:
                    self.held += leaked
                    leaked = []
            else:
                done = self._text_event(str(kind), obj, item, event)
                if done is not None:
                    if self.holding and not self.ended:
                        self.held += done
                        return []
                    return done
        if kind == "response.output_item.added":
            if item.get("type") == "function_call":
                self.upstream_calls = True
            elif item.get("type") == "message" and self.leaks.active:
                self._open_text(self._key(obj, item))
            position = self._place(obj, item)
            if item.get("type") == "function_call":
                self.texts_before_call = len(self.texts)
                key = self._key(obj, item)
                opened = self.calls[key] = HeldCall(key, item.get("name") or None, item.get("call_id") or None)
                opened.position = position
                opened.out_id, opened.id_reason = self.ids.assign(opened.call_id, position)
                self.held.append(event)
                return []
            return self.hold(self._renumber(event, obj))
        if not self.holding:
            if kind in ("response.completed", "response.incomplete"):
                return leaked + [self._terminal(event, obj)]
            if kind == "response.output_item.done":
                self.done_items.append(item)
            return [self._renumber(event, obj)]
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
            if item.get("call_id") != call.out_id:  # one call_id per item: the `.added` one the client got
                self.split_ids[call.key] = item.get("call_id")
            call.closed = True
        elif kind in ("error", "response.failed"):
            message = _message(obj)
            self.note_upstream_error(message)
            call = next(iter(self.calls.values()))
            return self.fatal(
                Fatal(call.name or "?", cut_by_upstream_error(message), "missing_last_chunk"), upstream=event
            )
        elif kind in ("response.completed", "response.incomplete"):
            sign = self._calls_cut() if self.cut_turn else None
            if sign is not None:
                return self.fatal(cut_off(sign))
            for c in self.calls.values():
                c.closed = True
                if kind == "response.incomplete":
                    c.finish = "length"
            out = self._finalize()
            if self.ended:
                return out
            return out + [self._terminal(event, obj)]
        self.held.append(event)
        return []

    def _calls_cut(self) -> Sign | None:
        """With function_call items held when max_tokens ended the response: an item whose
        `output_item.done` never came (a further call cut, even one whose arguments read whole), or text
        after the last call."""
        unclosed = [c for c in self.calls.values() if not c.closed]
        if unclosed:
            return Sign("the stream stopped inside a function_call item (no output_item.done)", unclosed[-1].name)
        after = "".join(h.whole_text() for h in self.texts[self.texts_before_call :])
        if after.strip():
            return Sign(f"text after the last complete call: {quote(after)}", list(self.calls.values())[-1].name)
        return None

    def _track_seq(self, event: bytes) -> None:
        at = event.find(b'"sequence_number":')
        if at >= 0:
            digits = event[at + 18 : at + 30].lstrip().split(b",")[0].split(b"}")[0]
            if digits.isdigit():
                self.seq = int(digits)

    @staticmethod
    def _key(obj: dict[str, Any], item: dict[str, Any]) -> str:
        return str(item.get("id") or obj.get("item_id") or f"#{obj.get('output_index')}")

    def _place(self, obj: dict[str, Any], item: dict[str, Any]) -> int:
        """The item's dense output_index (first appearance), recorded when the upstream numbered it otherwise."""
        given = obj.get("output_index")
        shifted = given + self.inserted if isinstance(given, int) and not isinstance(given, bool) else given
        position, moved = self.items.position(self._key(obj, item), shifted)
        if moved:
            reason = "output_index not dense from 0 in order of the items; renumbered"
            self.record(
                WRONG_INDEX, f"$.output[{position}]", {"output_index": given}, {"output_index": position}, reason
            )
        return position

    def _renumber(self, event: bytes, obj: dict[str, Any] | None = None) -> bytes:
        """The event with its item's dense output_index (cheap when nothing was renumbered)."""
        if not self.items.shifted or b'"output_index"' not in event:
            return event
        obj = obj if obj is not None else parse(event)
        if obj is None:
            return event
        renumbered = self._renumbered(obj)
        if renumbered is obj:
            return event
        return named_event(str(obj.get("type") or event_name(event)), renumbered, self.nl)

    def _renumbered(self, obj: dict[str, Any]) -> dict[str, Any]:
        given = obj.get("output_index")
        if not isinstance(given, int):
            return obj
        key = self._key(obj, as_dict(obj.get("item")))
        position = self.items.positions.get(key)
        if position is None:
            position, _ = self.items.position(key, given)
        return obj if position == given else {**obj, "output_index": position}

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
            if self.policy == "passthrough":  # the held calls go out as sent: the terminal keeps them so
                for call in self.calls.values():
                    call.out_id = call.call_id
                self._remember({key: Verdict() for key in self.calls})
            return self.fatal(fatal)
        rebuild = self.items.shifted
        for key, verdict in verdicts.items():
            call = self.calls[key]
            where = f"$.output[?(@.id=='{key}')]"
            rebuild_call = self.judge(verdict, call, f"{where}.arguments")
            if key in self.split_ids:
                reason = "the .done item carried another call_id than the .added one; the .added one kept"
                after = {"call_id": call.out_id}
                self.record(WRONG_INDEX, f"{where}.call_id", {"call_id": self.split_ids[key]}, after, reason)
                rebuild_call = True
            if rebuild_call:
                self.repaired[key] = (verdict.arguments, verdict.name, call.out_id)
                rebuild = True
        self.room = make_room(self.calls, verdicts, self.items)
        out = self._rebuild(self.held) if rebuild else self.held
        for left in self.room.values():  # an item that never saw its `.done`: its glued calls still follow
            out += self.new_calls_at(left)
        self.room = {}
        self._remember(verdicts)
        self.held, self.calls = [], {}
        return out

    def _remember(self, verdicts: dict[str, Verdict]) -> None:
        """What each released call looks like to the client, for the terminal object."""
        for key, call in self.calls.items():
            verdict = verdicts[key]
            upstream_args = "".join(call.frags) if call.frags else (call.final or "")
            upstream = {"id": key, "call_id": call.call_id, "name": call.name, "arguments": upstream_args}
            item = {
                "id": key,
                "type": "function_call",
                "call_id": call.out_id,
                "name": verdict.name or call.name,
                "arguments": verdict.arguments if verdict.arguments is not None else upstream_args,
                "status": "completed",
            }
            self.sent.append(SentCall(call.position, item, upstream))

    def _rebuild(self, held: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        sent_delta: set[str] = set()
        for raw in held:
            obj = parse(raw)
            if obj is None:
                out.append(raw)
                continue
            kind = str(obj.get("type") or event_name(raw))
            item = as_dict(obj.get("item"))
            key = obj.get("item_id") or item.get("id")
            if key not in self.repaired:
                out.append(self._renumber(raw, obj))
                continue
            obj = self._renumbered(obj)
            arguments, name, call_id = self.repaired[key]
            if kind == "response.function_call_arguments.delta":
                if arguments is None:
                    out.append(named_event(kind, obj, self.nl))
                elif key not in sent_delta:
                    sent_delta.add(key)
                    out.append(named_event(kind, {**obj, "delta": arguments}, self.nl))
                continue
            if kind == "response.function_call_arguments.done":
                if arguments is not None and key not in sent_delta:  # no delta came: the client still gets one
                    sent_delta.add(key)
                    delta = {k: v for k, v in obj.items() if k not in ("arguments", "name")}
                    out.append(
                        named_event(
                            "response.function_call_arguments.delta",
                            {**delta, "type": "response.function_call_arguments.delta", "delta": arguments},
                            self.nl,
                        )
                    )
                if arguments is not None:
                    obj = {**obj, "arguments": arguments}
                if name and "name" in obj:
                    obj["name"] = name
                out.append(named_event(kind, obj, self.nl))
                continue
            if kind in ("response.output_item.added", "response.output_item.done"):
                new_item = {**item, "call_id": call_id}
                if name:
                    new_item["name"] = name
                if kind.endswith(".done"):
                    if arguments is not None:
                        new_item["arguments"] = arguments
                    self.done_items.append(new_item)
                out.append(named_event(kind, {**obj, "item": new_item}, self.nl))
                if kind.endswith(".done"):
                    out += self.new_calls_at(self.room.pop(key, []))
                continue
            out.append(named_event(kind, obj, self.nl))
        return out

    def _terminal(self, event: bytes, obj: dict[str, Any]) -> bytes:
        """The final object made to list the function calls the events carried (a client reading only it
        runs the same calls): repaired, renamed or re-identified calls patched, a call it lacks inserted,
        one the events never carried dropped. Agreement leaves the event's bytes as they came."""
        response = obj.get("response")
        if not isinstance(response, dict) or not isinstance(response.get("output"), list):
            return event
        output, disagreements = reconcile_output(response["output"], self.sent)
        output = patch_texts(output, self.sent_texts)
        if output == response["output"]:
            return event
        for what in disagreements:
            self.record(WRONG_INDEX, "$.response.output", what[0], what[1], what[2])
        kind = obj.get("type") or event_name(event) or "response.completed"
        return named_event(kind, {**obj, "response": {**response, "output": output}}, self.nl)

    def error_events(self, fatal: Fatal, held: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        keep = without_gaps([self._renumber(raw) for raw in held], self.nl)
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
        return keep, events


def _message(obj: dict[str, Any]) -> str:
    error = obj.get("error")
    if not isinstance(error, dict) and isinstance(obj.get("response"), dict):
        error = obj["response"].get("error")
    if isinstance(error, dict) and isinstance(message := error.get("message"), str):
        return message
    return str(obj.get("message") or "")
