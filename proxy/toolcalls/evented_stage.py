"""The evented stage Responses and Messages share: one call's verdict, named SSE events, the hold.

Both surfaces stream one call as open → argument fragments → close, with `event: NAME` framing, so
the rules are the chat stage's rules applied per call: hold the call's events until it closes, run
`repair_arguments` (strict JSON first, then the defect-class rules, then the schema), and release
the held bytes verbatim when nothing was wrong. Only the verdict's *wire form* differs per surface,
which the subclasses build.

Beyond one held call, the stage checks the answer's structure on every response that offered tools
(issue 16): indexes dense from 0 in order of first appearance (`DenseIndex`), one unique id per call,
minted when missing or already used (`IdLedger`), and names matched to the offered tools
(`names.match_name`; a name that matches none passes as sent, flagged `unknown_tool`). These surfaces
have no `n > 1`: one answer per response, so there is no per-choice state.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.errors import passthrough_note
from tapfix.proxy.sse import comment, event_data
from tapfix.proxy.toolcalls.arguments import repair_arguments
from tapfix.proxy.toolcalls.cutoff import Sign, cut_off
from tapfix.proxy.toolcalls.defects import UNKNOWN_TOOL, WRONG_INDEX
from tapfix.proxy.toolcalls.names import match_name
from tapfix.proxy.toolcalls.plan_types import STAGE, Fatal
from tapfix.proxy.toolcalls.schema import ToolSchemas
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy

POLICIES = ("error", "fail_fast", "passthrough")


def normalize_tools(tools: list[Any] | None) -> list[Any]:
    """Responses `{type, name, parameters}` and Anthropic `{name, input_schema}` → ToolSchemas' shape."""
    out: list[Any] = []
    for tool in tools or []:
        if isinstance(tool, dict) and "input_schema" in tool and "parameters" not in tool:
            out.append({"name": tool.get("name"), "parameters": tool.get("input_schema")})
        else:
            out.append(tool)
    return out


@dataclass(slots=True)
class HeldCall:
    key: Any  # the Responses item id, or the Messages block index
    name: str | None = None
    call_id: str | None = None
    frags: list[str] = field(default_factory=list)
    final: str | None = None  # the arguments a `.done` event or item repeats (Responses)
    closed: bool = False
    finish: str | None = None  # "length" when the item/message says it was cut
    position: int = 0  # the dense index the client sees
    out_id: str | None = None  # the id the client gets (the upstream's, or a minted one)
    id_reason: str = ""  # why out_id differs from call_id


@dataclass(slots=True)
class Verdict:
    arguments: str | None = None  # None: untouched
    name: str | None = None
    unknown_tool: bool = False  # the name matches no offered tool: passed as sent, flagged
    kinds: list[str] = field(default_factory=list)
    reason: str = ""
    fatal: Fatal | None = None
    glued: list[tuple[str, str]] = field(default_factory=list)  # calls split off its arguments (glued.py)


def decide(call: HeldCall, schemas: ToolSchemas, empty_is_object: bool = False) -> Verdict:
    """Untouched, repaired arguments (and name), or unrecoverable — for one closed call."""
    name = call.name
    verdict = Verdict()
    if name is not None and schemas and name not in schemas.schemas:
        match = match_name(name, schemas.names)
        if match.kind == UNKNOWN_TOOL:
            verdict.unknown_tool = True
        elif match.kind is not None:
            verdict.name, verdict.kinds = match.name, [match.kind]
            name = match.name
    if name is None:
        if len(schemas.names) != 1:
            verdict.fatal = Fatal("?", "tool call has no name", "wrong_index_or_id")
            return verdict
        verdict.name = name = schemas.names[0]
        verdict.kinds.append("wrong_index_or_id")
    text = "".join(call.frags)
    frags = call.frags if call.frags or not empty_is_object else ["{}"]
    if not call.frags and call.final is not None:
        frags = [call.final]
    res = repair_arguments(frags, name, schemas, call.finish)
    if call.final is not None and call.frags and call.final != text:
        alt = repair_arguments([call.final], name, schemas, call.finish)
        kind = "duplicated_fragments" if len(text) > len(call.final) else "missing_fragment"
        if not alt.fatal and (not alt.changed or res.fatal):
            verdict.arguments = alt.text
            verdict.kinds += [kind] + alt.kinds
            verdict.reason = "argument deltas disagree with the final arguments; the final ones kept"
            return verdict
    if res.fatal:
        kind = (res.kinds or ["missing_last_chunk" if "cut" in res.fatal else "invalid_json"])[0]
        if res.fatal.startswith("required"):
            kind = (res.kinds or ["missing_fragment"])[0]
        verdict.fatal = Fatal(name, res.fatal, kind)
        return verdict
    if res.changed and not (empty_is_object and not call.frags and res.kinds == ["empty_arguments"]):
        verdict.arguments = res.text
        verdict.kinds += res.kinds
        verdict.reason = "; ".join(res.fixes) or res.kinds[0]
        verdict.glued = res.glued
    if verdict.arguments is None and verdict.name is not None:
        verdict.arguments = text if call.frags else res.text
    return verdict


def mint_id(prefix: str, seed: str, position: int) -> str:
    """A stable id for a call that has none usable: derived from the capture id and the call's position
    (the chat surface's rule, `plan._make_id`, with the surface's own prefix)."""
    digest = hashlib.sha1(f"{seed}:0:{position}".encode()).hexdigest()[:24]
    return f"{prefix}{digest}"


class IdLedger:
    """The ids already handed out in this answer: a call's own id when it has a fresh one, else a minted one."""

    def __init__(self, prefix: str, seed: str) -> None:
        self.prefix, self.seed = prefix, seed
        self.used: set[str] = set()

    def assign(self, given: Any, position: int) -> tuple[str, str]:
        """(the id to send, why it differs from `given`, or "" when it doesn't)."""
        if isinstance(given, str) and given and given not in self.used:
            self.used.add(given)
            return given, ""
        reason = "the call had no id; one was minted" if not given else "the id was already used by an earlier call"
        minted, k = mint_id(self.prefix, self.seed, position), 0
        while minted in self.used:  # a clash with an upstream id: derive again, still stable
            k += 1
            minted = mint_id(self.prefix, f"{self.seed}#{k}", position)
        self.used.add(minted)
        return minted, reason


class DenseIndex:
    """Upstream indexes (or item ids) → 0..n-1 in order of first appearance; `shifted` once any differs."""

    def __init__(self) -> None:
        self.positions: dict[Any, int] = {}
        self.shifted = False

    def make_room(self, after: int, count: int) -> None:
        """`count` positions right after `after` for items tapfix adds there: the later ones move up."""
        for key, pos in self.positions.items():
            if pos > after:
                self.positions[key] = pos + count
        self.shifted = True

    def position(self, key: Any, given: Any) -> tuple[int, bool]:
        """(the dense position of `key`, whether this is its first appearance with another index)."""
        pos = self.positions.get(key)
        if pos is not None:
            return pos, False
        pos = self.positions[key] = len(self.positions)
        moved = given != pos
        self.shifted = self.shifted or moved
        return pos, moved


def make_room(
    calls: dict[Any, HeldCall], verdicts: dict[Any, Verdict], index: DenseIndex
) -> dict[Any, list[tuple[int, str, str]]]:
    """Room right after each call that had calls glued into its arguments (`glued.py`), in order: per call,
    the positions its glued calls take, with their names and arguments. Later items and calls move up."""
    room: dict[Any, list[tuple[int, str, str]]] = {}
    for key in sorted((k for k, v in verdicts.items() if v.glued), key=lambda k: calls[k].position):
        call, glued = calls[key], verdicts[key].glued
        index.make_room(call.position, len(glued))
        for other in calls.values():
            if other.position > call.position:
                other.position += len(glued)
        room[key] = [(call.position + 1 + j, name, args) for j, (name, args) in enumerate(glued)]
    return room


def event_name(event: bytes) -> str | None:
    if event.startswith(b"event:"):
        line = event.split(b"\n", 1)[0].rstrip(b"\r")
        return line[6:].strip().decode("utf-8", "replace")
    return None


class HoldingStage:
    """The hold/release/fatal machinery; subclasses parse their surface's events."""

    path_prefix = "$"

    def __init__(
        self,
        tools: list[Any] | None,
        policy: ToolRepairPolicy = "error",
        capture_id: str = "",
        *,
        clock: Callable[[], float] = time.monotonic,
        keepalive_s: float = 10.0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        self.policy = policy
        self.capture_id = capture_id
        self.changes: list[Change] = []
        self.defects: list[str] = []
        self.outcome = "untouched"
        self.schemas = ToolSchemas(normalize_tools(tools))
        self.nl = b"\n"
        self._framing_known = False
        self._clock = clock
        self._keepalive_s = keepalive_s
        self._last_out = clock()
        self.held: list[bytes] = []
        self.calls: dict[Any, HeldCall] = {}
        self.ended = False
        # Issue 19: with `defer_fatal` (a relayed stream, addons/relay.py), an unrecoverable call's error
        # events are kept here instead of sent (what the client may still get of the answer goes out), so
        # the pipeline can ask for another attempt first, or send them after all.
        self.defer_fatal = False
        self.deferred: list[bytes] = []
        # ... and with `regenerate_unknown_tool`, from a call to a tool that wasn't offered on, what the
        # client would get (that call, as sent, and the rest of the stream) waits there the same way.
        self.defer_unknown_tool = False
        self._deferring = False
        # Issue 31: what a text part gave when it may be a call `max_tokens` cut (it ended inside a call's
        # markup, or after its recovered calls with a sign that more was coming) waits for the turn's end:
        # `settle` sends it, or the error when max_tokens ended the turn. Comments still go out.
        self.until_end: list[bytes] | None = None
        self.until_sign: Sign | None = None

    @property
    def holding(self) -> bool:
        return bool(self.calls)

    def wait_for_end(self, sign: Sign) -> None:
        """From now on the output waits for the turn's end (`settle`): `sign` says what it may have cut."""
        if self.until_end is None:
            self.until_end, self.until_sign = [], sign

    def settle(self, cut: bool) -> list[bytes]:
        """At the turn's end: what waited goes out, or, when `max_tokens` ended the turn (`cut`), the error
        (what waited is held output then, which the policy's error drops or keeps)."""
        waited, sign = self.until_end, self.until_sign
        self.until_end = self.until_sign = None
        if waited is None:
            return []
        if not cut or sign is None:
            return waited
        self.held = waited + self.held
        return self.fatal(cut_off(sign))

    def feed(self, event: bytes) -> list[bytes]:
        if self.ended:
            return []
        if not self._framing_known:
            self._framing_known = True
            if b"\r\n" in event:
                self.nl = b"\r\n"
        out: list[bytes] = []
        waiting = self.holding or self.until_end is not None
        if waiting and self._clock() - self._last_out >= self._keepalive_s:
            out.append(comment("tapfix: holding tool call", self.nl))
        out += self.on_event(event)
        if self._deferring:
            self.deferred += out
            return []
        if self.until_end is not None:
            self.until_end += [e for e in out if event_data(e) is not None]
            out = [e for e in out if event_data(e) is None]
        if out:
            self._last_out = self._clock()
        return out

    def flush(self) -> list[bytes]:
        if not self.ended and self.until_end is not None:  # the stream ended before the turn did
            return self.settle(cut=True)
        if self.ended or not self.holding:
            return []
        call = next(iter(self.calls.values()))
        return self.fatal(
            Fatal(call.name or "?", "the stream ended before the call was complete", "missing_last_chunk")
        )

    def on_event(self, event: bytes) -> list[bytes]:  # pragma: no cover - abstract
        raise NotImplementedError

    def hold(self, event: bytes) -> list[bytes]:
        if self.holding:
            self.held.append(event)
            return []
        return [event]

    def note(self, verdict: Verdict, call: HeldCall, where: str, after: str) -> None:
        for kind in verdict.kinds:
            if kind not in self.defects:
                self.defects.append(kind)
        self.changes.append(
            Change(
                STAGE,
                verdict.kinds[0] if verdict.kinds else "repair",
                where,
                {"name": call.name, "arguments": "".join(call.frags) or call.final, "id": call.call_id},
                {"name": verdict.name or call.name, "arguments": after, "id": call.call_id} | _glued(verdict),
                verdict.reason or "repaired",
            )
        )
        if self.outcome == "untouched":
            self.outcome = "repaired"

    def record(self, kind: str, where: str, before: Any, after: Any, reason: str) -> None:
        """A structural repair (an index, an id, a finish): recorded; the stage's outcome becomes repaired."""
        if kind not in self.defects:
            self.defects.append(kind)
        self.changes.append(Change(STAGE, kind, where, before, after, reason))
        if self.outcome == "untouched":
            self.outcome = "repaired"

    def add(self, change: Change, flag: bool = False) -> None:
        """A change row built elsewhere (a recovered leak; with `flag`, a flag that leaves the outcome)."""
        if change.kind not in self.defects:
            self.defects.append(change.kind)
        self.changes.append(change)
        if not flag and self.outcome == "untouched":
            self.outcome = "repaired"

    def flag(self, name: str | None, where: str) -> None:
        """A name no offered tool matches: it passes as sent (nothing is guessed), the change row says so."""
        if UNKNOWN_TOOL not in self.defects:
            self.defects.append(UNKNOWN_TOOL)
        self.changes.append(unknown_tool_change(name, where))
        if self.defer_fatal and self.defer_unknown_tool:
            self._deferring = True

    def judge(self, verdict: Verdict, call: HeldCall, where: str) -> bool:
        """Record what `decide` and the id check found for one call; True when its events must be rebuilt."""
        if verdict.unknown_tool:
            self.flag(call.name, where)
        if verdict.arguments is None and call.out_id == call.call_id:
            return False
        if verdict.arguments is not None:  # None: only the id changes, the argument deltas go out as they came
            self.note(verdict, call, where, verdict.arguments)
        if call.out_id != call.call_id:
            if verdict.arguments is not None:
                self.changes[-1].after["id"] = call.out_id
                self.changes[-1].reason += f"; {call.id_reason}"
                if WRONG_INDEX not in self.defects:
                    self.defects.append(WRONG_INDEX)
            else:
                before = {"name": call.name, "id": call.call_id}
                self.record(WRONG_INDEX, where, before, {"name": call.name, "id": call.out_id}, call.id_reason)
        return True

    def fatal(self, fatal: Fatal, upstream: bytes | None = None) -> list[bytes]:
        """Unrecoverable: by policy, the surface's error event (the held call never goes out)."""
        self.outcome = "unrecoverable"
        if fatal.kind not in self.defects:
            self.defects.append(fatal.kind)
        self.changes.append(fatal.change(self.path_prefix, f"unrecoverable ({fatal.reason}); policy {self.policy}"))
        held, self.held, self.calls = self.held, [], {}
        if self.policy == "passthrough":
            return [comment(passthrough_note(fatal), self.nl), *held] + ([upstream] if upstream else [])
        self.ended = True
        kept, tail = self.error_events(fatal, held)
        if self._deferring:  # an unknown tool's call came first: everything since waits, in order
            self.deferred += kept + tail
            return []
        if self.defer_fatal:
            self.deferred = tail
            return kept
        return kept + tail

    def error_events(self, fatal: Fatal, held: list[bytes]) -> tuple[list[bytes], list[bytes]]:  # pragma: no cover
        """(the held events the client still gets, the surface's error events that end the stream)."""
        raise NotImplementedError

    def note_upstream_error(self, message: str) -> None:
        self.changes.append(
            Change(STAGE, "upstream_error", "$.error", message, None, "replaced by tapfix's error event")
        )


def as_dict(value: Any) -> dict[str, Any]:
    """A nested object of an event, or an empty one when the engine sent something else."""
    return value if isinstance(value, dict) else {}


def parse(event: bytes) -> dict[str, Any] | None:
    from tapfix.proxy.sse import event_data

    data = event_data(event)
    if data is None:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def fatal_change(fatal: Fatal, where: str) -> Change:
    """The change row of a call that can't be recovered (its arguments are never sent)."""
    return Change(STAGE, fatal.kind, where, {"name": fatal.name}, None, f"unrecoverable ({fatal.reason})")


def unknown_tool_change(name: str | None, where: str) -> Change:
    """The flag of a name no offered tool matches: before and after are the same, the name passes as sent."""
    reason = "no offered tool has this name or a form of it; passed through as sent"
    return Change(STAGE, UNKNOWN_TOOL, where, {"name": name}, {"name": name}, reason)


def repair_change(
    verdict: Verdict, where: str, name: str | None, before: str, after: str, default_kind: str, default_reason: str = ""
) -> Change:
    """The change row of a repaired call: name and arguments before and after."""
    return Change(
        STAGE,
        verdict.kinds[0] if verdict.kinds else default_kind,
        where,
        {"name": name, "arguments": before},
        {"name": verdict.name or name, "arguments": after} | _glued(verdict),
        verdict.reason or default_reason,
    )


def _glued(verdict: Verdict) -> dict[str, Any]:
    """The calls split off a call's arguments, for its change row (nothing when none)."""
    return {"glued": [{"name": n, "arguments": a} for n, a in verdict.glued]} if verdict.glued else {}
