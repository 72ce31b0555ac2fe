from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.sse import SSESplitter, event_data, is_sse

from tests.support.builders import split_at


def split_all(data: bytes, cuts: list[int]) -> list[bytes]:
    """The events the splitter yields when `data` arrives cut at `cuts`."""
    splitter = SSESplitter()
    out: list[bytes] = []
    for piece in split_at(data, cuts):
        out += splitter.feed(piece)
    return out + splitter.flush()


def test_hostile_splits_keep_bytes_and_events():
    stream = b'data: {"a":1}\r\n\r\n: ping\r\n\r\ndata: x\n\ndata: y\r\rdata: [DONE]\n\n'
    for cuts in ([1], [15, 16, 17], list(range(len(stream)))):
        events = split_all(stream, cuts)
        assert b"".join(events) == stream
        assert [event_data(e) for e in events] == [b'{"a":1}', None, b"x", b"y", b"[DONE]"]


def test_event_data_joins_lines_and_strips_one_space():
    assert event_data(b"event: x\ndata:  two\ndata:3\n\n") == b" two\n3"
    assert event_data(b": comment only\n\n") is None


SSE_LINE = st.sampled_from([b"data: {}", b"data:x", b": ping", b"event: e", b"id: 1", b"data: \xc3\xa9"])
NEWLINE = st.sampled_from([b"\n", b"\r\n", b"\r"])


@given(
    st.lists(st.tuples(st.lists(SSE_LINE, min_size=1, max_size=3), NEWLINE), max_size=12),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_any_stream_any_split_reconstructs(events, cuts):
    stream = b"".join(nl.join(lines) + nl + nl for lines, nl in events)
    out = split_all(stream, cuts)
    assert b"".join(out) == stream


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=0, max_value=2000), max_size=10))
def test_random_bytes_never_raise(data, cuts):
    out = split_all(data, cuts)
    assert b"".join(out) == data
    for event in out:
        event_data(event)


# -- is_sse: does an event read as server-sent events at all (issue 31, item 16) ----------------------
_FIELD = st.sampled_from(["data", "event", "id", "retry", "x-custom"])
_VALUE = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20)
_LINE = st.one_of(
    st.builds(lambda f, v: f"{f}: {v}", _FIELD, _VALUE),
    st.builds(lambda v: f":{v}", _VALUE),
    st.sampled_from(["data", "event", "id", "retry"]),
)


@given(st.lists(_LINE, min_size=1, max_size=5), st.sampled_from(["\n", "\r\n", "\r"]))
def test_an_event_of_fields_and_comments_is_sse(lines: list[str], newline: str) -> None:
    event = (newline.join(lines) + newline + newline).encode()
    assert is_sse(event)
    assert is_sse(event[: -len(newline)])  # a stream's unterminated tail too


@given(st.binary(max_size=40))
def test_a_page_or_junk_sent_as_an_event_stream_is_not_sse(tail: bytes) -> None:
    for head in (b"<html><body><h1>502 Bad Gateway</h1>", b"\x00\x01", b'{"error": "busy"}', b"Bad Gateway"):
        assert not is_sse(head + b"\n" + tail.replace(b"\n", b" ").replace(b"\r", b" "))


def test_blank_lines_and_the_common_events_are_sse() -> None:
    for event in (b"", b"\n\n", b"data: [DONE]\n\n", b": keep-alive\n\n", b"event: ping\ndata: {}\r\n\r\n"):
        assert is_sse(event)
