"""The pipeline's side of a stream that may carry several upstream attempts (issue 19).

`AttemptSplice.attempt_end` runs at each attempt's end (attempt 1's is mitmproxy's end of the upstream
body; a later one's, the end of the upstream request tapfix made for it: addons/attempts.py), synchronously,
after the pipeline flushed the attempt's stages: if the tool-call stage deferred an unrecoverable verdict
(`defer_fatal`) and the rules allow another attempt (eligibility.should_regenerate, the upstream's
Admission, continuation.next_attempt), the session is handed the next attempt's body and the pipeline
gets fresh stages led by a `Seam`, so the new attempt's chunks continue what the client has; otherwise
the session is told to end and the deferred error event goes out, as it would have without regeneration.
An attempt that brought no answer the pipeline can read (issue 31: the session's `failure()`, or a stream
that isn't SSE) is judged like the one it replaced. Every decision is kept in `decisions` for the records:
why each attempt was made, or why none was. No mitmproxy import: the session handle is a Protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.regenerate.continuation import STAGE, NextAttempt, Received, SeedSource, next_attempt, system_seed
from tapfix.proxy.regenerate.echo import PrefixEcho
from tapfix.proxy.regenerate.eligibility import (
    UNREADABLE,
    Admission,
    Refused,
    RegenerateSettings,
    Ticket,
    Verdict,
    choices_asked,
    should_regenerate,
)
from tapfix.proxy.regenerate.evented_seam import EventedSeam, client_view
from tapfix.proxy.regenerate.repeat import RepeatDrop, repeated_kinds
from tapfix.proxy.regenerate.unreadable import Unreadable
from tapfix.proxy.sse import SSESplitter, event_data, format_event
from tapfix.proxy.surfaces import Surface, api_surface
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy


class AttemptsHandle(Protocol):
    """What the splice tells the stream's attempts (proxy/regenerate/session.py's AttemptSession)."""

    def end(self) -> None: ...

    def next_attempt(self, body: bytes, timeout_s: float, ticket: Ticket | None = None) -> None: ...

    def failure(self) -> str | None: ...

    def mark_failed(self, reason: str, *flags: str) -> None: ...


@dataclass
class Decision:
    """What happened at one attempt's end: `attempt` is the number of the attempt asked for (2...N+1);
    `made` whether it was sent; `changes` say why it looks as it does, or why it wasn't made."""

    attempt: int
    made: bool
    reason: str
    detail: str
    changes: list[Change] = field(default_factory=list)


def skipped(number: int, reason: str, detail: str) -> Decision:
    """Attempt `number` not made: a `skip` row whose `after` is the reason."""
    return Decision(number, False, reason, detail, [Change(STAGE, "skip", f"attempt[{number}]", None, reason, detail)])


@dataclass(frozen=True, slots=True)
class Admitted:
    """The next attempt may go: its body (continuation rules), the upstream's slot, the row saying why."""

    plan: NextAttempt
    ticket: Ticket | None
    why: Change

    def decision(self, number: int, more: Sequence[Change] = ()) -> Decision:
        return Decision(number, True, self.plan.how, self.plan.reason, [self.why, *self.plan.changes, *more])


def admit_next(
    verdict: Verdict,
    number: int,
    request: Mapping[str, Any],
    surface: Surface,
    engine: str | None,
    received: Received,
    admission: Admission | None,
    seed: SeedSource = system_seed,
) -> Admitted | Decision:
    """What follows `should_regenerate` on every path (a stream's splice, a whole body): the next body,
    then the upstream's admission; or the skip, whichever refused first."""
    if not verdict.go:
        return skipped(number, str(verdict.no), verdict.detail)
    plan = next_attempt(request, surface, engine, received, attempt=number, seed=seed)
    if not isinstance(plan, NextAttempt):
        return skipped(number, plan.reason, plan.detail)
    ticket: Ticket | None = None
    if admission is not None:
        admitted = admission.try_admit()
        if isinstance(admitted, Refused):
            return skipped(number, admitted.reason, admitted.detail)
        ticket = admitted
    why = Change(STAGE, "regenerate", f"attempt[{number}]", verdict.trigger, plan.how, verdict.detail)
    return Admitted(plan, ticket, why)


class Seam:
    """First stage of attempt 2+: drops the new attempt's role-only opening chunk (the client has one),
    gives its chunks the first attempt's id, so the client reads one completion, and strips a leading
    copy of a continuation prefix the engine repeats (echo.PrefixEcho)."""

    def __init__(self, first_id: str | None, prefix: dict[str, str] | None = None) -> None:
        self.first_id = first_id.encode() if first_id else None
        self.new_id: bytes | None = None
        self.opened = False
        self.echo = PrefixEcho(prefix or {})
        self._stripping = bool(prefix)

    def feed(self, event: bytes) -> list[bytes]:
        data = event_data(event)
        if data is None or data.strip() == b"[DONE]":
            return [event]
        obj: dict[str, Any] | None = None
        if self.new_id is None or not self.opened or self._stripping:
            obj = json_object(data)
        if self.new_id is None and obj is not None and isinstance(obj.get("id"), str):
            self.new_id = obj["id"].encode()
        if not self.opened:
            self.opened = True
            if _role_only(obj):
                return []
        if self._stripping and obj is not None:
            stripped = self._strip(obj)
            if stripped is not None:
                return [stripped] if stripped else []
        if self.first_id is not None and self.new_id is not None and self.new_id != self.first_id:
            event = event.replace(b'"id":"' + self.new_id + b'"', b'"id":"' + self.first_id + b'"', 1)
        return [event]

    def _strip(self, obj: dict[str, Any]) -> bytes | None:
        """The event with a repeated prefix taken out of its delta (b"": nothing left), None: as it came."""
        choices = obj.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            return None
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            return None
        changed = False
        for key, name in (("content", "content"), ("reasoning_content", "reasoning"), ("reasoning", "reasoning")):
            text = delta.get(key)
            if isinstance(text, str) and text:
                kept = self.echo.feed(name, text)
                if kept != text:
                    delta[key], changed = kept, True
        if set(delta) - {"content", "reasoning_content", "reasoning", "role"}:
            self._stripping = False  # a tool call or a finish: the prefix is over
        if not changed:
            return None
        if (
            not any(delta.get(k) for k in ("content", "reasoning_content", "reasoning"))
            and choices[0].get("finish_reason") is None
            and set(delta) <= {"content", "reasoning_content", "reasoning", "role"}
        ):
            return b""
        if self.first_id is not None:
            obj["id"] = self.first_id.decode()
        return format_event(orjson.dumps(obj), b"\n")

    def flush(self) -> list[bytes]:
        return []

    @property
    def seen(self) -> bool:
        """An event of this attempt reached the seam."""
        return self.opened


def _role_only(obj: dict[str, Any] | None) -> bool:
    choices = obj.get("choices") if obj else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    return (
        isinstance(delta, dict)
        and set(delta) <= {"role", "content"}
        and not delta.get("content")
        and choices[0].get("finish_reason") is None
    )


def received_from(client_chunks: Sequence[bytes]) -> Received:
    """What the client got for choice 0 (content, reasoning, whether a tool-call byte), from the
    client-bound bytes. Runs once per attempt end, never per chunk."""
    splitter = SSESplitter()
    content: list[str] = []
    reasoning: list[str] = []
    tool_call = False
    for event in splitter.feed(b"".join(client_chunks)) + splitter.flush():
        data = event_data(event)
        obj = json_object(data) if data is not None else None
        for choice in (obj or {}).get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
            text = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(text, str):
                reasoning.append(text)
            tool_call = tool_call or bool(delta.get("tool_calls"))
    return Received("".join(content), "".join(reasoning), tool_call)


class AttemptSplice:
    def __init__(
        self,
        session: AttemptsHandle,
        request: dict[str, Any] | Callable[[], dict[str, Any]],
        make_stages: Callable[[], list[Any]],
        settings: RegenerateSettings,
        policy: ToolRepairPolicy,
        engine: str | None = None,
        admission: Admission | None = None,
        clock: Callable[[], float] = time.monotonic,
        surface: Surface = "chat",
    ) -> None:
        """`surface`: chat gets a `Seam` ahead of each later attempt's stages; Responses and Messages an
        `evented_seam.EventedSeam` after them (the attempt's tool-call stage reads it as a stream of its own)."""
        self.session = session
        self.surface = surface
        self._request = request
        self.make_stages = make_stages
        self.settings = settings
        self.policy = policy
        self.engine = engine
        self.admission = admission
        self.clock = clock
        self.attempts_made = 0
        self.budget_started: float | None = None
        self.stage_history: list[Any] = []  # every attempt's tool-call stage, for the record
        self.decisions: list[Decision] = []
        # The error events of the attempt being retried: what the client gets if the next attempt
        # brings no event at all (its request failed, or it answered with no body).
        self.fallback: list[bytes] = []
        # What the attempt being retried was judged (outcome, defects, its tool-call stage): a failed
        # later attempt is judged the same, since the trouble it was to fix is still there.
        self.judged: tuple[str, set[str], Any] | None = None
        self.first_id: str | None = None  # the client's completion id (chat), across attempts
        self.answered_by: Any = None  # the earlier stage whose error events the client got, if any
        self.unreadable_sent = False  # the client got the retryable error of a stream that isn't SSE

    @property
    def request(self) -> dict[str, Any]:
        if callable(self._request):
            self._request = self._request()
        return self._request

    def attempt_end(
        self, stages: list[Any], client_chunks: Sequence[bytes], unreadable: Unreadable | None = None
    ) -> tuple[list[bytes], list[Any] | None]:
        """(bytes to send now, the next attempt's stages or None). Called once per attempt end.

        Another attempt is considered when this one's tool-call stage deferred its verdict, or when the
        attempt failed: the session found no answer the pipeline can read (a status, a content type, a
        coding, the budget), or the pipeline found its stream isn't SSE (`unreadable`). A failed attempt
        is judged like the one it replaced (attempt 1 has none: trigger `unreadable`); when no other
        attempt follows, the client gets that attempt's error events, or `unreadable`'s."""
        stage = next((s for s in stages if hasattr(s, "deferred")), None)
        if stage is not None:
            self.stage_history.append(stage)
        deferred = list(stage.deferred) if stage is not None else []
        if unreadable is not None:
            self.session.mark_failed(unreadable.reason, "not_sse")
        failure = self.session.failure()
        if stage is not None and deferred:
            outcome, defects, replaced = stage.outcome, set(stage.defects), stage
            stage.deferred = []
            errors = _remapped(stages, deferred)
        elif failure is not None and self.judged is not None:
            outcome, defects, replaced = self.judged
            errors = self.fallback
        elif failure is not None and unreadable is not None:
            outcome, defects, replaced = UNREADABLE, set(), None
            errors = list(unreadable.events)
        else:
            self.session.end()
            return self._unanswered(stages), None
        self.fallback = []
        number = self.attempts_made + 2
        view = client_view(self.surface, client_chunks) if api_surface(self.surface).evented else None
        received = view.received if view is not None else received_from(client_chunks)
        now = self.clock()
        verdict = should_regenerate(
            self.settings,
            outcome=outcome,
            defects=defects,
            policy=self.policy,
            tool_call_sent=received.tool_call_sent or bool(getattr(stage, "_streamed", False)),
            stream_valid_prefix=bool(getattr(stage, "stream_valid_prefix", False)),
            client_connected=True,  # a client that left ended the attempt loop: no attempt end came
            n=choices_asked(self.request),
            attempts_made=self.attempts_made,
            budget_started=self.budget_started,
            now=now,
        )
        step = admit_next(verdict, number, self.request, self.surface, self.engine, received, self.admission)
        if isinstance(step, Decision):
            self.decisions.append(step)
            self.session.end()
            self._answered(replaced, errors, unreadable)
            return errors, None
        plan = step.plan
        if self.budget_started is None:
            self.budget_started = now
        self.attempts_made += 1
        self.judged = (outcome, defects, replaced)
        self.fallback = errors
        # A chat attempt from scratch doesn't say again what the client read (repeat.py); a continuation
        # carries on from it, and Responses/Messages have their seam's own rule.
        repeats = repeated_kinds(received) if view is None and plan.how != "continuation" else ()
        decision = step.decision(number)
        self.decisions.append(decision)
        self.session.next_attempt(orjson.dumps(plan.body), verdict.remaining_s, step.ticket)
        if view is not None:
            return [], [*self.make_stages(), view.seam(number, decision.changes)]
        envelope = getattr(getattr(stage, "_out", None), "envelope", None) or {}
        first_id = envelope.get("id") if isinstance(envelope.get("id"), str) else None
        if first_id is None and self.first_id is not None:
            first_id = self.first_id
        self.first_id = first_id
        repeat = RepeatDrop(repeats, number, decision.changes)
        return [], [Seam(first_id, dict(plan.prefix)), *self.make_stages(), repeat]

    def _answered(self, replaced: Any, errors: list[bytes], unreadable: Unreadable | None) -> None:
        """The error events of `replaced` (an earlier attempt's tool-call stage), or `unreadable`'s, are
        what the client gets: the record says so (addons/stream.py, `collect`)."""
        if unreadable is not None and errors == unreadable.events:
            self.unreadable_sent = True
        elif replaced is not None:
            self.answered_by = replaced

    def at_end(self, stages: list[Any]) -> list[bytes]:
        """The last attempt was cut off (no decision at its end): a deferred error event goes out, or, when
        the attempt brought nothing, the one of the attempt it replaced."""
        for stage in stages:
            deferred: list[bytes] | None = getattr(stage, "deferred", None)
            if deferred:
                setattr(stage, "deferred", [])  # noqa: B010 (a tool-call stage's, not every stage's)
                return _remapped(stages, deferred)
        return self._unanswered(stages)

    def _unanswered(self, stages: list[Any]) -> list[bytes]:
        seam = next((s for s in stages if isinstance(s, Seam | EventedSeam)), None)
        if seam is None or seam.seen or not self.fallback:
            return []
        out, self.fallback = self.fallback, []
        if self.judged is not None:
            self.answered_by = self.judged[2]
        return out


def _remapped(stages: list[Any], events: list[bytes]) -> list[bytes]:
    """Events a tool-call stage kept back, numbered like the attempt's others (Responses, Messages)."""
    seam = next((s for s in stages if isinstance(s, EventedSeam)), None)
    return seam.remap(events) if seam is not None else events
