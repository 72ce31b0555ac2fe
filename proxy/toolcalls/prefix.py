"""The optional prefix-streaming mode: forward tool-call fragments while they are provably fine.

By default the chat stage holds a message's tool-call events until its calls are complete, which
costs the client all streaming of arguments (a large `write` arrives at once, after the model is
done). With `stream_valid_prefix=True` a tool-call event goes out at once, byte for byte, as long as
everything in it is provably fine:

- an opener (a new call) has the next index in order (0, 1, ...), a fresh non-empty id and the name
  of an offered tool, all in one delta;
- a later delta only continues an open call: same index, no new id or name;
- the call's arguments so far are still the start of a JSON object (`JsonPrefix`, linear overall),
  with no Gemma `<|"|>` delimiter debris, and no top-level value starts as a string where the schema
  wants another type (`"True"` for a boolean: the repair would rewrite it, so it must not go out);
- the event carries no content and no finish_reason (those go through the normal hold/finalize path).

The first event that is not provably fine starts the normal hold for the rest of the message. When
the message ends, the plan is computed as in the default mode over the whole message, and then:

- nothing to repair: the held events go out verbatim (so a valid stream is byte-identical);
- a repair is needed and some of a call was already streamed: a client concatenates argument
  fragments, so a whole repaired call can't be re-sent. If the repaired arguments can be written as
  the streamed text plus a remainder (same value, checked by parsing), only the remainder goes out, as
  a continuation delta on the streamed index; calls that were never streamed go out whole as usual;
- otherwise (the repair changes what was streamed, a name/id fix, or finish_reason `length` with
  arguments to repair) the message ends with the policy's error event, like an unrecoverable call.
  Under `length` only structural repairs go on (renumbered later calls, the finish itself): the plan
  has already checked every call as possibly cut, and a repaired argument text there is not trusted.

The gate admits only what no structural invariant of `plan.py` could rewrite: openers on the next
index in order (a lone call on index 1, a gap, or a second call on index 0 is held and renumbered),
a fresh id (id churn and shared ids are held), an offered name (an unknown one is held, then passes
flagged), and no finish_reason (the plan decides it).

The trade-off (clients.md §8): an error event after an opened tool-call delta is handled well by
opencode and pi (they resend the turn) but omp does not resend: it keeps the partial call in its
history with a synthetic "not executed" result and goes on, so the model has to issue the call again
by itself. With policy `fail_fast` all three abort cleanly and run nothing (§8 row 2), without a
retry. The default mode never opens a call it may still have to take back, so it stays the default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.toolcalls.accumulate import Call
from tapfix.proxy.toolcalls.defects import FINISH_MISMATCH, UNKNOWN_TOOL, WRONG_INDEX
from tapfix.proxy.toolcalls.jsonprefix import JsonPrefix
from tapfix.proxy.toolcalls.plan_types import ChoicePlan, Fatal, OutCall
from tapfix.proxy.toolcalls.schema import ToolSchemas


@dataclass(slots=True)
class Streamed:
    """One call as the client has it: its opener and the argument fragments forwarded so far."""

    index: int
    id: str
    name: str
    json: JsonPrefix = field(default_factory=JsonPrefix)
    sent: list[str] = field(default_factory=list)
    last: str = ""  # last character fed, to see `<|` split across fragments

    @property
    def text(self) -> str:
        return "".join(self.sent)


Pending = list[tuple[Streamed, str | None]]  # (call, fragment) or (new call, None) for an opener


class PrefixGate:
    """One choice's calls in one message, as far as they were streamed."""

    __slots__ = ("schemas", "calls")

    def __init__(self, schemas: ToolSchemas) -> None:
        self.schemas = schemas
        self.calls: list[Streamed] = []

    def check(self, tool_calls: Any) -> Pending | None:
        """What forwarding these deltas would send, or None if any of them is not provably fine.

        A refusal makes the stage hold the rest of the message, so the prefix state this mutates on
        the way is never used again; what counts as sent changes only in `commit`.
        """
        if not isinstance(tool_calls, list):
            return None
        calls = list(self.calls)
        pending: Pending = []
        for tc in tool_calls:
            if not isinstance(tc, dict) or tc.get("type") not in (None, "function"):
                return None
            index, fn = tc.get("index"), tc.get("function")
            if isinstance(index, bool) or not isinstance(index, int) or not isinstance(fn, dict):
                return None
            call_id, name = tc.get("id"), fn.get("name")
            if index == len(calls):
                if not isinstance(call_id, str) or not call_id or any(c.id == call_id for c in calls):
                    return None
                if not isinstance(name, str) or name not in self.schemas.schemas:
                    return None
                cur = Streamed(index, call_id, name, JsonPrefix(_not_a_string(self.schemas, name)))
                calls.append(cur)
                pending.append((cur, None))
            elif 0 <= index < len(calls):
                if call_id not in (None, "") or name not in (None, ""):
                    return None  # an id change, a resent opener or a name in pieces
                cur = calls[index]
            else:
                return None
            args = fn.get("arguments")
            if args is None:
                continue
            if not isinstance(args, str) or "<|" in cur.last + args[:1] or "<|" in args:
                return None
            if not cur.json.feed(args):
                return None
            if args:
                cur.last = args[-1]
                pending.append((cur, args))
        return pending

    def commit(self, pending: Pending) -> None:
        for call, frag in pending:
            if frag is None:
                self.calls.append(call)
            else:
                call.sent.append(frag)


def _not_a_string(schemas: ToolSchemas, name: str) -> Callable[[str, str], bool] | None:
    """A JsonPrefix hook refusing a top-level string where the schema wants another type.

    Those are exactly the values `ToolSchemas.fit` coerces ("True" -> true, "[1]" -> [1]); once
    complete they would be rewritten, so they are held instead of streamed.
    """
    props = schemas.properties(name) or {}
    typed: dict[str, bool] = {}
    for key, prop in props.items():
        types = prop.get("type") if isinstance(prop, dict) else None
        types = [types] if isinstance(types, str) else types
        if isinstance(types, list) and types and "string" not in types:
            typed[key] = True
    if not typed:
        return None

    def expect(raw_key: str, first: str) -> bool:
        if first != '"':
            return True
        try:
            key = json.loads(f'"{raw_key}"')
        except ValueError:
            return False
        return key not in typed

    return expect


def admit_event(
    obj: dict[str, Any], gates: dict[int, PrefixGate], schemas: ToolSchemas, sent: dict[int, list[str]]
) -> list[tuple[PrefixGate, Pending]] | None:
    """May this parsed chunk go out at once? Returns what it would commit, or None to hold it.

    Only a chunk made of tool-call deltas (and empty or role-only deltas) qualifies: content may be
    leaked call syntax or a continuation of the arguments, and a finish_reason ends the message,
    both of which the normal path decides. A choice that already finished calls (`sent`) is left to
    the normal path too, which knows about calls repeated after the finish.
    """
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return None
    admitted: list[tuple[PrefixGate, Pending]] = []
    seen: set[int] = set()
    for ch in choices:
        if not isinstance(ch, dict) or ch.get("finish_reason"):
            return None
        ci = ch.get("index", 0)
        delta = ch.get("delta") or {}
        if isinstance(ci, bool) or not isinstance(ci, int) or not isinstance(delta, dict) or ci in seen:
            return None
        seen.add(ci)
        if delta.get("content"):
            return None
        tool_calls = delta.get("tool_calls")
        if not tool_calls:
            continue
        if sent.get(ci):
            return None
        gate = gates.setdefault(ci, PrefixGate(schemas))
        pending = gate.check(tool_calls)
        if pending is None:
            return None
        admitted.append((gate, pending))
    return admitted


def continue_streamed(
    plan: ChoicePlan, gate: PrefixGate, calls: list[Call], finish: str | None, choice: int
) -> Fatal | None:
    """Rewrite `plan` so that streamed calls get only what the client is still missing.

    Called once a message that streamed part of its calls needs a change. Streamed calls are the first
    `len(gate.calls)` calls of the choice (openers were accepted only in index order), and the plan
    lists calls in that same order. Returns a Fatal when the client's prefix can't be completed.
    """
    if not gate.calls or plan.structured_clean:
        return None  # held tool-call deltas go out unchanged, after the streamed ones
    first = gate.calls[0].name
    kind = plan.defects[0] if plan.defects else "invalid_json"
    if finish == "length" and any(k not in _STRUCTURAL for k in plan.defects):
        return Fatal(first, "arguments cut by max_tokens after part of the call was streamed", kind)
    for k, streamed in enumerate(gate.calls):
        out = plan.calls[k] if k < len(plan.calls) else None
        if out is None or k >= len(calls) or calls[k].id != streamed.id:
            return Fatal(streamed.name, "a streamed call was dropped by the repair", kind)
        if (out.index, out.id, out.name) != (streamed.index, streamed.id, streamed.name):
            return Fatal(streamed.name, "the repair renamed or renumbered a streamed call", kind)
        sent = streamed.text
        rest = remainder(sent, calls[k], out.arguments)
        if rest is None:
            return Fatal(streamed.name, "the repair changes arguments that were already streamed", kind)
        plan.calls[k] = OutCall(out.index, out.id, out.name, rest, continued=True)
        _note(plan.changes, choice, out.index, len(sent))
    return None


_STRUCTURAL = frozenset({WRONG_INDEX, FINISH_MISMATCH, UNKNOWN_TOOL})  # no argument text was repaired


def remainder(sent: str, call: Call, repaired: str) -> str | None:
    """The text that completes `sent` into the repaired arguments, or None if there is none.

    Tried: the streamed text alone (a resend was dropped), the arguments as received (with closing
    brackets added when only those are missing), and the repaired text itself. A candidate counts only
    if it starts with what was streamed and parses to exactly the repaired value.
    """
    try:
        target = json.loads(repaired)
    except ValueError:
        return None
    raw = "".join(f for f in call.frags if isinstance(f, str))
    candidates = [sent, raw, call.original or "", repaired, _compact(target)]
    for text in list(candidates[:3]):
        check = JsonPrefix()
        closers = check.closers() if check.feed(text) else None
        if closers:
            candidates.append(text + closers)
    seen: set[str] = set()
    for text in candidates:
        if text in seen or not text.startswith(sent):
            continue
        seen.add(text)
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if same(value, target):
            return text[len(sent) :]
    return None


def same(a: Any, b: Any) -> bool:
    """JSON equality without Python's 1 == 1.0 == True."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _note(changes: list[Change], choice: int, index: int, streamed: int) -> None:
    path = f"$.choices[{choice}].delta.tool_calls[{index}]"
    for change in changes:
        if change.path == path:
            change.reason += f"; {streamed} characters were already streamed, only the rest was sent"
