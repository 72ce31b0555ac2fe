"""The Chat Completions streaming stage: hold a message's tool-call events until complete, then pass or repair.

Content and reasoning events go out at once; only tool-call events (and what arrives while they are
open, so order and bytes are kept) and text that may start leaked call syntax are held. A valid stream
goes out byte for byte: held events are released verbatim unless a rule found a defect.

`stream_valid_prefix=True` forwards tool-call events at once while they are provably fine and holds
only from the first one that is not; what happens then is decided in `prefix.py`.

The structural invariants (dense indexes, one id per call, offered names, a finish_reason that matches
the calls; `plan.py`) are checked once per message, when its held calls are judged, never per content
event. With n > 1 every choice is accumulated and planned on its own (all state is keyed by the choice
index): a broken choice is repaired while the others go out as they came. An unrecoverable choice ends
the whole stream with the error event, since the error is not per choice on the wire.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.config.settings import ToolRepairPolicy
from tapfix.proxy.errors import passthrough_note, tool_call_error_event
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.sse import comment, event_data, format_event
from tapfix.proxy.toolcalls.accumulate import CallAccumulator
from tapfix.proxy.toolcalls.chat_leaks import FastPath, TextWatch, calls_from_leak, carries_tool_call
from tapfix.proxy.toolcalls.defects import EMPTY_TURN
from tapfix.proxy.toolcalls.leaks import UNPINNED, find_leak, formats_for, hold_verdict
from tapfix.proxy.toolcalls.output import ENVELOPE_KEYS, EVENT_END, Item, Writer
from tapfix.proxy.toolcalls.plan import named_tool, plan_choice
from tapfix.proxy.toolcalls.plan_types import STAGE, ChoicePlan, Fatal, Part, cut_by_upstream_error
from tapfix.proxy.toolcalls.prefix import PrefixGate, admit_event, continue_streamed
from tapfix.proxy.toolcalls.schema import ToolSchemas

_PARSE_ERROR = re.compile(r"Failed to parse input at pos \d+:\s?")


@dataclass(slots=True)
class _Choice:
    acc: CallAccumulator = field(default_factory=CallAccumulator)
    call_seqs: list[int] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    finish: str | None = None
    leak: str = "none"  # "none" | "maybe" | "leak"
    at_start: bool = True  # no visible content yet: a bare JSON call could still be the whole message
    hold_at_start: bool = True
    watch: TextWatch = field(default_factory=TextWatch)  # leaked markup watched while text goes out
    reasoning_due: bool = False  # the finish came with the reasoning's markup last: plan it

    @property
    def needs_hold(self) -> bool:
        return bool(self.acc.calls) or self.leak != "none" or self.reasoning_due


class ChatToolCallRepair:
    def __init__(
        self,
        tools: list[Any] | None,
        policy: ToolRepairPolicy = "error",
        capture_id: str = "",
        stream_valid_prefix: bool = False,
        *,
        clock: Callable[[], float] = time.monotonic,
        keepalive_s: float = 10.0,
        tool_choice: Any = None,
        tool_format: str | None = None,
    ) -> None:
        """`tool_choice`: the request's; a named one lets its call finish with `stop` (OpenAI, vLLM).
        `tool_format`: the one registered format armed (`formats/`); None arms every one. Markup of
        another format then passes through, flagged `unpinned_tool_format`."""
        if policy not in ("error", "fail_fast", "passthrough"):
            raise ValueError(f"unknown policy {policy!r}")
        self.policy = policy
        self.capture_id = capture_id
        # Off by default: after a streamed prefix a defect can only end in an error event (prefix.py).
        self.stream_valid_prefix = stream_valid_prefix
        self.changes: list[Change] = []
        self.defects: list[str] = []
        self.outcome = "untouched"
        self._schemas = ToolSchemas(tools)
        self._named = named_tool(tool_choice)
        self._tools = bool(self._schemas)
        self._offered = frozenset(self._schemas.names)
        self._formats = formats_for(tool_format)
        self._pinned = tool_format
        # What the fast path looks for: every format when one is pinned (another's markup is flagged).
        self._fast = FastPath(formats_for(None) if tool_format is not None else self._formats)
        self._anchored = bool(self._formats.anchored)
        self._clock = clock
        self._keepalive_s = keepalive_s
        self._last_out = clock()
        self._out = Writer()
        self._framing_known = False
        self._choices: dict[int, _Choice] = {}
        self._held: list[Item] = []
        self._holding = False
        self._seq = 0
        self._ended = False
        self._done_sent = False
        self._sent: dict[int, list[str]] = {}  # ids of the calls each choice has sent
        self._gates: dict[int, PrefixGate] = {}  # prefix mode: what this message streamed
        self._streamed = False  # prefix mode: this message has forwarded tool-call events
        self._tail_open = False  # the last bytes out were a cut, unterminated event

    # -- public --------------------------------------------------------------------------------
    def feed(self, event: bytes) -> list[bytes]:
        if self._ended:
            return []
        if self._done_sent:  # the client stopped reading at [DONE]: what follows goes by untouched, unjudged
            return [event]
        if not self._holding and not self._streamed:
            if b'"tool_calls"' not in event and (not self._tools or not self._interesting(event)):
                self._last_out = self._clock()
                self._tail_open = not event.endswith(EVENT_END)
                if b"[DONE]" in event and (data := event_data(event)) is not None and data.strip() == b"[DONE]":
                    self._done_sent = True
                return [event]
        out = self._keepalive()
        out += self._feed(event)
        if out:
            self._last_out = self._clock()
            self._tail_open = not out[-1].endswith(EVENT_END)
        return out

    def flush(self) -> list[bytes]:
        if self._ended or self._done_sent or not (self._holding or self._streamed):
            return []
        out = self._finalize(end_of_stream=True)
        if out and self._tail_open and not out[0].startswith((b"\n", b"\r")):
            out.insert(0, self._out.nl * 2)  # a cut event already went out: end it, or what follows merges
        return out

    def _new_choice(self, at_start: bool) -> _Choice:
        return _Choice(acc=CallAccumulator(self._offered), at_start=at_start)

    # -- intake --------------------------------------------------------------------------------
    def _interesting(self, event: bytes) -> bool:
        """Cheap checks: may this content event start leaked call syntax, or carry an error, or does a
        choice watch its text? Runs on every content event of a request that offered tools: C-speed
        byte scans (`chat_leaks.FastPath`), no parse, no generator."""
        if self._fast.interesting(event) or not self._choices:
            return True
        anchored = self._anchored
        for c in self._choices.values():
            if (c.at_start and anchored) or c.watch.active:
                return True
        return False

    def _keepalive(self) -> list[bytes]:
        if self._holding and self._clock() - self._last_out >= self._keepalive_s:
            return [comment("tapfix: holding tool call", self._out.nl)]
        return []

    def _feed(self, event: bytes) -> list[bytes]:
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
                    elif cs.leak == "maybe":
                        cs.leak = "none"
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

    def _leak_verdict(self, cs: _Choice, content: str) -> str:
        if cs.leak == "leak":
            return "leak"
        if cs.leak == "maybe":
            text = "".join(p.text for p in cs.parts)
            at_start = cs.hold_at_start
        else:
            if self._holding:
                return "no"  # held for another reason; the whole text is searched at the end
            text, at_start = content, cs.at_start
        verdict = hold_verdict(text, at_start, self._schemas, self._formats)
        if verdict != "no":
            cs.leak = verdict
        return verdict

    def _flag_foreign(self, cs: _Choice, ci: int) -> None:
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

    def _release_raw(self) -> list[bytes]:
        out = [item.raw for item in self._held]
        for cs in self._choices.values():
            if any(p.text.strip() for p in cs.parts):
                cs.at_start = False
        self._reset_hold()
        return out

    def _reset_hold(self) -> None:
        self._held = []
        self._holding = False
        self._gates = {}
        self._streamed = False
        for ci, cs in self._choices.items():
            new = self._new_choice(cs.at_start and not any(p.text.strip() for p in cs.parts))
            if cs.finish is None:  # the message goes on: keep watching its reasoning and content
                cs.watch.sent("".join(p.text for p in cs.parts))  # what of the held text stays open
                new.watch = cs.watch.carried()
            self._choices[ci] = new

    # -- ends ----------------------------------------------------------------------------------
    def _on_done(self, event: bytes) -> list[bytes]:
        out = self._finalize() if self._holding or self._streamed else []
        if self._ended or self._done_sent:
            return out
        self._done_sent = True
        return out + [event]

    def _on_error(self, event: bytes, obj: dict[str, Any]) -> list[bytes]:
        if self._tools:
            recovered = self._recover(obj)
            if recovered is not None:
                return recovered
        if not self._holding and not self._streamed:
            return [event]
        if not any(c.acc.calls for c in self._choices.values()):
            return self._release_raw() + [event]
        last = next(c for c in self._choices.values() if c.acc.calls).acc.calls[-1]
        message = _error_message(obj)
        self._note_upstream_error(message, "replaced by tapfix's error event")
        parse_error = _PARSE_ERROR.search(message)  # llama-server's: what follows is the model's raw text
        quoted = message[: parse_error.end()].rstrip(": ") if parse_error else message
        fatal = Fatal(last.name or "?", cut_by_upstream_error(quoted), "missing_last_chunk")
        return self._fatal(fatal, upstream=event)

    def _recover(self, obj: dict[str, Any]) -> list[bytes] | None:
        """llama-server ends a stream it cannot parse with the model's raw text inside the error."""
        message = _error_message(obj)
        m = _PARSE_ERROR.search(message)
        if m is None:
            return None
        leak = find_leak(message[m.end() :], self._schemas, True, self._formats)
        if leak is None or not leak.confirmed:
            return None
        ci = min(self._choices) if self._choices else 0
        cs = self._choices.get(ci) or self._choices.setdefault(ci, self._new_choice(True))
        added = calls_from_leak(leak, cs.acc.calls, self._schemas)
        cs.call_seqs.extend([self._seq] * added)
        cs.finish = cs.finish or "tool_calls"
        plans = self._plans()
        if any(p.fatal for p in plans.values()) or self._continue_streamed(plans) is not None:
            return None
        self._note_upstream_error(message, "tool call recovered from the raw model text in the upstream error")
        for plan in plans.values():
            self.changes.extend(plan.changes)
        self.outcome = "recovered_from_error"
        out = self._out.rebuild(self._held, plans, synthesize_finish=True)
        self._reset_hold()
        self._ended = True  # the stage ended the stream itself (its own [DONE]): nothing follows it
        self._done_sent = True
        return out + [format_event(b"[DONE]", self._out.nl)]

    def _note_upstream_error(self, message: str, reason: str) -> None:
        self.changes.append(Change(STAGE, "upstream_error", "$.error", message, None, reason))

    def _plans(self) -> dict[int, ChoicePlan]:
        plans = {}
        for ci, cs in self._choices.items():
            if not cs.acc.calls and not cs.parts and not cs.reasoning_due:
                continue
            plans[ci] = plan_choice(
                cs.acc.calls,
                cs.call_seqs,
                cs.parts,
                self._schemas,
                cs.finish,
                ci,
                cs.hold_at_start,
                f"{self._out.envelope.get('id', '')}:{self.capture_id}",
                index_base=len(self._sent.get(ci, [])),
                sent_ids=frozenset(self._sent.get(ci, [])),
                named=self._named,
                formats=self._formats,
                reasoning=cs.watch.reasoning if cs.reasoning_due else None,
                reasoning_field=cs.watch.reasoning_field,
                flag_unpinned=False,  # the stage flags from what it watched (`_flag_foreign`)
                context=cs.watch.enclosing,
            )
        return plans

    def _remember_sent(self, plans: dict[int, ChoicePlan] | None) -> None:
        for ci, cs in self._choices.items():
            plan = plans.get(ci) if plans else None
            if plan is not None and plan.calls:
                ids = [c.id for c in plan.calls]
            elif plan is not None and not plan.structured_clean:
                ids = []
            else:
                ids = [c.id or f"#{k}" for k, c in enumerate(cs.acc.calls)]
            self._sent.setdefault(ci, []).extend(ids)

    def _finalize(self, end_of_stream: bool = False) -> list[bytes]:
        plans = self._plans()
        for plan in plans.values():
            for kind in plan.defects:
                if kind not in self.defects:
                    self.defects.append(kind)
        fatal = next((p.fatal for p in plans.values() if p.fatal), None)
        if fatal is not None and any(self._sent.get(ci) for ci, p in plans.items() if p.fatal):
            # Calls after the message already finished with calls: stray deltas, not a turn to fail.
            self.changes.append(
                Change(
                    STAGE,
                    fatal.kind,
                    "$.choices[0].delta.tool_calls",
                    {"name": fatal.name},
                    None,
                    f"tool-call deltas after the finish dropped ({fatal.reason})",
                )
            )
            out = self._out.rebuild(self._held, {}, synthesize_finish=False, strip_all=True)
            self._reset_hold()
            return out
        if fatal is not None:
            return self._fatal(fatal)
        if all(p.untouched for p in plans.values()):
            for plan in plans.values():
                self.changes.extend(plan.changes)  # flags only (an unknown tool): the bytes stay
            self._remember_sent(None)
            return self._release_raw()
        fatal = self._continue_streamed(plans)
        if fatal is not None:
            return self._fatal(fatal)
        for plan in plans.values():
            self.changes.extend(plan.changes)
        if self.outcome == "untouched":
            self.outcome = "repaired"
        out = self._out.rebuild(self._held, plans, synthesize_finish=end_of_stream)
        self._remember_sent(plans)
        self._reset_hold()
        return out

    def _continue_streamed(self, plans: dict[int, ChoicePlan]) -> Fatal | None:
        """Prefix mode: make repaired plans continue what was streamed, or say why they can't."""
        for ci, plan in plans.items():
            gate = self._gates.get(ci)
            if gate is not None:
                cs = self._choices[ci]
                fatal = continue_streamed(plan, gate, cs.acc.calls, cs.finish, ci)
                if fatal is not None:
                    return fatal
        return None

    def _fatal(self, fatal: Fatal, upstream: bytes | None = None) -> list[bytes]:
        self.outcome = "unrecoverable"
        if fatal.kind not in self.defects:
            self.defects.append(fatal.kind)
        self.changes.append(
            Change(
                STAGE,
                fatal.kind,
                "$.choices[0].delta.tool_calls",
                {"name": fatal.name},
                None,
                f"unrecoverable ({fatal.reason}); policy {self.policy}"
                + ("; part of the call was already streamed" if self._streamed else ""),
            )
        )
        if self.policy == "passthrough":
            note = comment(passthrough_note(fatal), self._out.nl)
            out = [note] + [item.raw for item in self._held] + ([upstream] if upstream else [])
            self._reset_hold()
            return out
        out = self._out.rebuild(self._held, {}, synthesize_finish=False, strip_all=True)
        tail_open = not out[-1].endswith(EVENT_END) if out else self._tail_open
        if tail_open:
            out.append(self._out.nl * 2)  # end a cut event first, or the client reads the error as part of it
        out.append(tool_call_error_event(fatal, self.policy, self.capture_id, self._out.nl))
        out.append(format_event(b"[DONE]", self._out.nl))
        self._held = []
        self._ended = True
        self._done_sent = True
        return out


def _error_message(obj: dict[str, Any]) -> str:
    error = obj.get("error")
    if isinstance(error, dict):
        message = error.get("message")
        return message if isinstance(message, str) else ""
    return error if isinstance(error, str) else ""
