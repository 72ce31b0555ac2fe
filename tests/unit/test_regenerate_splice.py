"""Issue 19's pure splice (proxy/regenerate/splice.py): the pipeline of a stream that may be regenerated,
judged at each attempt's end, with a fake session handle, fed as the stream owner feeds it
(tests/support/attempts.py)."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.regenerate.eligibility import Admission, AdmissionSettings, RegenerateSettings, Ticket
from tapfix.proxy.regenerate.splice import AttemptSplice, received_from
from tapfix.proxy.response.pipeline import StreamPipeline
from tapfix.proxy.toolcalls.chat_stage import ChatToolCallRepair

from tests.support.attempts import through_attempts
from tests.support.builders import chat_chunk, random_splits, sse, tool, tool_call_chunk
from tests.support.stage_io import client_view

TOOLS = [tool("read", {"path": {"type": "string"}}, ["path"])]
ROLE = chat_chunk({"role": "assistant", "content": ""}, id="first")


def broken(id: str = "first") -> bytes:
    return sse(
        [
            chat_chunk({"role": "assistant", "content": ""}, id=id),
            tool_call_chunk(0, "c1", "read", '{"pa', chunk_id=id),
            chat_chunk({}, "length", id=id),
        ]
    )


def healthy(id: str = "second") -> bytes:
    return sse(
        [
            chat_chunk({"role": "assistant", "content": ""}, id=id),
            tool_call_chunk(0, "c2", "read", '{"path": "a.txt"}', chunk_id=id),
            chat_chunk({}, "tool_calls", id=id),
        ]
    )


class FakeSession:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.timeouts: list[float] = []
        self.ended = 0
        self.failures: dict[int, str] = {}

    def end(self) -> None:
        self.ended += 1

    def next_attempt(self, body: bytes, timeout_s: float, ticket: Ticket | None = None) -> None:
        self.bodies.append(json.loads(body))
        self.timeouts.append(timeout_s)
        if ticket is not None:
            ticket.release()

    # An attempt's failure as the attempt loop would record it, by attempt number (`failures` scripts them).
    def failure(self) -> str | None:
        return self.failures.get(len(self.bodies) + 1)

    def mark_failed(self, reason: str, *flags: str) -> None:
        self.failures.setdefault(len(self.bodies) + 1, reason)


def chat_pipeline(
    request: dict[str, Any] | None = None,
    settings: RegenerateSettings | None = None,
    admission: Admission | None = None,
    engine: str | None = None,
) -> tuple[StreamPipeline, FakeSession, AttemptSplice]:
    """A chat stream's pipeline as addons/stream.py wires it when it may be regenerated, on a fake session."""
    relay = FakeSession()
    ex = Exchange(path="/v1/chat/completions", stream=True, tools=TOOLS)
    settings = settings or RegenerateSettings(1)

    def stages() -> list[Any]:
        stage = ChatToolCallRepair(TOOLS, capture_id=ex.id)
        stage.defer_fatal, stage.defer_unknown_tool = True, settings.unknown_tool
        return [stage]

    pipeline = StreamPipeline(ex, stages())
    body = request or {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": True}
    pipeline.splice = splice = AttemptSplice(relay, body, stages, settings, "error", engine=engine, admission=admission)
    return pipeline, relay, splice


def regenerated(
    attempts: list[bytes],
    request: dict[str, Any] | None = None,
    settings: RegenerateSettings | None = None,
    admission: Admission | None = None,
    seed: int = 0,
    engine: str | None = None,
    failures: dict[int, str] | None = None,
) -> tuple[bytes, FakeSession, AttemptSplice]:
    """Run the attempts' bytes through a spliced pipeline, cut at random places, each ending where the
    splice decides. `failures`: the attempts the attempt loop found no readable answer in."""
    pipeline, relay, splice = chat_pipeline(request, settings, admission, engine)
    relay.failures.update(failures or {})
    return through_attempts(pipeline, attempts, seed), relay, splice


@given(st.integers(0, 10_000))
def test_a_broken_first_attempt_then_a_healthy_one_is_one_completion(seed: int) -> None:
    data, relay, splice = regenerated([broken(), healthy()], seed=seed)
    view = client_view(data)
    assert view.errors == [] and view.done == 1
    assert [c["name"] for c in view.calls] == ["read"]
    assert {c["id"] for c in view.chunks} == {"first"}, "the second attempt's chunks carry the first id"
    assert sum(1 for c in view.chunks for ch in c["choices"] if ch["delta"].get("role")) == 1
    assert len(relay.bodies) == 1 and isinstance(relay.bodies[0]["seed"], int)
    assert [d.made for d in splice.decisions] == [True]


@given(st.integers(0, 10_000))
def test_every_attempt_broken_ends_with_one_error_event(seed: int) -> None:
    data, relay, splice = regenerated([broken(), broken("second")], seed=seed)
    view = client_view(data)
    assert len(view.errors) == 1 and view.done == 1 and view.calls == []
    assert [(d.made, d.reason) for d in splice.decisions] == [(True, "fresh_seed"), (False, "attempts_spent")]


def test_a_deterministic_request_is_skipped_and_says_so() -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    data, relay, splice = regenerated([broken()], request=request)
    assert relay.bodies == [] and len(client_view(data).errors) == 1
    assert [(d.made, d.reason) for d in splice.decisions] == [(False, "deterministic")]
    assert splice.decisions[0].changes[0].after == "deterministic"


def test_an_admission_refusal_is_recorded() -> None:
    admission = Admission(AdmissionSettings(1, 1))
    held = admission.try_admit()
    assert isinstance(held, Ticket)
    data, relay, splice = regenerated([broken()], admission=admission)
    assert relay.bodies == [] and len(client_view(data).errors) == 1
    assert [(d.made, d.reason) for d in splice.decisions] == [(False, "concurrency")]


def test_the_attempt_gets_what_is_left_of_the_budget() -> None:
    _, relay, _ = regenerated([broken(), healthy()], settings=RegenerateSettings(1, 7.5))
    assert relay.timeouts and 0 < relay.timeouts[0] <= 7.5


def test_a_healthy_first_attempt_ends_the_stream() -> None:
    data, relay, splice = regenerated([healthy("first")])
    assert relay.ended == 1 and relay.bodies == [] and splice.decisions == []
    assert len(client_view(data).calls) == 1


def test_received_from_reads_content_reasoning_and_a_sent_call() -> None:
    data = sse([chat_chunk({"content": "He"}), chat_chunk({"reasoning_content": "r"}), chat_chunk({"content": "y"})])
    assert received_from([data]) == received_from([data[:7], data[7:]])
    got = received_from([data])
    assert (got.content, got.reasoning, got.tool_call_sent) == ("Hey", "r", False)
    assert received_from([sse([tool_call_chunk(0, "c", "read", "{")])]).tool_call_sent


# -- issue 31: failed attempts, streams that aren't SSE -----------------------------------------------
GARBAGE = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n\x00\x01"


@settings(deadline=None)  # the whole pipeline per example, on a shared machine
@given(st.integers(0, 10_000))
def test_a_failed_later_attempt_is_followed_by_the_next(seed: int) -> None:
    """Attempt 2 brought nothing readable (the relay says why): judged like attempt 1, so attempt 3 goes."""
    data, relay, splice = regenerated(
        [broken(), b"", healthy("third")], settings=RegenerateSettings(2), seed=seed, failures={2: "a 500"}
    )
    view = client_view(data)
    assert view.errors == [] and view.done == 1 and [c["name"] for c in view.calls] == ["read"]
    assert {c["id"] for c in view.chunks} == {"first"}, "attempt 3 carries the client's completion id"
    assert [d.made for d in splice.decisions] == [True, True] and len(relay.bodies) == 2
    assert [c.before for d in splice.decisions for c in d.changes if c.kind == "regenerate"] == ["unrecoverable"] * 2


@settings(deadline=None)  # the whole pipeline per example, on a shared machine
@given(st.integers(0, 10_000))
def test_a_failed_last_attempt_gives_the_client_the_replaced_attempts_error(seed: int) -> None:
    data, relay, splice = regenerated([broken(), b""], seed=seed, failures={2: "a 500"})
    view = client_view(data)
    assert view.calls == [] and len(view.errors) == 1 and view.done == 1
    assert view.errors[0]["tapfix"]["reason"] == "tool_call_unrecoverable"
    assert splice.answered_by is splice.stage_history[0] and splice.answered_by.outcome == "unrecoverable"
    assert [(d.made, d.reason) for d in splice.decisions] == [(True, "fresh_seed"), (False, "attempts_spent")]


@settings(deadline=None)  # the whole pipeline per example, on a shared machine
@given(st.integers(0, 10_000))
def test_a_first_attempt_that_is_not_sse_is_regenerated(seed: int) -> None:
    data, relay, splice = regenerated([GARBAGE, healthy()], seed=seed)
    assert b"<html>" not in data and b"\x00" not in data
    view = client_view(data)
    assert view.errors == [] and len(view.calls) == 1
    assert relay.failures[1].startswith("upstream server error: the upstream's answer is not an event stream")
    assert [c.before for d in splice.decisions for c in d.changes if c.kind == "regenerate"] == ["unreadable"]


@settings(deadline=None)  # the whole pipeline per example, on a shared machine
@given(st.integers(0, 10_000))
def test_a_stream_never_sse_ends_with_the_retryable_error_recorded(seed: int) -> None:
    pipeline, relay, splice = chat_pipeline()
    view = client_view(through_attempts(pipeline, [GARBAGE, GARBAGE], seed))
    assert len(view.errors) == 1 and view.errors[0]["tapfix"]["reason"] == "not_sse" and view.done == 1
    ex = pipeline.exchange
    assert {"not_sse", "upstream_error"} <= ex.flags and "not an event stream" in str(ex.error)
    assert [c.kind for c in ex.changes if c.stage == "stream"] == ["inject"]


@settings(deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0, 1, 2]))
def test_without_a_splice_a_stream_that_stops_being_sse_ends_with_the_retryable_error(seed: int, after: int) -> None:
    """What came before goes through the stages (a held call ends as on a reset); nothing after is sent."""
    events = [ROLE, chat_chunk({"content": "Let me read it."}, id="first"), tool_call_chunk(0, "c", "read", '{"pa')]
    data = sse(events[: after + 1], done=False) + GARBAGE + b"\n\ndata: {}\n\n"
    ex = Exchange(path="/v1/chat/completions", stream=True, tools=TOOLS)
    pipeline = StreamPipeline(ex, [ChatToolCallRepair(TOOLS, capture_id=ex.id)])
    out = []
    for piece in random_splits(data, random.Random(seed)) + [b""]:
        got = pipeline(piece)
        out += [got] if isinstance(got, bytes) else got
    sent = b"".join(out)
    assert b"<html>" not in sent and sent == b"".join(ex.client_response_chunks or [])
    view = client_view(sent)
    assert len(view.errors) == 1 and view.done == 1 and view.calls == []
    held_call = after == 2
    reason = view.errors[0]["tapfix"]["reason"]
    assert reason == ("tool_call_unrecoverable" if held_call else "not_sse"), view.errors
    assert "not_sse" in ex.flags, "the upstream's bytes aren't SSE, whatever ended the client's stream"


@settings(deadline=None)  # the whole pipeline per example, on a shared machine
@given(st.integers(0, 10_000))
def test_a_text_only_later_attempt_is_the_answer(seed: int) -> None:
    first = sse(
        [
            ROLE,
            chat_chunk({"content": "Let me read it."}, id="first"),
            tool_call_chunk(0, "c1", "read", '{"pa', chunk_id="first"),
            chat_chunk({}, "length", id="first"),
        ]
    )
    second = sse(
        [
            chat_chunk({"role": "assistant", "content": ""}, id="second"),
            chat_chunk({"content": "I can't read files."}, id="second"),
            chat_chunk({}, "stop", id="second"),
        ]
    )
    data, relay, splice = regenerated([first, second], seed=seed)
    view = client_view(data)
    assert view.content == "Let me read it.I can't read files." and view.calls == [] and view.errors == []
    assert view.finish_reasons == ["stop"] and view.done == 1
    assert not [c for d in splice.decisions for c in d.changes if c.kind == "drop"]
