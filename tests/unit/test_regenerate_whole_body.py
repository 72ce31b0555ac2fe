"""Issue 19, non-streamed: the pure decisions of proxy/regenerate/whole_body.py, with the real body repairs
as the stages, a fake clock, and the records built from them by records.attempt_records."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.regenerate.eligibility import Admission, AdmissionSettings, RegenerateSettings
from tapfix.proxy.regenerate.records import REGENERATED, attempt_records
from tapfix.proxy.regenerate.session import Attempt
from tapfix.proxy.regenerate.whole_body import BodyOutcome, WholeBodyRegeneration, needs_another, not_an_answer
from tapfix.proxy.toolcalls import body_repair_for

from tests.support.builders import message_tool_call, tool

TOOLS = [tool("read", {"path": {"type": "string"}}, ["path"])]
REQUEST: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "read a.txt"}], "tools": TOOLS}
HEADERS = [("content-type", "application/json"), ("authorization", "Bearer k")]


def completion(arguments: str, finish: str, name: str = "read") -> bytes:
    call = message_tool_call(arguments, name=name)
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return orjson.dumps(
        {
            "id": "cmpl",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
    )


BROKEN = completion('{"pa', "length")
FINE = completion('{"path": "a.txt"}', "tool_calls")
UNKNOWN = completion('{"path": "a.txt"}', "tool_calls", name="delete")


def stages(body: bytes) -> BodyOutcome:
    """The stream owner's body stages, reduced to the real chat repair (addons/stream.py `body_outcome`)."""
    repair = body_repair_for("chat")
    assert repair is not None
    out, changes, outcome = repair(body, TOOLS, capture_id="cap", policy="error")
    return BodyOutcome(out, changes, outcome, outcome == "unrecoverable" and out != body)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(
    first: bytes = BROKEN,
    request: dict[str, Any] | None = None,
    settings: RegenerateSettings | None = None,
    **kw: Any,
) -> WholeBodyRegeneration:
    kw.setdefault("clock", Clock())
    kw.setdefault("seed", lambda: 4242)
    return WholeBodyRegeneration(
        request or REQUEST,
        kw.pop("surface", "chat"),
        stages(first),
        settings or RegenerateSettings(1),
        "error",
        headers=HEADERS,
        **kw,
    )


def answer(attempt: Attempt, body: bytes, status: int = 200) -> bytes:
    """What the relay's fetch_whole leaves on the attempt."""
    attempt.status, attempt.headers, attempt.chunks, attempt.times = (
        status,
        [("content-type", "application/json")],
        [body],
        [1.0],
    )
    attempt.ended = 2.0
    return body


def skips(regen: WholeBodyRegeneration) -> list[str]:
    return [d.reason for d in regen.decisions if not d.made]


def test_a_broken_body_gets_a_second_attempt_with_a_fresh_seed_and_its_good_answer_wins() -> None:
    regen = make()
    send = regen.plan()
    assert send is not None and send.attempt.number == 2 and send.timeout_s == 60.0 and send.ticket is None
    assert json.loads(send.attempt.body) == {**REQUEST, "seed": 4242}
    assert send.attempt.headers_sent == HEADERS
    good = regen.judge(send.attempt, answer(send.attempt, FINE), stages)
    assert good is not None and good.body == FINE and good.outcome == "untouched"
    why = regen.decisions[0].changes
    assert (why[0].kind, why[0].before, why[0].after) == ("regenerate", "unrecoverable", "fresh_seed")
    assert [(c.kind, c.path, c.after) for c in why[1:]] == [("inject", "$.seed", 4242)]


def test_a_good_first_answer_needs_nothing() -> None:
    assert not needs_another(stages(FINE), RegenerateSettings(1), "error")
    assert needs_another(stages(BROKEN), RegenerateSettings(1), "error")
    assert not needs_another(stages(BROKEN), RegenerateSettings(0), "error"), "regenerate 0: off"
    assert not needs_another(stages(BROKEN), RegenerateSettings(1), "passthrough")
    assert needs_another(stages(BROKEN), RegenerateSettings(1), "fail_fast")
    regen = make(FINE)
    assert regen.plan() is None and regen.decisions == []


def test_an_unknown_tool_is_regenerated_only_when_asked() -> None:
    assert not needs_another(stages(UNKNOWN), RegenerateSettings(1), "error")
    on = RegenerateSettings(1, unknown_tool=True)
    assert needs_another(stages(UNKNOWN), on, "error")
    regen = make(UNKNOWN, settings=on)
    send = regen.plan()
    assert send is not None and regen.decisions[0].changes[0].before == "unknown_tool"
    assert regen.judge(send.attempt, answer(send.attempt, UNKNOWN), stages) is None, "the same defect again"
    assert regen.plan() is None and skips(regen) == ["attempts_spent"]


@pytest.mark.parametrize("deterministic", [{"temperature": 0}, {"seed": 3}, {"top_k": 1}])
def test_a_deterministic_request_is_skipped_and_recorded(deterministic: dict[str, Any]) -> None:
    regen = make(request={**REQUEST, **deterministic}, engine="vllm")
    assert regen.plan() is None and skips(regen) == ["deterministic"]
    assert regen.attempts_made == 0


def test_responses_and_messages_go_again_unchanged() -> None:
    request = {"model": "m", "input": "read a.txt", "tools": TOOLS}
    regen = make(request=request, surface="responses")
    send = regen.plan()
    assert send is not None and json.loads(send.attempt.body) == request
    assert regen.decisions[0].changes[0].after == "fresh"


def test_every_attempt_broken_spends_the_attempts_and_a_failed_upstream_counts_as_one() -> None:
    regen = make(settings=RegenerateSettings(3))
    send = regen.plan()
    assert send is not None
    assert regen.judge(send.attempt, answer(send.attempt, b'{"error": "overloaded"}', 503), stages) is None
    assert send.attempt.error == "the upstream answered 503"
    send = regen.plan()  # the 503 answered nothing: attempt 1's trigger still holds
    assert send is not None and send.attempt.number == 3
    send.attempt.error = "connection refused"
    assert regen.judge(send.attempt, None, stages) is None
    send = regen.plan()
    assert send is not None and send.attempt.number == 4
    assert regen.judge(send.attempt, answer(send.attempt, BROKEN), stages) is None
    assert regen.plan() is None and skips(regen) == ["attempts_spent"]
    assert [a.number for a in regen.attempts] == [1, 2, 3, 4]
    assert [r.outcome for r in regen.stage_history] == ["unrecoverable", "untouched", "untouched", "unrecoverable"]


def test_the_budget_counts_from_the_first_regeneration() -> None:
    clock = Clock()
    regen = make(settings=RegenerateSettings(3, budget_s=10), clock=clock)
    send = regen.plan()
    assert send is not None and send.timeout_s == 10
    clock.now += 7
    regen.judge(send.attempt, answer(send.attempt, BROKEN), stages)
    send = regen.plan()
    assert send is not None and send.timeout_s == pytest.approx(3)
    clock.now += 3
    regen.judge(send.attempt, answer(send.attempt, BROKEN), stages)
    assert regen.plan() is None and skips(regen) == ["budget_spent"]


def test_the_upstreams_admission_bounds_the_attempts() -> None:
    admission = Admission(AdmissionSettings(concurrency=1, per_minute=5), Clock())
    held = admission.try_admit()
    regen = make(admission=admission)
    assert regen.plan() is None and skips(regen) == ["concurrency"]
    held.release()  # type: ignore[union-attr]
    regen = make(admission=admission)
    send = regen.plan()
    assert send is not None and send.ticket is not None and admission.in_flight == 1
    send.ticket.release()
    assert admission.in_flight == 0


def test_two_choices_or_a_gone_client_are_not_regenerated() -> None:
    regen = make(request={**REQUEST, "n": 2})
    assert regen.plan() is None and skips(regen) == ["n_gt_1"]
    regen = make()
    assert regen.plan(client_connected=False) is None and skips(regen) == ["client_gone"]


def test_the_records_are_the_streams_with_whole_bodies() -> None:
    regen = make(settings=RegenerateSettings(2))
    first = regen.plan()
    assert first is not None
    regen.judge(first.attempt, answer(first.attempt, BROKEN), stages)
    second = regen.plan()
    assert second is not None
    regen.judge(second.attempt, answer(second.attempt, FINE), stages)
    parent = Exchange(path="/v1/chat/completions", request=orjson.dumps(REQUEST), response=BROKEN, status=200)
    records = attempt_records(parent, regen, regen)
    assert REGENERATED in parent.flags and parent.response == BROKEN and parent.response_chunks == []
    assert [(r.attempt, r.attempt_of, r.status) for r in records] == [(2, parent.id, 200), (3, parent.id, 200)]
    assert [r.response for r in records] == [BROKEN, FINE]
    assert all(r.response_chunks == [] and r.chunk_times == [] for r in records)
    assert [json.loads(r.request)["seed"] for r in records] == [4242, 4242]
    assert "toolcall_unrecoverable" in records[0].flags and "toolcall_unrecoverable" not in records[1].flags
    assert [c.kind for c in records[1].changes][:2] == ["regenerate", "inject"]
    assert regen.later_changes() == [c for r in regen.stage_history[1:] for c in r.changes]


# -- issue 31, item 7: a 200 that isn't the surface's answer is a failed attempt -----------------------
@pytest.mark.parametrize(
    ("surface", "body"),
    [
        ("chat", b"<html><body><h1>502 Bad Gateway</h1></body></html>"),
        ("chat", b'{"detail": "busy"}'),
        ("responses", b'{"id": "resp", "object": "response"}'),
        ("messages", b'{"type": "error", "error": {"type": "overloaded_error"}}'),
        ("messages", b"data: {}\n\n"),
    ],
)
def test_a_200_that_is_no_answer_is_a_failed_attempt_and_the_next_follows(surface: str, body: bytes) -> None:
    assert not_an_answer(surface, body) is not None  # type: ignore[arg-type]
    regen = make(settings=RegenerateSettings(2))
    send = regen.plan()
    assert send is not None
    assert regen.judge(send.attempt, answer(send.attempt, body), stages) is None
    assert send.attempt.failed and send.attempt.error and regen.stage_history[-1].outcome == "untouched"
    later = regen.plan()
    assert later is not None and later.attempt.number == 3, "judged like attempt 1: its trigger still holds"


@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
def test_each_surfaces_answer_is_an_answer(surface: str) -> None:
    bodies = {
        "chat": FINE,
        "responses": b'{"id": "r", "object": "response", "output": []}',
        "messages": b'{"id": "m", "type": "message", "content": []}',
    }
    assert not_an_answer(surface, bodies[surface]) is None  # type: ignore[arg-type]
