"""What a held Chat Completions message comes to: plan each choice, then release, rebuild or end the stream.

`ChatToolCallRepair` (`chat_stage.py`) decides what is held; this base owns the stage's state and
judges what it held, once per message: the held events go out verbatim when every plan is untouched,
rebuilt from the plans when one repaired something, or the stream ends with the error event (or, under
policy "passthrough", with the held bytes behind a note) when a call is unrecoverable. The upstream's
own error event ends a message here too: llama-server's parse error carries the model's raw text, which
may still hold the call (`_recover`). Apart from the intake so that each half reads on its own.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.errors import passthrough_note, tool_call_error_event
from tapfix.proxy.sse import EVENT_END, comment, format_event
from tapfix.proxy.sse_envelope import Envelope
from tapfix.proxy.toolcalls.accumulate import CallAccumulator
from tapfix.proxy.toolcalls.chat_finish import OneFinish
from tapfix.proxy.toolcalls.chat_leaks import TextWatch, calls_from_leak, fast_path
from tapfix.proxy.toolcalls.chat_quiet import quiet_text
from tapfix.proxy.toolcalls.defects import UNKNOWN_TOOL
from tapfix.proxy.toolcalls.leaks import find_leak, formats_for
from tapfix.proxy.toolcalls.output import Item, Writer
from tapfix.proxy.toolcalls.plan import named_tool, plan_choice
from tapfix.proxy.toolcalls.plan_types import STAGE, ChoicePlan, Fatal, Part, cut_by_upstream_error
from tapfix.proxy.toolcalls.prefix import PrefixGate, continue_streamed
from tapfix.proxy.toolcalls.schema import ToolSchemas
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy

TOOL_CALLS = "$.choices[0].delta.tool_calls"  # where a Chat Completions call lives in a chunk

_PARSE_ERROR = re.compile(r"Failed to parse input at pos \d+:\s?")


@dataclass(slots=True)
class ChoiceState:
    """One choice's part of the held message: its calls, held text, finish and what its text may leak."""

    acc: CallAccumulator = field(default_factory=CallAccumulator)
    call_seqs: list[int] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    finish: str | None = None
    leak: str = "none"  # "none" | "maybe" | "leak"
    at_start: bool = True  # no visible content yet: a bare JSON call could still be the whole message
    hold_at_start: bool = True
    watch: TextWatch = field(default_factory=TextWatch)  # leaked markup watched while text goes out
    reasoning_due: bool = False  # the finish came with the reasoning's markup last: plan it
    recheck: int = 0  # a held leak: the held length at which to see again whether it settled (-1: never)

    @property
    def needs_hold(self) -> bool:
        return bool(self.acc.calls) or self.leak != "none" or self.reasoning_due


class ChatJudge:
    """The stage's state, and the verdict on a held message (the intake is `ChatToolCallRepair`'s)."""

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
        watched = formats_for(None) if tool_format is not None else self._formats
        self._fast = fast_path(watched)
        self._quiet_text = quiet_text(watched)
        # The fast paths (`_interesting`, the quiet path of `chat_quiet.py`): an event that provably can't
        # start or carry a call or markup passes without a parse. Off only to show that they are exact.
        self.fast_paths = True
        self._slot: Envelope | None = None  # the quiet path's content chunk while it may run
        self._content_slot: Envelope | None = None  # the last content chunk's shape learned
        self._learns = 2  # shapes learned in a row without a quiet event (a server whose envelope never repeats)
        self._pending: tuple[bytes, bytes] | None = None  # the quiet path's held chunk and its string
        self._unread_texts: list[bytes] = []  # the quiet path's strings, not yet read into choice 0's watch
        self._anchored = bool(self._formats.anchored)
        self._clock = clock
        self._keepalive_s = keepalive_s
        self._last_out = clock()
        self._out = Writer()
        self._framing_known = False
        self._choices: dict[int, ChoiceState] = {}
        self._held: list[Item] = []
        self._holding = False
        self._seq = 0
        self._ended = False
        self._done_sent = False
        self._dropped_after_done = False
        self._sent: dict[int, list[str]] = {}  # ids of the calls each choice has sent
        self._gates: dict[int, PrefixGate] = {}  # prefix mode: what this message streamed
        self._streamed = False  # prefix mode: this message has forwarded tool-call events
        self._tail_open = False  # the last bytes out were a cut, unterminated event
        self._unread: list[bytes] = []  # events the fast path let through, not yet read into the watches
        # Issue 19: with `defer_fatal` (a relayed stream, addons/relay.py), an unrecoverable message's
        # error event and [DONE] are kept here instead of sent, so the pipeline can ask for another
        # attempt first (or send them after all).
        self.defer_fatal = False
        self.deferred: list[bytes] = []
        # ... and with `regenerate_unknown_tool`, a message calling a tool that wasn't offered is kept
        # the same way, as it would go out, so another attempt can replace it.
        self.defer_unknown_tool = False
        self._one_finish = OneFinish(self.changes, self.defects)  # what goes out: one finish per choice

    # -- hold ----------------------------------------------------------------------------------
    def _new_choice(self, at_start: bool) -> ChoiceState:
        return ChoiceState(acc=CallAccumulator(self._offered), at_start=at_start)

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
                context=cs.watch.context,
                reasoning_context=cs.watch.reasoning_context,
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
            self.changes.append(fatal.change(TOOL_CALLS, f"tool-call deltas after the finish dropped ({fatal.reason})"))
            out = self._out.rebuild(self._held, {}, synthesize_finish=False, strip_all=True)
            self._reset_hold()
            return out
        if fatal is not None:
            return self._fatal(fatal)
        if all(p.untouched for p in plans.values()):
            for plan in plans.values():
                self.changes.extend(plan.changes)  # flags only (an unknown tool): the bytes stay
            self._remember_sent(None)
            return self._deferred_if_unknown(plans, self._release_raw())
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
        return self._deferred_if_unknown(plans, out)

    def _deferred_if_unknown(self, plans: dict[int, ChoicePlan], out: list[bytes]) -> list[bytes]:
        """Under `defer_unknown_tool`, a message calling a tool that wasn't offered ends the stream here:
        the bytes it would send (and [DONE]) wait in `deferred` for the pipeline's decision. What the
        upstream sends after it (a usage chunk) is dropped with the rest of the attempt."""
        if not (self.defer_fatal and self.defer_unknown_tool) or self._streamed:
            return out
        if not any(UNKNOWN_TOOL in p.defects for p in plans.values()):
            return out
        if out and not out[-1].endswith(EVENT_END):
            out.append(self._out.nl * 2)
        self.deferred = [*out, format_event(b"[DONE]", self._out.nl)]
        self._ended = True
        self._done_sent = True
        return []

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
        streamed = "; part of the call was already streamed" if self._streamed else ""
        self.changes.append(fatal.change(TOOL_CALLS, f"unrecoverable ({fatal.reason}); policy {self.policy}{streamed}"))
        if self.policy == "passthrough":
            note = comment(passthrough_note(fatal), self._out.nl)
            out = [note] + [item.raw for item in self._held] + ([upstream] if upstream else [])
            self._reset_hold()
            return out
        out = self._out.rebuild(self._held, {}, synthesize_finish=False, strip_all=True)
        tail_open = not out[-1].endswith(EVENT_END) if out else self._tail_open
        if tail_open:
            out.append(self._out.nl * 2)  # end a cut event first, or the client reads the error as part of it
        tail = [tool_call_error_event(fatal, self.policy, self.capture_id, self._out.nl)]
        tail.append(format_event(b"[DONE]", self._out.nl))
        if self.defer_fatal:
            self.deferred = tail
        else:
            out += tail
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
