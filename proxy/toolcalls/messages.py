"""Tool-call repair for the Anthropic Messages stream (`/v1/messages`, what Claude Code speaks).

A call is a `tool_use` content block: `content_block_start` (id, name, `input: {}`) →
`content_block_delta` with `input_json_delta.partial_json` × n → `content_block_stop`. From the first
tool_use block on, every event (later blocks and `ping`s too) is held until the message ends
(`message_delta`), so no call goes out in a turn that a later cut call ends with the error; valid JSON that fits the
`input_schema` is released byte for byte. A block with no `partial_json` at all means `{}` (the
SDKs read it so), so it is valid unless the schema requires something. A repaired call goes out as
its start event, one `input_json_delta` with the repaired arguments, and its stop event.

Unrecoverable (policy "error"): the held block is dropped and the stream ends with
`event: error` / `{"type": "error", "error": {"type": "api_error", "message": "upstream server
error: …"}}`. The anthropic SDK raises `APIStatusError` on any `event: error` (`_streaming.py`,
via `make_status_error`); "api_error" and "server error" are what clients read as transient.
"fail_fast" uses `invalid_request_error` and a message without retry words.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.errors import messages_tool_call_error
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.sse import named_event
from tapfix.proxy.toolcalls.cutoff import Sign, cut_off, quote, turn_sign
from tapfix.proxy.toolcalls.defects import EMPTY_TURN, FINISH_MISMATCH, WRONG_INDEX
from tapfix.proxy.toolcalls.evented_leaks import (
    LeakDetector,
)
from tapfix.proxy.toolcalls.evented_stage import (
    DenseIndex,
    HeldCall,
    IdLedger,
    as_dict,
    decide,
    fatal_change,
    make_room,
    normalize_tools,
    parse,
    repair_change,
    unknown_tool_change,
)
from tapfix.proxy.toolcalls.messages_leaks import MessagesLeaks, leak_content
from tapfix.proxy.toolcalls.plan_types import STAGE, Fatal, cut_by_upstream_error
from tapfix.proxy.toolcalls.schema import ToolSchemas
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy

_ENDS_WITH_CALLS = ("end_turn", "stop_sequence", "max_tokens")  # corrected to tool_use when a tool_use went out


class MessagesToolCallRepair(MessagesLeaks):
    """Per call: hold, judge, release. Per message: content-block indexes dense from 0 in order of their
    `content_block_start`, one unique id per tool_use block (minted when missing or used), and
    `stop_reason: tool_use` if and only if a tool_use block went out. The calls are held until the
    message ends, so a `max_tokens` stop judges them as possibly cut."""

    path_prefix = "$.content"

    def init_surface(self, capture_id: str) -> None:
        self.repaired: dict[int, tuple[str | None, str | None, str | None]] = {}  # index -> (arguments, name, id)
        self.blocks = DenseIndex()
        self.ids = IdLedger("toolu_", capture_id)
        self.tool_use_sent = False

    def on_event(self, event: bytes) -> list[bytes]:
        if self.leaks.active and event.startswith(b"event: content_block_delta"):
            text_out = self._text_delta(event)
            if text_out is not None:
                if self.blocks.shifted:
                    text_out = [self._renumber(e) for e in text_out]
                if self.holding:
                    self.held += text_out
                    return []
                return text_out
        if not self.calls and event.startswith(b"event: content_block_delta"):  # the hot event: one prefix check
            return [self._renumber(event)] if self.blocks.shifted else [event]
        if (
            not self.holding
            and not self.leaks.active
            and event.find(b"tool_use") < 0
            and event.find(b"content_block_start") < 0
            and event.find(b"message_delta") < 0
        ):
            return [self._renumber(event)] if self.blocks.shifted else [event]
        obj = parse(event)
        if obj is None:
            return self.hold(event)
        kind = obj.get("type")
        index = obj.get("index")
        block = as_dict(obj.get("content_block"))
        if self.leaks.active:
            leak_out = self._leak_event(kind, index, block, event, obj)
            if leak_out is not None:
                if self.holding and not self.ended:
                    self.held += leak_out
                    return []
                return leak_out
        if kind == "content_block_start" and isinstance(index, int):
            position = self._place(index)
            if block.get("type") == "tool_use":
                self.upstream_calls = True
                self.texts_before_call = len(self.texts)
                opened = self.calls[index] = HeldCall(index, block.get("name") or None, block.get("id") or None)
                opened.position = position
                opened.out_id, opened.id_reason = self.ids.assign(block.get("id"), position)
                self.held.append(event)
                return []
            return self.hold(self._renumber(event, obj))
        if kind == "message_delta":
            delta = as_dict(obj.get("delta"))
            stop = delta.get("stop_reason")
            self.cut_turn = stop == "max_tokens"
            released: list[bytes] = self._end_turn() if self.leaks.active else []
            if self.until_end is not None and not self.ended:
                self.until_end += released
                released = self.settle(self.cut_turn)
            if self.ended:
                return released
            if self.holding:
                self.held += released
                released = []
            if self.holding:  # the message ended with calls held: judge them on what arrived
                sign = self._calls_cut() if self.cut_turn else None
                if sign is not None:
                    return self.fatal(cut_off(sign))
                for c in self.calls.values():
                    c.closed = True
                    c.finish = "length" if self.cut_turn else c.finish
                released = self._finalize()
                if self.ended:
                    return released
            return released + self._stop_reason(event, obj, delta, stop)
        if not self.holding:
            return [self._renumber(event, obj)]
        call = self.calls.get(index) if isinstance(index, int) else None
        if kind == "content_block_delta" and call is not None:
            piece = as_dict(obj.get("delta")).get("partial_json")
            if isinstance(piece, str):
                call.frags.append(piece)
        elif kind == "content_block_stop" and call is not None:
            call.closed = True
        elif kind == "error":
            error = obj.get("error")
            message = str(error.get("message") if isinstance(error, dict) else error)
            self.note_upstream_error(message)
            first = next(iter(self.calls.values()))
            return self.fatal(
                Fatal(first.name or "?", cut_by_upstream_error(message), "missing_last_chunk"), upstream=event
            )
        elif kind == "message_stop":
            for c in self.calls.values():
                c.closed = True
            out = self._finalize()
            return out if self.ended else out + [event]
        self.held.append(event)
        return []

    def flush(self) -> list[bytes]:
        if not self.ended and self.holding and self._all_closed():  # the stream ended after the block's stop
            return self._finalize()
        return super().flush()

    def _calls_cut(self) -> Sign | None:
        """With tool_use blocks held when `max_tokens` ended the message: a block whose stop never came (a
        further call cut, even one whose input reads whole), or text after the last block."""
        unclosed = [c for c in self.calls.values() if not c.closed]
        if unclosed:
            return Sign("the stream stopped inside a tool_use block (no content_block_stop)", unclosed[-1].name)
        after = "".join(h.whole_text() for h in self.texts[self.texts_before_call :])
        if after.strip():
            last = list(self.calls.values())[-1]
            return Sign(f"text after the last complete call: {quote(after)}", last.name)
        return None

    def _all_closed(self) -> bool:
        return all(c.closed for c in self.calls.values())

    def _place(self, index: int) -> int:
        position, moved = self.blocks.position(index, index + self.inserted)
        if moved:
            reason = "content-block indexes not dense from 0 in order of the blocks; renumbered"
            self.record(WRONG_INDEX, f"$.content[{position}]", {"index": index}, {"index": position}, reason)
        return position

    def _renumber(self, event: bytes, obj: dict[str, Any] | None = None) -> bytes:
        """The event with its block's dense index (cheap when nothing was renumbered)."""
        if not self.blocks.shifted or b'"index"' not in event:
            return event
        obj = obj if obj is not None else parse(event)
        index = obj.get("index") if obj is not None else None
        if obj is None or not isinstance(index, int):
            return event
        position = self.blocks.positions.get(index, index)
        if position == index:
            return event
        return named_event(str(obj.get("type")), {**obj, "index": position}, self.nl)

    def _stop_reason(self, event: bytes, obj: dict[str, Any], delta: dict[str, Any], stop: Any) -> list[bytes]:
        """`stop_reason: tool_use` if and only if a tool_use block went out."""
        if stop == "tool_use" and not self.tool_use_sent:
            reason = "stop_reason tool_use, but the stream carried no tool_use block"
            return self.fatal(Fatal("?", reason, EMPTY_TURN), upstream=event)
        if stop in _ENDS_WITH_CALLS and self.tool_use_sent:
            if self.upstream_calls:  # recovered calls alone: their leaked_into_content row says why
                why = f"stop_reason {stop} with a tool_use block that went out (checked as cut when max_tokens)"
                self.record(FINISH_MISMATCH, "$.delta.stop_reason", stop, "tool_use", why)
            new = {**delta, "stop_reason": "tool_use", "stop_sequence": None}
            return [named_event("message_delta", {**obj, "delta": new}, self.nl)]
        return [event]

    def _finalize(self) -> list[bytes]:
        verdicts = {key: decide(call, self.schemas, empty_is_object=True) for key, call in self.calls.items()}
        fatal = next((v.fatal for v in verdicts.values() if v.fatal), None)
        if fatal is not None:
            self.tool_use_sent = self.policy == "passthrough"  # passthrough: the held blocks go out as sent
            return self.fatal(fatal)
        self.tool_use_sent = True
        repaired: dict[int, tuple[str | None, str | None, str | None]] = {}
        for key, verdict in verdicts.items():
            call = self.calls[key]
            if self.judge(verdict, call, f"$.content[{call.position}].input"):
                repaired[key] = (verdict.arguments, verdict.name, call.out_id)
        room = make_room(self.calls, verdicts, self.blocks)
        if not repaired and not self.blocks.shifted and not self.minted:
            released, self.held, self.calls = self.held, [], {}
            return released
        self.repaired.update(repaired)
        minted = set(self.minted)  # built before this message ended (the calls split off below are not held)
        out: list[bytes] = []
        sent: set[int] = set()
        for raw in self.held:
            obj = parse(raw)
            index = obj.get("index") if obj else None
            if raw in minted:
                out.append(raw)
                continue
            if obj is None or not isinstance(index, int) or index not in repaired:
                out.append(self._renumber(raw, obj))
                continue
            arguments, name, tool_id = repaired[index]
            position = self.blocks.positions.get(index, index)
            kind = obj.get("type")
            if kind == "content_block_start":
                new_block = {**obj["content_block"], "id": tool_id, **({"name": name} if name else {})}
                out.append(
                    named_event("content_block_start", {**obj, "index": position, "content_block": new_block}, self.nl)
                )
            elif kind == "content_block_delta":
                if arguments is None:  # only the id or the index changed: the deltas go out as they came
                    out.append(self._renumber(raw, obj))
                elif index not in sent:
                    sent.add(index)
                    out.append(self._delta(position, arguments))
            elif kind == "content_block_stop":
                if arguments is not None and index not in sent:
                    sent.add(index)
                    out.append(self._delta(position, arguments))
                out.append(self._renumber(raw, obj))
                out += self.new_calls_at(room.pop(index, []))  # calls split off its input follow it
            else:
                out.append(raw)
        for left in room.values():  # a block that never saw its stop: its glued calls still follow the blocks
            out += self.new_calls_at(left)
        self.held, self.calls = [], {}
        return out

    def _delta(self, index: int, arguments: str) -> bytes:
        delta = {"type": "input_json_delta", "partial_json": arguments}
        body = {"type": "content_block_delta", "index": index, "delta": delta}
        return named_event("content_block_delta", body, self.nl)

    def error_events(self, fatal: Fatal, held: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        keep = [raw for raw in held if parse(raw) is None or (parse(raw) or {}).get("type") == "ping"]
        error = messages_tool_call_error(fatal, self.policy, self.capture_id)
        return keep, [named_event("error", error, self.nl)]


def repair_messages_body(
    body: bytes,
    tools: list[Any] | None,
    *,
    capture_id: str = "",
    policy: ToolRepairPolicy = "error",
    tool_format: str | None = None,
) -> tuple[bytes, list[Change], str]:
    """A non-streamed `message`: (body, changes, outcome); unrecoverable → Anthropic's error body,
    sent with status 502 (policy "error") or 422 ("fail_fast"). The stream's invariants: one unique id
    per tool_use block, offered names (an unknown one flagged, unchanged), and `stop_reason: tool_use`
    if and only if the content has a tool_use block (`max_tokens` checks each call as possibly cut)."""
    obj = json_object(body)
    if obj is None or obj.get("type") != "message" or not isinstance(obj.get("content"), list):
        return body, [], "untouched"
    schemas = ToolSchemas(normalize_tools(tools))
    ids = IdLedger("toolu_", capture_id)
    changes: list[Change] = []
    content: list[Any] = []
    stop = obj.get("stop_reason")
    upstream_uses = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in obj["content"])
    detector = LeakDetector(schemas, tool_format)
    blocks, leak_fatal = leak_content(obj["content"], detector, capture_id, changes)
    if leak_fatal is not None:
        return _unrecoverable(body, leak_fatal, "$.content", changes, policy, capture_id)
    cut = _cut_message(obj["content"], detector) if stop == "max_tokens" and detector.active else None
    if cut is not None:
        return _unrecoverable(body, cut_off(cut), "$.content", changes, policy, capture_id)
    uses = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
    if stop == "tool_use" and not uses:
        fatal = Fatal("?", "stop_reason tool_use, but the message has no tool_use block", EMPTY_TURN)
        return _unrecoverable(body, fatal, "$.stop_reason", changes, policy, capture_id)
    edited = blocks is not obj["content"]
    recovered = {id(b) for b in blocks} - {id(b) for b in obj["content"]}  # judged already, when read
    for position, block in enumerate(blocks):
        if id(block) in recovered and isinstance(block, dict) and block.get("type") == "tool_use":
            ids.assign(block.get("id"), position)
            content.append(block)
            continue
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            content.append(block)
            continue
        value = block.get("input")
        text = value if isinstance(value, str) else json.dumps(value if value is not None else {}, ensure_ascii=False)
        call = HeldCall(
            position,
            block.get("name") or None,
            block.get("id"),
            [text],
            finish="length" if stop == "max_tokens" else None,
        )
        tool_id, id_reason = ids.assign(call.call_id, position)
        verdict = decide(call, schemas, empty_is_object=True)
        where = f"$.content[{position}]"
        if verdict.fatal is not None:
            return _unrecoverable(body, verdict.fatal, f"{where}.input", changes, policy, capture_id)
        if verdict.unknown_tool:
            changes.append(unknown_tool_change(call.name, f"{where}.name"))
        new = dict(block)
        if verdict.arguments is not None or not isinstance(value, dict):
            arguments = verdict.arguments if verdict.arguments is not None else text
            changes.append(
                repair_change(
                    verdict,
                    f"{where}.input",
                    block.get("name"),
                    text,
                    arguments,
                    "invalid_json",
                    "input sent as a string",
                )
            )
            new["input"] = json.loads(arguments)
            if verdict.name:
                new["name"] = verdict.name
        if id_reason:
            changes.append(Change(STAGE, WRONG_INDEX, f"{where}.id", {"id": call.call_id}, {"id": tool_id}, id_reason))
            new["id"] = tool_id
        edited = edited or new != block
        content.append(new)
        for glued_name, glued_args in verdict.glued:  # calls split off its input follow it
            glued_id, _ = ids.assign(None, len(content))
            content.append({"type": "tool_use", "id": glued_id, "name": glued_name, "input": json.loads(glued_args)})
    fixed: dict[str, Any] = {"content": content}
    if uses and stop in _ENDS_WITH_CALLS:
        if upstream_uses:  # recovered calls alone: their leaked_into_content row says why
            why = f"stop_reason {stop} with tool_use blocks (checked as cut when max_tokens)"
            changes.append(Change(STAGE, FINISH_MISMATCH, "$.stop_reason", stop, "tool_use", why))
        fixed.update(stop_reason="tool_use", stop_sequence=None)
        edited = True
    if not edited:
        return body, changes, "untouched"
    return orjson.dumps({**obj, **fixed}), changes, "repaired"


def _cut_message(content: list[Any], detector: LeakDetector) -> Sign | None:
    """A message `max_tokens` ended: the text after its last tool_use block (all its text when it has none,
    then its last thinking) judged as the stream judges it (`cutoff.turn_sign`)."""
    blocks = [b for b in content if isinstance(b, dict)]
    uses = [k for k, b in enumerate(blocks) if b.get("type") == "tool_use"]
    after = blocks[uses[-1] + 1 :] if uses else blocks
    text = "".join(str(b.get("text") or "") for b in after if b.get("type") == "text")
    thinking = [str(b.get("thinking") or "") for b in blocks if b.get("type") == "thinking"]
    last_call = str(blocks[uses[-1]].get("name") or "?") if uses else None
    reasoning = thinking[-1] if thinking and not uses else None
    return turn_sign(text, detector.schemas, detector.formats, last_call, reasoning)


def _unrecoverable(
    body: bytes, fatal: Fatal, where: str, changes: list[Change], policy: ToolRepairPolicy, capture_id: str
) -> tuple[bytes, list[Change], str]:
    changes.append(fatal_change(fatal, where))
    if policy == "passthrough":
        return body, changes, "unrecoverable"
    return orjson.dumps(messages_tool_call_error(fatal, policy, capture_id)), changes, "unrecoverable"
