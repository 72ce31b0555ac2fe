"""The SSE splitter, `is_sse` and `event_data` were rewritten for speed (issue 34: `find` instead of `in`, one
memchr per line instead of a two-byte search); they must hand out exactly what the previous ones did, for any
bytes cut anywhere. The previous code is kept here, verbatim, as the oracle."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.sse import SSESplitter, event_data, is_sse, last_event_end

from tests.support.builders import split_at
from tests.support.depth import examples

# --- the code before issue 34's rewrite (proxy/sse.py at b3b89c3) ------------------------------------
_LINE_END = re.compile(rb"\r\n|\r|\n")
_SSE_LINE = re.compile(rb"(?::|[A-Za-z][A-Za-z0-9_.-]*:|(?:data|event|id|retry)[ \t]*$)")


class OldSplitter:
    def __init__(self) -> None:
        self._buffer = b""
        self._cr_seen = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if not chunk:
            return []
        buffer = self._buffer + chunk if self._buffer else chunk
        if not self._cr_seen and b"\r" in chunk:
            self._cr_seen = True
        if not self._cr_seen:
            end = buffer.rfind(b"\n\n")
            if end < 0:
                self._buffer = buffer
                return []
            self._buffer = buffer[end + 2 :]
            whole = buffer[: end + 2]
            if whole.count(b"\n\n") == 1:
                return [whole]
            return _old_split_lf(whole)
        events, self._buffer = _old_split_general(buffer)
        return events

    def flush(self) -> list[bytes]:
        rest, self._buffer = self._buffer, b""
        return [rest] if rest else []


def _old_split_lf(whole: bytes) -> list[bytes]:
    events: list[bytes] = []
    start = 0
    while True:
        end = whole.find(b"\n\n", start)
        if end < 0:
            return events
        stop = end + 2
        while stop < len(whole) and whole[stop] == 0x0A:
            stop += 1
        events.append(whole[start:stop])
        start = stop


def _old_split_general(buffer: bytes) -> tuple[list[bytes], bytes]:
    events: list[bytes] = []
    start = 0
    line_start = 0
    pos = 0
    n = len(buffer)
    while pos < n:
        m = _LINE_END.search(buffer, pos)
        if m is None:
            break
        if m.group() == b"\r" and m.end() == n:
            break
        if m.start() == line_start and line_start > start:
            events.append(buffer[start : m.end()])
            start = m.end()
        elif m.start() == line_start and line_start == start:
            if events:
                events[-1] += buffer[start : m.end()]
            else:
                events.append(buffer[start : m.end()])
            start = m.end()
        line_start = m.end()
        pos = m.end()
    return events, buffer[start:]


def old_event_data(event: bytes) -> bytes | None:
    if event.startswith(b"data: ") and event.count(b"\n") <= 2 and b"\r" not in event:
        return event[6:].rstrip(b"\n")
    parts = []
    for line in _LINE_END.split(event):
        if line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            parts.append(value)
    if not parts:
        return None
    return b"\n".join(parts)


def old_is_sse(event: bytes) -> bool:
    if event.startswith(b"data:") and b"\n" not in event[:-2] and b"\r" not in event:
        return True
    return all(_SSE_LINE.match(line) for line in _LINE_END.split(event) if line)


def old_last_event_end(data: bytes) -> int:
    return max(data.rfind(end) + len(end) if end in data else 0 for end in (b"\n\n", b"\r\r", b"\n\r\n"))


# --- the same answers -----------------------------------------------------------------------------
# Streams made of the pieces that matter to a splitter: lines of the common events, newlines of every kind
# and runs of them, a CR late in the stream (the switch to the general path), and arbitrary bytes.
PIECE = st.one_of(
    st.sampled_from(
        [
            b'data: {"choices":[{"delta":{"content":"hi"}}]}',
            b"data: [DONE]",
            b"event: message_start",
            b"data:x",
            b": ping",
            b"id: 7",
            b"retry",
            b"<html>",
            b"\n",
            b"\n\n",
            b"\n\n\n",
            b"\r",
            b"\r\n",
            b"\r\n\r\n",
        ]
    ),
    st.binary(max_size=12),
)
STREAM = st.lists(PIECE, max_size=40).map(b"".join)
CUTS = st.lists(st.integers(min_value=0, max_value=5_000), max_size=30)


def both(data: bytes, cuts: list[int]) -> tuple[list[list[bytes]], list[list[bytes]]]:
    new, old = SSESplitter(), OldSplitter()
    pieces = split_at(data, cuts)
    return [new.feed(p) for p in pieces] + [new.flush()], [old.feed(p) for p in pieces] + [old.flush()]


@settings(max_examples=examples(150))
@given(STREAM, CUTS)
def test_the_splitter_hands_out_the_same_events_read_by_read(data: bytes, cuts: list[int]) -> None:
    new, old = both(data, cuts)
    assert new == old


@settings(max_examples=examples(80))
@given(STREAM)
def test_the_same_events_cut_at_every_point(data: bytes) -> None:
    for cut in range(len(data) + 1):
        new, old = both(data, [cut])
        assert new == old


@settings(max_examples=examples(150))
@given(STREAM)
def test_is_sse_event_data_and_the_last_event_end_read_the_same(data: bytes) -> None:
    for event in [data, *OldSplitter().feed(data)]:
        assert is_sse(event) == old_is_sse(event)
        assert event_data(event) == old_event_data(event)
        assert last_event_end(event) == old_last_event_end(event)


def test_every_short_stream_over_the_bytes_that_matter() -> None:
    """Exhaustive where hypothesis samples: every stream of up to 7 bytes over `a`, LF and CR (and `:` for the
    field check), whole, a byte at a time, and cut at every point when short; after the heads the fast paths
    look for, for `is_sse` and `event_data`."""
    from itertools import product

    for n in range(8):
        for letters in product(b"a\n\r" if n > 5 else b"a\n\r:", repeat=n):
            data = bytes(letters)
            ways = [[], list(range(1, n))] + ([[cut] for cut in range(1, n)] if n <= 5 else [])
            for cuts in ways:
                new, old = both(data, cuts)
                assert new == old, (data, cuts)
            for head in (b"", b"data:", b"data: ", b"data", b"event:", b"a\ndata", b"a\nevent:"):
                event = head + data
                assert is_sse(event) == old_is_sse(event) and event_data(event) == old_event_data(event), event
