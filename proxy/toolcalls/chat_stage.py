"""The Chat Completions streaming stage: hold a message's tool-call events until complete, then pass or repair.

Content and reasoning events go out at once (a content chunk that provably can't start or carry a call or
markup passes without a parse: `chat_quiet.py`); only tool-call events (and what arrives while they are
open, so order and bytes are kept) and text that may start leaked call syntax are held. A valid stream
goes out byte for byte: held events are released verbatim unless a rule found a defect.

`stream_valid_prefix=True` forwards tool-call events at once while they are provably fine and holds
only from the first one that is not; what happens then is decided in `prefix.py`.

The structural invariants (dense indexes, one id per call, offered names, a finish_reason that matches
the calls; `plan.py`) are checked once per message, when its held calls are judged, never per content
event. With n > 1 every choice is accumulated and planned on its own (all state is keyed by the choice
index): a broken choice is repaired while the others go out as they came. An unrecoverable choice ends
the whole stream with the error event, since the error is not per choice on the wire.

This module is the intake (what is held, and when a message is complete); its state and the verdict
on what it held (release, rebuild, error event) are `ChatJudge`'s, in `chat_judge.py`.
"""

from __future__ import annotations

import re
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.sse import EVENT_END, comment, event_data
from tapfix.proxy.sse_envelope import Envelope
from tapfix.proxy.toolcalls.chat_judge import ChatJudge, ChoiceState
from tapfix.proxy.toolcalls.chat_leaks import carries_tool_call
from tapfix.proxy.toolcalls.chat_quiet import OTHER_CHOICE, learn, read_texts
from tapfix.proxy.toolcalls.chat_quiet import contents as _contents
from tapfix.proxy.toolcalls.defects import EMPTY_TURN
from tapfix.proxy.toolcalls.leaks import UNPINNED, hold_verdict, settled
from tapfix.proxy.toolcalls.output import ENVELOPE_KEYS, Item
from tapfix.proxy.toolcalls.plan_types import STAGE, Fatal, Part
from tapfix.proxy.toolcalls.prefix import admit_event

_INDEX = re.compile(rb'"index": ?([^,} ]*)')
_UNREAD_BATCH = 64  # fast-path events read into the watches at once
_UNREAD_TEXTS = 4096  # quiet strings kept unread (read when the full path next runs, or at this many)
_LEARNS = 2  # content chunks of a new shape learned in a row without one quiet event between
_RECHECK_FREE = 2048  # a held leak this short is looked at again on every delta; a longer one as it grows by 1/4


class ChatToolCallRepair(ChatJudge):
    """`feed(event)`/`flush()` over whole raw SSE events; held messages are judged by `ChatJudge`."""

    # -- public --------------------------------------------------------------------------------
    def feed(self, event: bytes) -> list[bytes]:
        slot = self._slot
        if slot is not None and (raw := slot.raw(event)) is not None:
            # The quiet path (`chat_quiet.py`): a content chunk that can't start or carry a call or markup
            # while nothing is held or watched; its text is read into the context when next needed.
            if self._pending is None and self._quiet_text.quiet(raw):
                self._last_out = self._clock()  # `_pass_quiet`, inlined: the path of almost every chunk
                self._learns = _LEARNS
                if self._unread:
                    self._read_unread()
                unread = self._unread_texts
                unread.append(raw)
                if len(unread) >= _UNREAD_TEXTS:
                    self._read_unread()
                return [event]
            if self._pending is None and self._quiet_text.plain(raw):
                out = self._maybe(event, raw)
                if out is not None:
                    return out
            elif self._pending is not None and self._settles(raw):
                out = [self._pending[0], event]
                self._unread_texts.append(self._pending[1])
                self._pending = None
                self._pass_quiet(raw)
                return out
        out = self._replay() if self._pending is not None else []
        out += self._going_out(self._take(event))
        self._slot = self._quiet_slot(event)
        return out

    def _pass_quiet(self, raw: bytes) -> None:
        self._last_out = self._clock()
        self._learns = _LEARNS
        if self._unread:
            self._read_unread()
        self._unread_texts.append(raw)
        if len(self._unread_texts) >= _UNREAD_TEXTS:
            self._read_unread()

    def _maybe(self, event: bytes, raw: bytes) -> list[bytes] | None:
        """A quiet chunk but for its end, which may start a word-led opener (` to`, `Actio`): held as the full
        path holds it (`hold_verdict` 'maybe', unless it stands in a container) until the next chunk says;
        None: the full path takes it."""
        if self._pinned is not None or not self._interesting(event):
            return None
        self._read_unread()
        cs = self._choices[0]
        text = read_texts([raw])
        verdict = hold_verdict(text, cs.at_start, self._schemas, self._formats, cs.watch.context)
        if verdict == "no":
            cs.watch.sent(text)
            self._last_out = self._clock()
            return [event]
        if verdict != "maybe":
            return None
        self._pending = (event, raw)
        return []

    def _settles(self, raw: bytes) -> bool:
        """Whether a quiet chunk after a held one releases both, as the full path would: what they say
        together can't start an opener (nor the new text alone, for a pinned stage's watch)."""
        assert self._pending is not None
        if not raw or self._clock() - self._last_out >= self._keepalive_s:
            return False  # an empty delta keeps the hold; a due keep-alive is the full path's
        return self._quiet_text.quiet(raw) and self._quiet_text.quiet(self._pending[1] + raw)

    def _replay(self) -> list[bytes]:
        """The held chunk through the full path, as if it had taken it when it came (nothing happened since)."""
        assert self._pending is not None
        event, self._pending = self._pending[0], None
        return self._going_out(self._take(event))

    def _quiet_slot(self, event: bytes) -> Envelope | None:
        """The content slot the quiet path matches while nothing is held or watched (None: the full path
        takes every event): learned from a content chunk, again when the envelope changes."""
        if self._ended or self._done_sent or self._holding or self._streamed or not self._tools or not self.fast_paths:
            return None
        if 0 not in self._choices:
            return None
        for c in self._choices.values():
            if c.at_start or c.leak != "none" or c.watch.active or c.acc.calls or c.reasoning_due or c.finish:
                return None
        known = self._content_slot
        if (known is None or known.raw(event) is None) and self._learns > 0 and event.find(b'"content":') >= 0:
            self._learns -= 1
            self._content_slot = learn(event) or known
        return self._content_slot

    def _going_out(self, out: list[bytes]) -> list[bytes]:
        """What the client gets has one finish per choice (`chat_finish.py`; requests that offered tools)."""
        if not self._tools or not out:
            return out
        out = self._one_finish.out(out, self._out.nl)
        if self._one_finish.noted and self.outcome == "untouched":
            self.outcome = "repaired"
        return out

    def _take(self, event: bytes) -> list[bytes]:
        if self._ended:
            return []
        if self._done_sent:
            return self._after_done(event)
        if not self._holding and not self._streamed and self.fast_paths:
            if event.find(b'"tool_calls"') < 0 and (not self._tools or not self._interesting(event)):
                self._last_out = self._clock()
                self._tail_open = not event.endswith(EVENT_END)
                if event.find(b"[DONE]") >= 0 and (data := event_data(event)) is not None and data.strip() == b"[DONE]":
                    self._done_sent = True
                elif self._tools:
                    if self._unread_texts:
                        self._read_unread()
                    self._unread.append(event)
                    if len(self._unread) >= _UNREAD_BATCH:
                        self._read_unread()
                return [event]
        out = self._keepalive()
        out += self._feed(event)
        if out:
            self._last_out = self._clock()
            self._tail_open = not out[-1].endswith(EVENT_END)
        return out

    def _after_done(self, event: bytes) -> list[bytes]:
        """The stream ended at [DONE]. Some clients stop reading there, others (the AI SDK) go on parsing:
        a data event past it would reach the latter unjudged, a call's fragment joining a call it already
        holds. So data goes no further, recorded once; comments and blank lines still pass."""
        if event_data(event) is None:
            return [event]
        if not self._dropped_after_done:
            self._dropped_after_done = True
            self.changes.append(
                Change(STAGE, "after_done", "$", None, None, "data after [DONE] dropped: the stream had ended")
            )
        return []

    def flush(self) -> list[bytes]:
        self._slot = None
        if self._pending is not None:
            return self._replay() + self.flush()
        if self._ended or self._done_sent or not (self._holding or self._streamed):
            return []
        out = self._finalize(end_of_stream=True)
        if out and self._tail_open and not out[0].startswith((b"\n", b"\r")):
            out.insert(0, self._out.nl * 2)  # a cut event already went out: end it, or what follows merges
        return self._going_out(out)

    # -- intake --------------------------------------------------------------------------------
    def _interesting(self, event: bytes) -> bool:
        """Cheap checks: may this content event start leaked call syntax, or carry an error, or does a
        choice watch its text? Runs on every content event of a request that offered tools: C-speed
        byte scans (`chat_leaks.FastPath`), no parse, no generator."""
        if self._fast.interesting(event) or not self._choices:
            return True
        if OTHER_CHOICE.search(event) is not None and self._unknown_choice(event):
            return True  # a choice not seen yet starts at its start (a marker-less format counts there)
        anchored = self._anchored
        for c in self._choices.values():
            if (c.at_start and anchored) or c.watch.active:
                return True
        return False

    def _unknown_choice(self, event: bytes) -> bool:
        for m in _INDEX.finditer(event):
            if not (m[1].isdigit() and int(m[1]) in self._choices):
                return True
        return False

    def _keepalive(self) -> list[bytes]:
        if self._holding and self._clock() - self._last_out >= self._keepalive_s:
            return [comment("tapfix: holding tool call", self._out.nl)]
        return []

    def _read_unread(self) -> None:
        """Read the text of the events the fast path let through into each choice's watch (what they
        leave open: a fence, a quote, the paragraph's last sentence...), as the slow path would have:
        each choice's content of the batch at once; the quiet path's strings are choice 0's content."""
        if self._unread_texts:
            raws, self._unread_texts = self._unread_texts, []
            self._choice(0).watch.sent(read_texts(raws))  # the quiet path runs only past the start
        if not self._unread:
            return
        events, self._unread = self._unread, []
        if (text := _contents(events)) is not None:
            events, texts = [], {0: [text]}
        else:
            texts = {}
        for event in events:
            data = event_data(event)
            obj = json_object(data) if data is not None else None
            choices = obj.get("choices") if obj is not None else None
            for ch in choices if isinstance(choices, list) else []:
                delta = ch.get("delta") if isinstance(ch, dict) else None
                if not isinstance(delta, dict):
                    continue
                ci = ch.get("index", 0)
                ci = ci if isinstance(ci, int) else 0
                if "reasoning_content" in delta or "reasoning" in delta:
                    self._choice(ci).watch.watch_reasoning(delta, False, self._formats)
                content = delta.get("content")
                if isinstance(content, str) and content:
                    texts.setdefault(ci, []).append(content)
        for ci, parts in texts.items():
            cs, text = self._choice(ci), "".join(parts)
            if cs.at_start and text.strip():
                cs.at_start = False
            cs.watch.sent(text)

    def _choice(self, ci: int) -> ChoiceState:
        return self._choices.get(ci) or self._choices.setdefault(ci, self._new_choice(True))

    def _feed(self, event: bytes) -> list[bytes]:
        if self._unread or self._unread_texts:
            self._read_unread()
        if not self._framing_known:
            self._framing_known = True
            if b"\r\n" in event:
                self._out.nl = b"\r\n"
        data = event_data(event)
        if data is None:
            return self._hold_or_pass(Item(event, None))
        if data.strip() == b"[DONE]":
            return self._on_done(event)
        obj = json_object(data)
        if obj is None:
            return self._hold_or_pass(Item(event, None))
        if "error" in obj and "choices" not in obj:
            return self._on_error(event, obj)
        if not self._out.envelope:
            self._out.envelope = {k: obj[k] for k in ENVELOPE_KEYS if k in obj}
            self._out.envelope.setdefault("object", "chat.completion.chunk")
        if self._holding and self._tail_decided_by_call(obj):
            return self._release_raw() + self._feed(event)
        item = Item(event, obj)
        self._seq += 1
        hold = self._holding
        resolved = False
        empty_turn = False
        admitted = None
        if self.stream_valid_prefix and self._tools and not hold:
            admitted = admit_event(obj, self._gates, self._schemas, self._sent)
        choices = obj.get("choices")
        for ch in choices if isinstance(choices, list) else []:
            if not isinstance(ch, dict):
                continue
            ci = ch.get("index", 0)
            ci = ci if isinstance(ci, int) else 0
            cs = self._choices.get(ci) or self._choices.setdefault(ci, self._new_choice(True))
            delta = ch.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            tool_calls = delta.get("tool_calls")
            if isinstance(tool_calls, list) and tool_calls:
                for tc in tool_calls:
                    before = len(cs.acc.calls)
                    cs.acc.add(tc)
                    cs.call_seqs.extend([self._seq] * (len(cs.acc.calls) - before))
                hold = True
            if self._tools:
                cs.watch.watch_reasoning(delta, bool(isinstance(tool_calls, list) and tool_calls), self._formats)
            content = delta.get("content")
            if isinstance(content, str) and content:
                if self._pinned is not None and self._tools:
                    cs.watch.watch_foreign(content, cs.at_start)
                cs.parts.append(Part(self._seq, content))
                item.parts[ci] = len(cs.parts) - 1
                hold = hold or self._streamed  # may continue or leak a streamed call
                if self._tools and not cs.acc.calls:
                    verdict = self._leak_verdict(cs, content)
                    if verdict != "no":
                        hold = True
                    elif cs.leak != "none":
                        cs.leak = "none"  # what was held can't be a call (any more): out it goes
                        resolved = True
            finish = ch.get("finish_reason")
            if isinstance(finish, str) and finish:
                cs.finish = finish
                hold = hold or self._streamed  # the streamed calls are judged at the finish
                if cs.watch.foreign is not None:
                    self._flag_foreign(cs, ci)
                if cs.watch.reasoning is not None and not cs.acc.calls and not self._sent.get(ci):
                    cs.reasoning_due = hold = True  # the reasoning's markup may be the turn's call
                if finish == "tool_calls" and self._tools and not cs.needs_hold and not self._sent.get(ci):
                    empty_turn = True  # the server's parser lost the call: never a silent empty turn
        if empty_turn:
            return self._fatal(Fatal("?", "finish_reason tool_calls, but the stream carried no tool call", EMPTY_TURN))
        if hold and admitted:  # only tool-call deltas, all provably fine: out at once
            for gate, pending in admitted:
                gate.commit(pending)
            self._streamed = True
            return [event]
        if not hold:
            for ci in item.parts:
                cs = self._choices[ci]
                if cs.parts[-1].text.strip():
                    cs.at_start = False
                cs.watch.sent(cs.parts[-1].text)
                cs.parts.clear()
            for cs in self._choices.values():
                cs.finish = None  # a finish that went out with nothing held: calls after it end with their own
            return [event]
        if not self._holding:
            self._holding = True
            for cs in self._choices.values():
                cs.hold_at_start = cs.at_start
                cs.parts = cs.parts[-1:] if cs.parts and cs.parts[-1].seq == self._seq else []
            item.parts = {ci: 0 for ci, cs in self._choices.items() if cs.parts}
        self._held.append(item)
        if resolved and not any(c.needs_hold for c in self._choices.values()):
            return self._release_raw()
        holding = [c for c in self._choices.values() if c.needs_hold]
        if holding and all(c.finish for c in holding):
            return self._finalize()
        return []

    def _tail_decided_by_call(self, obj: dict[str, Any]) -> bool:
        """Held text that only may start an opener, then a tool-call delta: markup doesn't go on across a
        structured call, so the text is released before the call is judged (or streamed, in prefix mode)."""
        holding = [c for c in self._choices.values() if c.needs_hold]
        if not holding or any(c.leak != "maybe" or c.acc.calls or c.reasoning_due for c in holding):
            return False
        return carries_tool_call(obj)

    def _leak_verdict(self, cs: ChoiceState, content: str) -> str:
        if cs.leak == "leak":
            return self._recheck(cs)
        if cs.leak == "maybe":
            text = "".join(p.text for p in cs.parts)
            at_start = cs.hold_at_start
        else:
            if self._holding:
                return "no"  # held for another reason; the whole text is searched at the end
            text, at_start = content, cs.at_start
        verdict = hold_verdict(text, at_start, self._schemas, self._formats, cs.watch.context)
        if verdict != "no":
            cs.leak = verdict
            head = text.lstrip()[:1]
            anchored = at_start and bool(self._formats.anchored) and head in self._formats.anchor_heads
            cs.recheck = -1 if anchored else 0  # a marker-less head holds to the end, as it always did
        return verdict

    def _recheck(self, cs: ChoiceState) -> str:
        """A held leak: 'no' once nothing held may still become a call (markup inside a container, or
        followed by prose): looked at again on every delta while short, then as it grows by a quarter
        (linear in all)."""
        if cs.recheck < 0:
            return "leak"
        text = "".join(p.text for p in cs.parts)
        if len(text) < cs.recheck:
            return "leak"
        cs.recheck = len(text) + (len(text) // 4 if len(text) > _RECHECK_FREE else 0)
        return "no" if settled(text, self._schemas, self._formats, cs.watch.context) else "leak"

    def _flag_foreign(self, cs: ChoiceState, ci: int) -> None:
        change = cs.watch.flag_foreign(ci, self._schemas, cs.at_start, self._formats, self._pinned)
        if change is not None:
            if UNPINNED not in self.defects:
                self.defects.append(UNPINNED)
            self.changes.append(change)

    def _hold_or_pass(self, item: Item) -> list[bytes]:
        if self._holding:
            self._held.append(item)
            return []
        return [item.raw]
