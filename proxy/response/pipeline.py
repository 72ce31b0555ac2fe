"""The stream pipeline: the one `flow.response.stream` callable of a flow (design: only one owner).

upstream bytes → tap (bytes + arrival time) → SSE split → stages (tool-call repair, reasoning-field
rename, ...) → tap of client-bound bytes. With no stage armed, chunks pass untouched and unsplit.
Stages follow httpx's decoder style: `feed(event) -> [events]`, `flush() -> [events]`.

A compressed stream (an upstream that ignores the stripped Accept-Encoding) is decoded chunk by
chunk here, never as a whole body. With no stage armed the client gets the upstream's compressed
bytes and the decoded pieces are only kept for the record (`Exchange.decoded_chunks`). With stages
armed they read, and the client gets, the decoded text (the owner drops Content-Encoding). Bytes
that don't decode are flagged `undecodable_body`: before any text came out they pass as they came,
stages off; after, the stream ends with a retryable error event (what follows can't be read).

With stages armed the pipeline reads the stream, so it must be SSE: from the first event that isn't (an
HTML page or binary junk sent as `text/event-stream`), nothing more of it is sent and the stream ends
with the retryable error a reset gets, flagged `not_sse` (a stream that may be regenerated: the splice
judges the attempt failed, and another attempt may follow).

A stream that may be regenerated (issue 19) has a splice: at the end of each attempt (attempt 1's is
mitmproxy's end of its upstream body) the stages are flushed and the splice decides. When it asks for
another attempt (`pending`), the stream owner sends it from its hook and feeds its bytes here
(`feed_attempt`, never recorded as attempt 1's), then ends it (`end_of_attempt`). Attempt 1's bytes are
read once, from mitmproxy, like any stream's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tapfix.proxy.changes import Change
from tapfix.proxy.content_encoding import DecodeError, Decoder
from tapfix.proxy.errors import reset_event
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.regenerate.unreadable import Unreadable
from tapfix.proxy.sse import EVENT_END, SSESplitter, ends_stream, is_sse
from tapfix.proxy.surfaces import surface_for

if TYPE_CHECKING:
    from tapfix.proxy.regenerate.splice import AttemptSplice

NOT_SSE = "not_sse"
NOT_SSE_MESSAGE = "upstream server error: the upstream's answer is not an event stream"


class Stage(Protocol):
    def feed(self, event: bytes) -> list[bytes]: ...

    def flush(self) -> list[bytes]: ...


CUT_REASON = (
    "an event the upstream's reset cut short is not sent: the client reads the retryable error after the last whole one"
)


class StreamPipeline:
    __slots__ = (
        "exchange",
        "stages",
        "splitter",
        "finished",
        "decoder",
        "broken",
        "passes_encoded",
        "_clock",
        "splice",
        "cut",
        "foreign",
        "splicing",
        "pending",
        "attempt_events",
        "after_chunk",
    )

    def __init__(self, exchange: Exchange, stages: list[Stage], decoder: Decoder | None = None) -> None:
        self.exchange = exchange
        self.stages = stages
        self.splitter = SSESplitter() if stages else None
        self.finished = False
        self.decoder = decoder
        self.broken = False  # undecodable after text went out: the rest of the upstream's bytes are dropped
        # The client reads the upstream's compressed bytes: nothing tapfix writes may join them.
        self.passes_encoded = decoder is not None and not stages
        self._clock = time.perf_counter
        self.splice: AttemptSplice | None = None  # a stream's that may be regenerated (proxy/regenerate/splice.py)
        self.cut = False  # set by the error hook: the upstream broke off, an unfinished event is no event
        self.foreign: bytes | None = None  # the current attempt's first event that isn't SSE: nothing after is read
        self.splicing = True  # with a splice: each attempt's end is a decision (False: the next end is the last)
        self.pending = False  # the splice asked for another attempt: the owner feeds its bytes (`feed_attempt`)
        self.attempt_events = 0  # whole events of the current later attempt that reached the stages
        # Run after each chunk mitmproxy hands in: the body relay's cue to take over (addons/runner/body_relay.py)
        self.after_chunk: Callable[[], None] | None = None
        if stages:
            exchange.client_response_chunks = []
        if decoder is not None:
            exchange.decoded_chunks = []

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        """mitmproxy's: attempt 1's upstream bytes, then b"" at their end. Never returns b"" before the end:
        mitmproxy would read it as the end of the body."""
        if not chunk:
            return self.end_of_attempt()
        ex = self.exchange
        ex.response_chunks.append(chunk)
        ex.chunk_times.append(self._clock() - ex.mark)
        if self.after_chunk is not None:
            self.after_chunk()
        splitter = self.splitter
        if splitter is None or self.decoder is not None or self.broken:
            if splitter is None and self.decoder is None:  # no stage, plain: as it came (never broken then)
                return chunk
            return self._other(chunk)
        # The usual read: plain SSE through the stages (what `_run` does when every event is SSE).
        carried = splitter.held
        events = splitter.feed(chunk)
        if not events:
            return []
        if self.foreign is not None:
            return self._run(events, False)
        for event in events:
            if not is_sse(event):
                return self._run(events, False)
        # The chunk is exactly these events: when the stages hand them all back untouched, it goes out as it came.
        return self._through(events, False, chunk if not (carried or splitter.held) else None)

    def _other(self, chunk: bytes) -> bytes | list[bytes]:
        """A chunk no stage reads (passed as it came), of a compressed stream, or after the stream broke."""
        if self.broken:
            return []
        text = chunk if self.decoder is None else self._decode(chunk)
        if self.splitter is None:
            return chunk
        if text is None:  # undecodable: the stream as it came, or its end
            return self._undecodable()
        return self._run(self.splitter.feed(text), False)

    def feed_attempt(self, data: bytes) -> list[bytes]:
        """A later attempt's bytes (decoded; its own record keeps them as they came): what the client gets."""
        if self.finished or self.splitter is None:
            return []
        events = self.splitter.feed(data)
        self.attempt_events += len(events)
        return _as_list(self._run(events, False))

    def drop_partial(self) -> None:
        """The current attempt failed: an unfinished event of it is no event (its record keeps the bytes)."""
        if self.splitter is not None:
            self.splitter.flush()

    def end_of_attempt(self) -> list[bytes]:
        """The current attempt's upstream ended: cleanly, or cut off (`cut`, set by the owner's error hook).
        With a splice the stages are flushed here and the splice decides whether another attempt follows
        (`pending`: the owner feeds its bytes, then calls this again); otherwise the stream ends."""
        if self.finished:
            return []
        ex = self.exchange
        tail = self._decode_end() if self.decoder is not None and not self.broken else b""
        if self.splitter is None or self.broken:
            self.finished = True
            return []
        if tail is None:
            self.finished = True
            return _as_list(self._undecodable())
        events = self.splitter.feed(tail) + self.splitter.flush() if tail else self.splitter.flush()
        if self.cut and events and not events[-1].endswith(EVENT_END):
            # The reset landed inside this event: sent, the client would read broken JSON, not the
            # retryable error that follows. The record keeps its bytes (response_chunks).
            events.pop()
            ex.changes.append(Change("stream", "drop", "$.events[-1]", None, None, CUT_REASON))
        splice = self.splice
        if splice is not None and self.splicing:
            return self._attempt_end(splice, events)
        self.finished = True
        if splice is not None:  # the last attempt was cut off: a deferred error goes out
            out = _as_list(self._through(self._sse_only(events), True))
            return out + self._record(splice.at_end(self.stages))
        return _as_list(self._run(events, True))

    def _run(self, events: list[bytes], final: bool) -> bytes | list[bytes]:
        if self.splice is not None:  # a stream that may get another attempt: the splice judges what isn't SSE
            return self._through(self._sse_only(events), final)
        readable = self._sse_only(events)
        if self.foreign is not None:
            return self._not_sse(readable)
        return self._through(events, final)

    def _sse_only(self, events: list[bytes]) -> list[bytes]:
        """The events before the first that isn't SSE (kept in `foreign`; none once one was seen)."""
        if self.foreign is not None:
            return []
        for i, event in enumerate(events):
            if not is_sse(event):
                self.foreign = event
                return events[:i]
        return events

    def _not_sse(self, readable: list[bytes]) -> bytes | list[bytes]:
        """The stream stopped being SSE: what came before goes through the stages, which flush (a held call
        ends as it would on a reset), then the retryable error unless a stage ended the stream; the rest of
        the upstream's bytes are dropped (the record keeps them)."""
        self.finished = self.broken = True
        self.exchange.flags.add(NOT_SSE)  # the upstream's bytes, whatever ends the client's stream
        sent = self._through(readable, True)
        out = [sent] if isinstance(sent, bytes) else sent
        assert self.exchange.client_response_chunks is not None
        if not ends_stream(self.exchange.client_response_chunks):
            event = self.not_sse_error()
            self.exchange.client_response_chunks.append(event)
            out.append(event)
            self.record_not_sse_error()
        return out

    def not_sse_reason(self) -> str:
        """For the record: what the upstream sent instead of an event (its first bytes)."""
        return f"{NOT_SSE_MESSAGE} (it sent {(self.foreign or b'')[:60]!r})"

    def not_sse_error(self) -> bytes:
        """The retryable error event that ends a stream that stopped being SSE (the upstream's bytes are
        not quoted to the client: they are what it couldn't read)."""
        event, _ = reset_event(surface_for(self.exchange.path), NOT_SSE_MESSAGE, self.exchange.id, NOT_SSE)
        return event

    def record_not_sse_error(self) -> None:
        """The client got `not_sse_error()`: recorded on the exchange (flags, error, the change)."""
        ex = self.exchange
        _, error = reset_event(surface_for(ex.path), NOT_SSE_MESSAGE, ex.id, NOT_SSE)
        ex.flags.update((NOT_SSE, "upstream_error"))
        ex.error = ex.error or self.not_sse_reason()
        reason = "the upstream's answer stopped being SSE; what followed is not sent, the client gets a retryable error"
        ex.changes.append(Change("stream", "inject", "$.error", None, error, reason))

    def _attempt_end(self, splice: AttemptSplice, events: list[bytes]) -> list[bytes]:
        """One attempt ended: its stages are flushed and the splice decides what comes next (and may swap in
        the next attempt's stages)."""
        ex = self.exchange
        out = _as_list(self._through(self._sse_only(events), True))
        assert ex.client_response_chunks is not None
        unreadable = None
        if self.foreign is not None:  # the attempt failed: the splice decides what follows
            if splice.attempts_made == 0:
                ex.flags.add(NOT_SSE)  # the record's upstream bytes are attempt 1's
            unreadable = Unreadable(self.not_sse_reason(), [self.not_sse_error()])
        now, stages = splice.attempt_end(self.stages, ex.client_response_chunks, unreadable)
        if unreadable is not None and splice.unreadable_sent:
            self.record_not_sse_error()
        out += self._record(now)
        self.foreign = None
        self.cut = False
        self.attempt_events = 0
        self.pending = stages is not None
        if stages is not None:
            self.stages = stages
        else:
            self.finished = True
        return out

    def close_splice(self) -> None:
        """No attempt follows the current one whatever it brings (it was cut off after its bytes went out):
        its end is the stream's end."""
        self.splicing = False
        self.pending = False

    def _record(self, events: list[bytes]) -> list[bytes]:
        """Events tapfix adds (a deferred error): kept as client-bound bytes, and sent."""
        if not events:
            return []
        data = b"".join(events)
        assert self.exchange.client_response_chunks is not None
        self.exchange.client_response_chunks.append(data)
        return [data]

    def _through(self, events: list[bytes], final: bool, whole: bytes | None = None) -> bytes | list[bytes]:
        """The events through the stages: the client-bound bytes, kept for the record. `whole`: the bytes
        `events` were split from, exactly, sent instead of a join when no stage changed an event."""
        ex = self.exchange
        given = events
        for stage in self.stages:
            if len(events) == 1:  # the usual case: one whole event per read
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
        if len(events) == 1:
            data = events[0]
        elif whole is not None and events == given:  # the same objects: compared by identity, no bytes read
            data = whole
        else:
            data = b"".join(events)
        assert ex.client_response_chunks is not None
        ex.client_response_chunks.append(data)
        return data

    def _decode(self, chunk: bytes) -> bytes | None:
        assert self.decoder is not None and self.exchange.decoded_chunks is not None
        try:
            text = self.decoder.feed(chunk)
        except DecodeError as e:
            self._give_up(e)
            return None
        self.exchange.decoded_chunks.append(text)
        return text

    def _decode_end(self) -> bytes | None:
        assert self.decoder is not None and self.exchange.decoded_chunks is not None
        try:
            tail = self.decoder.finish()  # a stream cut short keeps the text decoded so far
        except DecodeError as e:
            self._give_up(e)
            return None
        if tail and self.exchange.decoded_chunks:
            self.exchange.decoded_chunks[-1] += tail  # one decoded piece per chunk, for the timings
        return tail

    def _give_up(self, e: DecodeError) -> None:
        ex = self.exchange
        ex.mark_undecodable(str(e))
        ex.decoded_chunks = None  # the record assembles the bytes as they came
        self.broken = self.splitter is not None and self.decoder is not None and self.decoder.total > 0
        self.decoder = None

    def _undecodable(self) -> bytes | list[bytes]:
        """With stages armed: no text yet, so everything so far and after passes as it came, stages
        off; text already sent, so the stream ends with a retryable error (the rest can't be read)."""
        ex = self.exchange
        self.finished = True
        if not self.broken:
            self.splitter, self.stages = None, []
            ex.client_response_chunks = None  # the client gets the upstream's bytes
            data = b"".join(ex.response_chunks)
            return data if data else []
        message = f"upstream server error: the upstream's compressed stream broke off ({ex.extra['undecodable']})"
        event, error = reset_event(surface_for(ex.path), message, ex.id, reason="undecodable_body")
        assert ex.client_response_chunks is not None
        ex.client_response_chunks.append(event)
        ex.changes.append(
            Change("stream", "inject", "$.error", None, error, "the upstream's stream stopped decoding mid-way")
        )
        return event


def _as_list(data: bytes | list[bytes]) -> list[bytes]:
    if isinstance(data, bytes):
        return [data] if data else []
    return data
