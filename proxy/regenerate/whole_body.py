"""Regenerating a non-streamed answer (issue 19): the decisions, without the sending.

A whole body is held until mitmproxy's `response` hook, and nothing of it has reached the client, so a
new attempt is a plain second upstream request made there (addons/regenerate_body.py). That makes it
simpler than a stream: no splice, no seam, no prefix. The client has received nothing, so a new attempt
never continues anything (`Received()` empty: `continuation.next_attempt` starts again from scratch, with
a fresh seed where the surface and engine take one, and skips a deterministic request as
`deterministic`). The same rules as the stream decide (eligibility.should_regenerate, the upstream's
`Admission`); the records are the stream's (records.attempt_records), so this class keeps `attempts`,
`decisions` and `stage_history` the way the relay session and the splice do.

The addon's loop: `first` is attempt 1's body through the stages (tool-call repair, reasoning rename);
`plan()` gives the next attempt to send (None: no more, the reason recorded); the addon sends it and
hands the answer to `judge()`, which runs the stages on it and returns what the client gets when it is
good. When no attempt is good the client gets attempt 1's answer, exactly as without regeneration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.regenerate.continuation import Received, SeedSource, system_seed
from tapfix.proxy.regenerate.eligibility import (
    Admission,
    RegenerateSettings,
    Ticket,
    choices_asked,
    should_regenerate,
    trigger_for,
)
from tapfix.proxy.regenerate.session import Attempt
from tapfix.proxy.regenerate.splice import Decision, admit_next
from tapfix.proxy.surfaces import Surface, api_surface
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy


@dataclass(frozen=True, slots=True)
class BodyOutcome:
    """One whole body through the response stages: what the client would get (`body`, the upstream's
    own object when nothing changed), the stages' records, the tool-call repair's outcome
    ("untouched" / "repaired" / "unrecoverable", "" when no repair ran), and whether the body is now the
    unrecoverable call's error object (sent with 502, or 422 under fail_fast)."""

    body: bytes
    changes: list[Change]
    outcome: str
    failed: bool = False

    @property
    def defects(self) -> set[str]:
        return {c.kind for c in self.changes}


BodyStages = Callable[[bytes], BodyOutcome]
# The `Exchange.extra` key under which the stream owner leaves `(attempt 1's BodyOutcome, BodyStages)`.
WHOLE_BODY: Final = "whole_body"


@dataclass(frozen=True, slots=True)
class StageRecord:
    """An attempt's tool-call records, as records.attempt_records reads a stream stage's."""

    changes: list[Change] = field(default_factory=list)
    outcome: str = "untouched"


@dataclass(frozen=True, slots=True)
class Send:
    """The next attempt to send: `attempt` (already in `attempts`) to fill in, within `timeout_s`."""

    attempt: Attempt
    timeout_s: float
    ticket: Ticket | None


def needs_another(first: BodyOutcome, settings: RegenerateSettings, policy: ToolRepairPolicy) -> bool:
    """Whether regeneration applies to this answer at all: on (`regenerate` above 0), under `--tool-repair
    error` or `fail_fast`, and attempt 1's body calls for another attempt. Otherwise nothing is recorded,
    as for a stream that never went through the relay."""
    if settings.attempts == 0 or policy not in ("error", "fail_fast"):
        return False
    return trigger_for(first.outcome, first.defects, settings.unknown_tool) is not None


def not_an_answer(surface: Surface, body: bytes) -> str | None:
    """Why `body` can't be read as `surface`'s whole answer (None: it can): not a JSON object, or one
    without the list the answer is made of."""
    # The field a whole answer can't do without: a body without it is no answer (an HTML page, an error
    # object, a proxy's JSON), whatever its status says.
    wanted = api_surface(surface).answer_field
    if wanted is None:
        return None
    parsed = json_object(body)
    if parsed is None:
        return f"the attempt's answer is not JSON (it starts {body[:40]!r})"
    if not isinstance(parsed.get(wanted), list):
        return f"the attempt's answer is JSON without `{wanted}`, not a {surface} answer"
    return None


class WholeBodyRegeneration:
    def __init__(
        self,
        request: Mapping[str, Any],
        surface: Surface,
        first: BodyOutcome,
        settings: RegenerateSettings,
        policy: ToolRepairPolicy,
        *,
        engine: str | None = None,
        admission: Admission | None = None,
        headers: list[tuple[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: SeedSource = system_seed,
    ) -> None:
        self.request = request
        self.surface = surface
        self.settings = settings
        self.policy = policy
        self.engine = engine
        self.admission = admission
        self.headers = list(headers or [])
        self.clock = clock
        self.seed = seed
        self.attempts: list[Attempt] = [Attempt(1, b"")]  # attempt 1 is the client-facing exchange itself
        self.decisions: list[Decision] = []
        self.stage_history: list[StageRecord] = [StageRecord(first.changes, first.outcome or "untouched")]
        self.budget_started: float | None = None
        self._judged = first  # the last attempt that answered: what the next one answers

    @property
    def attempts_made(self) -> int:
        return len(self.attempts) - 1

    def plan(self, client_connected: bool = True) -> Send | None:
        """The next attempt, or None: none is called for, or the rules refuse one (recorded as a skip)."""
        number = self.attempts_made + 2
        now = self.clock()
        verdict = should_regenerate(
            self.settings,
            outcome=self._judged.outcome,
            defects=self._judged.defects,
            policy=self.policy,
            tool_call_sent=False,  # nothing of a held body reached the client
            stream_valid_prefix=False,
            client_connected=client_connected,
            n=choices_asked(self.request),
            attempts_made=self.attempts_made,
            budget_started=self.budget_started,
            now=now,
        )
        if verdict.trigger is None:
            return None  # nothing to regenerate: nothing to record either
        step = admit_next(
            verdict, number, self.request, self.surface, self.engine, Received(), self.admission, self.seed
        )
        if isinstance(step, Decision):
            self.decisions.append(step)
            return None
        if self.budget_started is None:
            self.budget_started = now
        self.decisions.append(step.decision(number))
        attempt = Attempt(number, orjson.dumps(step.plan.body), self.headers)
        self.attempts.append(attempt)
        return Send(attempt, verdict.remaining_s, step.ticket)

    def judge(self, attempt: Attempt, body: bytes | None, stages: BodyStages) -> BodyOutcome | None:
        """The attempt's answer (`body` decoded; None when there is none to read) through `stages`:
        what the client gets when it is good, else None (the next `plan()` decides what follows)."""
        if attempt.error is None and attempt.status != 200:
            attempt.fail(f"the upstream answered {attempt.status}")
        if attempt.error is None and body is not None and (why := not_an_answer(self.surface, body)) is not None:
            attempt.fail(why)
        if attempt.error is not None or body is None:
            self.stage_history.append(StageRecord())  # its record says why (the status, the error)
            return None
        result = stages(body)
        self.stage_history.append(StageRecord(result.changes, result.outcome or "untouched"))
        self._judged = result
        if trigger_for(result.outcome, result.defects, self.settings.unknown_tool) is not None:
            return None
        return result

    def later_changes(self) -> list[Change]:
        """The later attempts' stage records, for the client-facing exchange (as a stream's are)."""
        return [c for record in self.stage_history[1:] for c in record.changes]
