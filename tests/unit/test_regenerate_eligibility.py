"""proxy/regenerate/eligibility.py: when a new attempt is made, and the per-upstream admission budget."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.regenerate.eligibility import (
    Admission,
    Admissions,
    AdmissionSettings,
    Refused,
    RegenerateSettings,
    SettingError,
    Ticket,
    check_attempts,
    check_budget,
    should_regenerate,
    trigger_for,
)
from tapfix.proxy.toolcalls.defects import EMPTY_TURN, MISSING_FRAGMENT, UNKNOWN_TOOL

BROKEN: dict[str, Any] = {
    "outcome": "unrecoverable",
    "defects": [MISSING_FRAGMENT],
    "policy": "error",
    "tool_call_sent": False,
    "stream_valid_prefix": False,
    "client_connected": True,
    "n": 1,
    "attempts_made": 0,
    "budget_started": None,
    "now": 100.0,
}


def verdict(settings: RegenerateSettings | None = None, **changed: Any) -> Any:
    return should_regenerate(settings or RegenerateSettings(), **(BROKEN | changed))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_triggers():
    assert trigger_for("unrecoverable", [MISSING_FRAGMENT]) == "unrecoverable"
    assert trigger_for("unrecoverable", [EMPTY_TURN]) == "empty_tool_turn"
    assert trigger_for("untouched", [UNKNOWN_TOOL]) is None
    assert trigger_for("untouched", [UNKNOWN_TOOL], unknown_tool=True) == "unknown_tool"
    assert trigger_for("repaired", [MISSING_FRAGMENT]) is None
    assert trigger_for("recovered_from_error", []) is None


def test_a_broken_call_is_regenerated_with_the_whole_budget():
    v = verdict()
    assert v.go and v.trigger == "unrecoverable" and v.remaining_s == 60.0 and "attempt 2" in v.detail
    assert verdict(policy="fail_fast").go


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        ({"outcome": "repaired"}, "nothing_to_regenerate"),
        ({"policy": "passthrough"}, "policy"),
        ({"policy": "off"}, "policy"),
        ({"n": 2}, "n_gt_1"),
        ({"tool_call_sent": True}, "tool_call_sent"),
        ({"tool_call_sent": True, "stream_valid_prefix": True}, "streamed_prefix"),
        ({"client_connected": False}, "client_gone"),
        ({"attempts_made": 1}, "attempts_spent"),
        ({"budget_started": 40.0, "now": 100.0}, "budget_spent"),
    ],
)
def test_each_only_while_rule(changed, reason):
    v = verdict(**changed)
    assert not v.go and v.no == reason and v.detail


def test_off_and_more_attempts_and_the_budget_left():
    assert verdict(RegenerateSettings(attempts=0)).no == "off"
    three = RegenerateSettings(attempts=3, budget_s=30)
    v = verdict(three, attempts_made=2, budget_started=90.0, now=100.0)
    assert v.go and v.remaining_s == 20.0 and "attempt 4" in v.detail
    assert verdict(three, attempts_made=3, budget_started=90.0).no == "attempts_spent"
    # only with the setting does an unknown tool call for an attempt
    unknown = {"outcome": "untouched", "defects": [UNKNOWN_TOOL]}
    assert verdict(**unknown).no == "nothing_to_regenerate"
    assert verdict(RegenerateSettings(unknown_tool=True), **unknown).trigger == "unknown_tool"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RegenerateSettings(attempts=-1), "regenerate must be a whole number from 0 to 10 (0 = off), got -1"),
        (lambda: RegenerateSettings(attempts=11), "got 11"),
        (lambda: RegenerateSettings(attempts=True), "got True"),
        (lambda: RegenerateSettings(attempts=1.0), "got 1.0"),
        (lambda: RegenerateSettings(budget_s=0), "regenerate_budget must be a number of seconds above 0"),
        (lambda: RegenerateSettings(budget_s=float("inf")), "got inf"),
        (lambda: RegenerateSettings(budget_s=3601), "at most 3600"),
        (lambda: RegenerateSettings(unknown_tool="yes"), "regenerate_unknown_tool must be true or false"),
        (lambda: AdmissionSettings(concurrency=0), "regenerate_concurrency must be a whole number from 1 to 64"),
        (lambda: AdmissionSettings(per_minute=1001), "regenerate_per_minute must be a whole number from 1 to 1000"),
    ],
)
def test_range_checks_say_what_is_wrong(make, message):
    with pytest.raises(SettingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_checks_take_the_flag_name_and_accept_the_edges():
    with pytest.raises(ValueError, match="--regenerate must be"):
        check_attempts(12, "--regenerate")
    assert check_attempts(0) == 0 and check_attempts(10) == 10
    assert check_budget(3600) == 3600.0 and check_budget(0.5) == 0.5
    assert RegenerateSettings() == RegenerateSettings(1, 60.0, False)
    assert AdmissionSettings() == AdmissionSettings(2, 30)


def test_admission_limits_attempts_in_flight():
    admission = Admission(AdmissionSettings(concurrency=2, per_minute=30), Clock())
    first, second = admission.try_admit(), admission.try_admit()
    assert isinstance(first, Ticket) and isinstance(second, Ticket)
    third = admission.try_admit()
    assert isinstance(third, Refused) and third.reason == "concurrency"
    first.release()
    first.release()  # idempotent: one slot freed
    assert admission.in_flight == 1
    with admission.try_admit() as ticket:
        assert isinstance(ticket, Ticket) and admission.in_flight == 2
    assert admission.in_flight == 1


def test_admission_limits_starts_per_sliding_minute():
    clock = Clock()
    admission = Admission(AdmissionSettings(concurrency=64, per_minute=3), clock)
    for step in range(3):
        clock.now = 1000.0 + step * 10
        ticket = admission.try_admit()
        assert isinstance(ticket, Ticket)
        ticket.release()
    clock.now = 1030.0
    refused = admission.try_admit()
    assert isinstance(refused, Refused) and refused.reason == "per_minute" and refused.retry_in_s == 30.0
    clock.now = 1060.0  # the first start leaves the window
    assert isinstance(admission.try_admit(), Ticket)
    assert isinstance(admission.try_admit(), Refused)


def test_admissions_are_per_upstream():
    admissions = Admissions({"a": AdmissionSettings(concurrency=1)}, Clock())
    assert admissions.for_upstream("a") is admissions.for_upstream("a")
    assert isinstance(admissions.for_upstream("a").try_admit(), Ticket)
    assert isinstance(admissions.for_upstream("a").try_admit(), Refused)
    b = admissions.for_upstream("b")
    assert b.settings == AdmissionSettings() and isinstance(b.try_admit(), Ticket)


@given(
    st.integers(1, 4),
    st.integers(1, 6),
    st.lists(st.tuples(st.sampled_from(["admit", "release", "tick"]), st.floats(0, 40)), max_size=60),
)
def test_admission_never_exceeds_either_limit(concurrency, per_minute, ops):
    clock = Clock()
    admission = Admission(AdmissionSettings(concurrency, per_minute), clock)
    held: list[Ticket] = []
    starts: list[float] = []
    for op, value in ops:
        if op == "tick":
            clock.now += value
        elif op == "release" and held:
            held.pop(0).release()
        elif op == "admit":
            result = admission.try_admit()
            if isinstance(result, Ticket):
                held.append(result)
                starts.append(clock.now)
            else:
                in_window = [s for s in starts if s > clock.now - 60]
                assert len(held) >= concurrency or len(in_window) >= per_minute
        assert admission.in_flight == len(held) <= concurrency
        assert sum(1 for s in starts if s > clock.now - 60) <= per_minute
