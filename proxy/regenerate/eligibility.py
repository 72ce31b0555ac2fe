"""Whether to ask the upstream again now, and whether the upstream's budget admits another attempt.

Issue 19's rules. Regenerate when the tool-call stage ended a message as `unrecoverable` (a held call
cut, missing a required argument, unparseable; or a `tool_calls` finish with no call, kind
`empty_tool_turn`), or, with `regenerate_unknown_tool`, when a call named a tool that wasn't offered, or
when a relayed stream's first attempt isn't SSE at all (`unreadable`: a page or junk sent as an event
stream). And only while every one of these holds:
- the repair policy is `error` (the default) or `fail_fast` (`passthrough` forwards the broken call,
  `off` has no stage);
- regeneration is on (`regenerate` N > 0) and attempts are left;
- no byte of any tool call reached the client (under `--stream-valid-prefix` a call may already be
  partly out: it can't be taken back);
- the client is still connected;
- the request is one choice (`n` 1);
- the time budget (`regenerate_budget`, all attempts of one client request together, counted from the
  first regeneration's start) is not spent.

`Admission` is the per-upstream budget on top (`regenerate_concurrency` attempts in flight,
`regenerate_per_minute` started in any 60 s), so a storm of broken calls can't multiply an upstream's
load. Everything takes the clock as a value or an injected callable, so it is pure and testable; every
setting is range-checked as config/settings.py declares it, with a message a CLI flag or config loader
can show as is.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from tapfix.proxy.config.declare import SettingError as SettingError
from tapfix.proxy.config.settings import setting_named
from tapfix.proxy.toolcalls.defects import EMPTY_TURN, UNKNOWN_TOOL
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy

WINDOW_S: Final = 60.0

Trigger = Literal["unrecoverable", "empty_tool_turn", "unknown_tool", "unreadable"]
# The outcome of an attempt whose answer can't be read as the surface's answer (its stream isn't SSE).
UNREADABLE: Final = "unreadable"
NoReason = Literal[
    "nothing_to_regenerate",
    "off",
    "policy",
    "n_gt_1",
    "streamed_prefix",
    "tool_call_sent",
    "client_gone",
    "attempts_spent",
    "budget_spent",
]
Refusal = Literal["concurrency", "per_minute"]


def check_attempts(value: Any, name: str = "regenerate") -> int:
    return int(setting_named("regenerate").check(value, name))


def check_budget(value: Any, name: str = "regenerate_budget") -> float:
    return float(setting_named("regenerate_budget").check(value, name))


def check_concurrency(value: Any, name: str = "regenerate_concurrency") -> int:
    return int(setting_named("regenerate_concurrency").check(value, name))


def check_per_minute(value: Any, name: str = "regenerate_per_minute") -> int:
    return int(setting_named("regenerate_per_minute").check(value, name))


def check_flag(value: Any, name: str = "regenerate_unknown_tool") -> bool:
    return bool(setting_named("regenerate_unknown_tool").check(value, name))


@dataclass(frozen=True, slots=True)
class RegenerateSettings:
    """Per model: `regenerate` extra attempts, `regenerate_budget` seconds, `regenerate_unknown_tool`."""

    attempts: int = setting_named("regenerate").default
    budget_s: float = setting_named("regenerate_budget").default
    unknown_tool: bool = setting_named("regenerate_unknown_tool").default

    def __post_init__(self) -> None:
        check_attempts(self.attempts)
        check_budget(self.budget_s)
        check_flag(self.unknown_tool)


@dataclass(frozen=True, slots=True)
class AdmissionSettings:
    """Per upstream: `regenerate_concurrency` attempts in flight, `regenerate_per_minute` started."""

    concurrency: int = setting_named("regenerate_concurrency").default
    per_minute: int = setting_named("regenerate_per_minute").default

    def __post_init__(self) -> None:
        check_concurrency(self.concurrency)
        check_per_minute(self.per_minute)


def trigger_for(outcome: str, defects: Collection[str], unknown_tool: bool = False) -> Trigger | None:
    """What calls for a new attempt, from a repair stage's `outcome` and `defects` (or the
    `(body, changes, outcome)` of a non-streamed repair, its changes' kinds as the defects)."""
    if outcome == "unrecoverable":
        return "empty_tool_turn" if EMPTY_TURN in defects else "unrecoverable"
    if outcome == UNREADABLE:
        return "unreadable"
    if unknown_tool and UNKNOWN_TOOL in defects:
        return "unknown_tool"
    return None


@dataclass(frozen=True, slots=True)
class Verdict:
    trigger: Trigger | None
    no: NoReason | None  # None: regenerate now
    detail: str
    remaining_s: float  # of the time budget: the next attempt's deadline

    @property
    def go(self) -> bool:
        return self.no is None


def should_regenerate(
    settings: RegenerateSettings,
    *,
    outcome: str,
    defects: Collection[str],
    policy: ToolRepairPolicy,
    tool_call_sent: bool,
    stream_valid_prefix: bool,
    client_connected: bool,
    n: int,
    attempts_made: int,
    budget_started: float | None,
    now: float,
) -> Verdict:
    """`attempts_made`: regenerations already made for this client request (0 before the first);
    `budget_started`: the clock when the first one started (None before it); `tool_call_sent`: any
    byte of any tool call reached the client, in this message or an earlier one."""
    trigger = trigger_for(outcome, defects, settings.unknown_tool)
    spent = 0.0 if budget_started is None else max(0.0, now - budget_started)
    remaining = max(0.0, settings.budget_s - spent)

    def no(reason: NoReason, detail: str) -> Verdict:
        return Verdict(trigger, reason, detail, remaining)

    if trigger is None:
        return no("nothing_to_regenerate", f"the tool-call stage's outcome is {outcome}")
    if settings.attempts == 0:
        return no("off", "regenerate is 0")
    if policy not in ("error", "fail_fast"):
        return no("policy", f"--tool-repair {policy} does not regenerate")
    if n > 1:
        return no("n_gt_1", f"the request asks for n={n} choices")
    if tool_call_sent:
        if stream_valid_prefix:
            return no("streamed_prefix", "--stream-valid-prefix already forwarded part of a tool call")
        return no("tool_call_sent", "part of a tool call already reached the client")
    if not client_connected:
        return no("client_gone", "the client disconnected")
    if attempts_made >= settings.attempts:
        return no("attempts_spent", f"{attempts_made} of {settings.attempts} attempts made")
    if remaining <= 0:
        return no("budget_spent", f"the {settings.budget_s:g} s budget is spent")
    return Verdict(trigger, None, f"attempt {attempts_made + 2}: {trigger}", remaining)


class Ticket:
    """An admitted attempt: `release()` (or leaving its `with` block) frees its concurrency slot."""

    def __init__(self, admission: Admission) -> None:
        self._admission: Admission | None = admission

    def release(self) -> None:
        if self._admission is not None:
            self._admission._release()
            self._admission = None

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class Refused:
    reason: Refusal
    detail: str
    retry_in_s: float  # when a slot frees up by the clock alone (0 for concurrency: on a release)


class Admission:
    """One upstream's budget for regeneration attempts: a semaphore of `concurrency` slots and a sliding
    60 s window of at most `per_minute` starts. Synchronous, for the one event loop that uses it."""

    def __init__(self, settings: AdmissionSettings | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings or AdmissionSettings()
        self._clock = clock
        self._starts: deque[float] = deque()
        self.in_flight = 0

    def try_admit(self) -> Ticket | Refused:
        now = self._clock()
        while self._starts and self._starts[0] <= now - WINDOW_S:
            self._starts.popleft()
        if self.in_flight >= self.settings.concurrency:
            detail = f"{self.in_flight} regeneration attempts in flight (regenerate_concurrency)"
            return Refused("concurrency", detail, 0.0)
        if len(self._starts) >= self.settings.per_minute:
            retry = self._starts[0] + WINDOW_S - now
            detail = f"{len(self._starts)} attempts started in the last minute (regenerate_per_minute)"
            return Refused("per_minute", detail, retry)
        self._starts.append(now)
        self.in_flight += 1
        return Ticket(self)

    def _release(self) -> None:
        self.in_flight -= 1


class Admissions:
    """The `Admission` of each upstream, made on first use from its settings (defaults when none)."""

    def __init__(
        self, settings: dict[str, AdmissionSettings] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings or {}
        self._clock = clock
        self._by_upstream: dict[str, Admission] = {}

    def for_upstream(self, name: str) -> Admission:
        admission = self._by_upstream.get(name)
        if admission is None:
            admission = Admission(self._settings.get(name), self._clock)
            self._by_upstream[name] = admission
        return admission


def choices_asked(request: Mapping[str, Any]) -> int:
    """The request's `n` for the "one choice" rule: 1 when absent or not a whole number."""
    n = request.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) else 1
