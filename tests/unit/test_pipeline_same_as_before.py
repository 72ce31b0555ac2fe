"""The stream callable got a fast path (issue 34): a read of plain SSE goes straight to the stages, and a read
of several whole events that no stage changed goes out as the very bytes that came, not a join of them. What
mitmproxy gets back from each call, and everything recorded on the exchange, must be what the previous code
gave: it is kept here, verbatim, as the oracle (its `__call__` and `_through`; the rest is shared)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.regenerate.eligibility import RegenerateSettings
from tapfix.proxy.regenerate.splice import AttemptSplice
from tapfix.proxy.response.pipeline import Stage, StreamPipeline
from tapfix.proxy.response.reasoning_fields import ReasoningFieldRename
from tapfix.proxy.toolcalls import ChatToolCallRepair

from tests.support.builders import rechunk
from tests.unit.test_fuzz_response_path import FUZZ, SEED_STREAM, TOOLS, mutate
from tests.unit.test_regenerate_splice import FakeSession


class PreviousPipeline(StreamPipeline):
    """`__call__` and `_through` as they were at b3b89c3."""

    __slots__ = ()

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        if not chunk:
            return self.end_of_attempt()
        ex = self.exchange
        ex.response_chunks.append(chunk)
        ex.chunk_times.append(self._clock() - ex.mark)
        if self.broken:
            return []
        text = chunk if self.decoder is None else self._decode(chunk)
        if self.splitter is None:
            return chunk
        if text is None:
            return self._undecodable()
        return self._run(self.splitter.feed(text), False)

    def _through(self, events: list[bytes], final: bool, whole: bytes | None = None) -> bytes | list[bytes]:
        ex = self.exchange
        for stage in self.stages:
            if len(events) == 1:
                events = stage.feed(events[0])
            elif events:
                out: list[bytes] = []
                for event in events:
                    out += stage.feed(event)
                events = out
            if final:
                events = events + stage.flush()
        if not events:
            return []
        data = events[0] if len(events) == 1 else b"".join(events)
        assert ex.client_response_chunks is not None
        ex.client_response_chunks.append(data)
        return data


class Untouched:
    """A stage that hands every event back as it got it (the object itself)."""

    def feed(self, event: bytes) -> list[bytes]:
        return [event]

    def flush(self) -> list[bytes]:
        return []


def stages_for(kind: int, ex: Exchange, policy: str) -> list[Stage]:
    if kind == 0:
        return []
    if kind == 1:
        return [Untouched()]
    if kind == 3:  # a stream that may be regenerated: its tool-call stage defers its verdict to the splice
        stage = ChatToolCallRepair(TOOLS, policy="error", capture_id=ex.id)
        stage.defer_fatal = True
        return [stage]
    return [
        ChatToolCallRepair(TOOLS, policy=policy, capture_id=ex.id),
        ReasoningFieldRename("reasoning", "reasoning_content"),
    ]


NOT_SSE = [b"<html><body>502 Bad Gateway</body></html>\n\n", b'{"error": "busy"}\n\n', b"\x00\x01\n\n", b"Bad Gateway"]


def stream_of(rng: random.Random, rounds: int) -> bytes:
    """The seed stream once or more, now and then something that isn't SSE between its events, then mutated."""
    events = [e + b"\n\n" for e in SEED_STREAM.split(b"\n\n") if e] * rng.randrange(1, 4)
    for _ in range(rng.randrange(3)):
        events.insert(rng.randrange(len(events) + 1), rng.choice(NOT_SSE))
    return mutate(b"".join(events), rng, rounds)


def run(cls: type[StreamPipeline], data: bytes, salt: int, kind: int, policy: str) -> tuple[list[object], Exchange]:
    rng = random.Random(salt)
    ex = Exchange(id="c", tools=TOOLS, stream=True, content_type="text/event-stream", mark=0.0)
    pipeline = cls(ex, stages_for(kind, ex, policy))
    pipeline._clock = lambda: 1.0  # the same arrival times on both sides
    if kind == 3:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": True}
        pipeline.splice = AttemptSplice(
            FakeSession(), body, lambda: stages_for(3, ex, policy), RegenerateSettings(1), "error"
        )
    returned: list[object] = []
    for piece in rechunk(data, rng, [1, 2, 3, 7, 64, 280, 500, 4096]):
        returned.append(pipeline(piece))
    returned.append(pipeline(b""))
    returned.append((pipeline.pending, pipeline.finished, pipeline.foreign))
    return returned, ex


@FUZZ
@given(st.integers(0, 2**32), st.integers(0, 6))
def test_each_call_returns_and_records_what_it_did_before(salt: int, rounds: int) -> None:
    rng = random.Random(salt)
    data = stream_of(rng, rounds)
    for kind in (0, 1, 2, 3):
        policy = rng.choice(["error", "fail_fast", "passthrough"])
        new, ex_new = run(StreamPipeline, data, salt, kind, policy)
        old, ex_old = run(PreviousPipeline, data, salt, kind, policy)
        assert new == old
        assert ex_new.response_chunks == ex_old.response_chunks and ex_new.chunk_times == ex_old.chunk_times
        assert ex_new.client_response_chunks == ex_old.client_response_chunks
        assert ex_new.changes == ex_old.changes and ex_new.flags == ex_old.flags and ex_new.error == ex_old.error


def test_a_read_of_whole_untouched_events_goes_out_as_it_came() -> None:
    """No join: the bytes object mitmproxy handed in is the one it gets back, and the one recorded."""
    ex = Exchange(tools=TOOLS, stream=True)
    pipeline = StreamPipeline(ex, [Untouched()])
    read = b'data: {"a":1}\n\ndata: {"b":2}\n\n'
    assert pipeline(read) is read
    assert ex.client_response_chunks is not None and ex.client_response_chunks[-1] is read
    split = [b'data: {"a":1}\n\ndata: {"b"', b':2}\n\ndata: {"c":3}\n\n']  # an event held across reads: joined
    assert [pipeline(split[0]), pipeline(split[1])] == [b'data: {"a":1}\n\n', b'data: {"b":2}\n\ndata: {"c":3}\n\n']
