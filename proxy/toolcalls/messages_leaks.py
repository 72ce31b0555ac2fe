"""Leaked tool-call markup on the Messages surface: the blocks a recovered call becomes.

A recovered call is a new `tool_use` content block streamed as a model's own (`content_block_start` with a
minted `toolu_…` id and `input: {}`, one `input_json_delta` with the arguments, `content_block_stop`); the
text block keeps the text outside the markup. The rules are `evented_leaks.py`'s.
"""

from __future__ import annotations

import json
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


class MessagesLeaks(LeakingStage):
    """The Messages stage's side of leaked markup: the open text block's hold, the thinking kept for the end
    of the turn, and the recovered calls as tool_use blocks (`MessagesToolCallRepair` is the rest)."""

    blocks: DenseIndex
    ids: IdLedger
    tool_use_sent: bool
    cut_turn: bool  # max_tokens ended the message (known at its message_delta)

    def init_leaks(self, tool_format: str | None) -> None:
        self.leaks = LeakDetector(self.schemas, tool_format)
        self.text: TextHold | None = None  # the open text block's hold
        self.text_index: int | None = None
        self.texts: list[TextHold] = []
        self.reasoning: list[bytes | str] = []
        self.reasoning_index: int | None = None
        self.inserted = 0  # blocks tapfix added: later upstream blocks move by this many
        self.upstream_calls = False
        self.minted: set[bytes] = set()  # events tapfix built for recovered calls (never renumbered)

    def _renumber(self, event: bytes, obj: dict[str, Any] | None = None) -> bytes:  # pragma: no cover
        raise NotImplementedError

    # -- leaked markup (evented_leaks.py has the rules) ---------------------------------------------
    def _text_delta(self, event: bytes) -> list[bytes] | None:
        """A text or thinking delta (None: another delta): text through the hold, thinking kept."""
        if b'"thinking_delta"' in event:
            raw = raw_string(event, b'"thinking":')
            if raw is not None:
                self.reasoning.append(raw)
            elif (obj := parse(event)) is not None:
                piece = as_dict(obj.get("delta")).get("thinking")
                self.reasoning.append(piece if isinstance(piece, str) else "")
            return [event]
        if b'"text_delta"' not in event or self.text is None:
            return None
        raw = raw_string(event, b'"text":')
        if raw is not None and self.text.fast(raw):
            return [event]
        obj = parse(event)
        delta = as_dict(obj.get("delta")) if obj is not None else {}
        if obj is None or not isinstance(delta.get("text"), str) or obj.get("index") != self.text_index:
            return [event]
        return self.text.feed(event, delta["text"])

    def _leak_event(
        self, kind: Any, index: Any, block: dict[str, Any], event: bytes, obj: dict[str, Any]
    ) -> list[bytes] | None:
        """A text block opens (its hold) or ends (what was held, then the calls its markup held)."""
        if kind == "content_block_start" and block.get("type") == "text" and isinstance(index, int):
            self.text = TextHold(self.leaks, at_start=not self.texts)
            self.text_index = index
            self.texts.append(self.text)
        elif kind == "content_block_start" and block.get("type") == "thinking":
            self.reasoning_index = index if isinstance(index, int) else None
        elif kind == "content_block_stop" and index == self.text_index and self.text is not None:
            leaked, out = self._end_text()
            if self.ended:
                return out
            out.append(self._renumber(event, obj))
            if leaked is not None and leaked.calls:
                out += self._emit_calls(leaked, f"$.content[{self._position(index)}].text", "text")
            return out
        return None

    def _position(self, index: Any) -> int:
        return self.blocks.positions.get(index, index) if isinstance(index, int) else 0

    def _end_text(self) -> tuple[Leaked | None, list[bytes]]:
        hold, self.text = self.text, None
        where = f"$.content[{self._position(self.text_index)}].text"
        whole = hold.whole_text() if hold is not None else ""
        leaked = hold.finish(where) if hold is not None else None
        if leaked is None or hold is None:
            return None, []
        if leaked.fatal is None:
            self._watch_cut(whole, hold.at_start)
        out: list[bytes] = []
        if leaked.fatal is not None:
            out = self.fatal(leaked.fatal)
            if self.ended:
                return None, out
            leaked = Leaked("", events=leaked.events)
        for markup in leaked.flagged:
            self._flag_format(markup, where)
        if not leaked.calls:  # no call: the held events go out as they came
            return leaked, out + [self._renumber(e) for e in leaked.events]
        if leaked.text:
            body: dict[str, object] = {
                "type": "content_block_delta",
                "index": self.text_index,
                "delta": {"type": "text_delta", "text": leaked.text},
            }
            out.append(self._renumber(named_event("content_block_delta", body, self.nl)))
        return leaked, out

    def _watch_cut(self, whole: str, at_start: bool) -> None:
        """A text part that ended inside a call's markup, or after its recovered calls with a sign that more
        was coming, is a call `max_tokens` cut if that is what ended the turn: what follows waits for it."""
        sign = length_signs(whole, self.leaks.schemas, self.leaks.formats, at_start, after_calls=False)
        if sign is not None:
            self.wait_for_end(sign)

    def _end_turn(self) -> list[bytes]:
        """At the message's end: a text block left open is ended; markup last in the thinking, with no text
        and no call in the turn, becomes tool_use blocks (the thinking itself already went out)."""
        out: list[bytes] = []
        if self.text is not None:
            leaked, out = self._end_text()
            if self.ended:
                return out
            if leaked is not None and leaked.calls:
                out += self._emit_calls(leaked, f"$.content[{self._position(self.text_index)}].text", "text")
        if self.upstream_calls or self.tool_use_sent or not self.reasoning:
            return out
        if any(h.sent_text().strip() for h in self.texts):
            return out
        text = "".join(p if isinstance(p, str) else decode_raw(p) for p in self.reasoning)
        where = f"$.content[{self._position(self.reasoning_index)}].thinking"
        return self._reasoning_calls(out, text, where)

    def new_calls(self, calls: list[tuple[str, str]]) -> list[bytes]:
        """Calls tapfix read out of text, as tool_use blocks of their own after the blocks so far."""
        return self.new_calls_at([(len(self.blocks.positions) + k, name, args) for k, (name, args) in enumerate(calls)])

    def new_calls_at(self, calls: list[tuple[int, str, str]]) -> list[bytes]:
        """Calls tapfix read out of text or split off another call's input, as tool_use blocks of their own at
        the given indexes (made free for them; ids minted)."""
        out: list[bytes] = []
        for position, name, arguments in calls:
            self.blocks.positions[("added", position)] = position
            self.blocks.shifted = True
            self.inserted += 1
            tool_id, _ = self.ids.assign(None, position)
            events = tool_use_events(tool_id, name, arguments, position, self.nl)
            self.minted.update(events)
            out += events
        self.tool_use_sent = True
        return out


def tool_use_events(tool_id: str, name: str, arguments: str, index: int, nl: bytes) -> list[bytes]:
    start = {"type": "content_block_start", "index": index, "content_block": _block(tool_id, name, {})}
    delta = {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": arguments},
    }
    stop = {"type": "content_block_stop", "index": index}
    return [
        named_event("content_block_start", start, nl),
        named_event("content_block_delta", delta, nl),
        named_event("content_block_stop", stop, nl),
    ]


def _block(tool_id: str, name: str, value: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": value}


def leak_content(
    content: list[Any], detector: LeakDetector, capture_id: str, changes: list[Change]
) -> tuple[list[Any], Fatal | None]:
    """A non-streamed `content` with markup in its text blocks (and, when nothing follows it, at the end of
    the thinking) turned into tool_use blocks after the block it came from; `content` itself when none."""
    if not detector.active:
        return content, None
    new: list[Any] = []
    edited: list[str] = []
    pinned = detector.formats.names

    def add_calls(leaked: Leaked, where: str, what: str) -> None:
        edited.append(where)
        for name, arguments in leaked.calls:
            tool_id = mint_id("toolu_", f"{capture_id}:leak", len(new))
            new.append(_block(tool_id, name, json.loads(arguments)))
        changes.append(leak_change(leaked, where, what))

    first_text = True
    for position, block in enumerate(content):
        where = f"$.content[{position}].text"
        text = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else None
        if not isinstance(text, str) or not text:
            new.append(block)
            continue
        leaked = detector.read(text, 0, first_text, where)
        first_text = False
        if leaked.fatal is not None:
            return content, leaked.fatal
        changes.extend(unpinned_change(m, where, pinned) for m in leaked.flagged)
        if not leaked.calls:
            new.append(block)
            continue
        new.append({**block, "text": leaked.text})
        add_calls(leaked, where, "text")
    uses = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
    texts = any(isinstance(b, dict) and b.get("type") == "text" and str(b.get("text") or "").strip() for b in new)
    thinking = [(k, b) for k, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "thinking"]
    if not edited and not uses and not texts and thinking:
        k, block = thinking[-1]
        where = f"$.content[{k}].thinking"
        leaked_r = detector.reasoning(str(block.get("thinking") or ""), where)
        if leaked_r is not None and leaked_r.fatal is not None:
            return content, leaked_r.fatal
        if leaked_r is not None and leaked_r.calls:
            add_calls(leaked_r, where, "reasoning")
        elif leaked_r is not None:
            changes.extend(unpinned_change(m, where, pinned) for m in leaked_r.flagged)
    return (new if edited else content), None
