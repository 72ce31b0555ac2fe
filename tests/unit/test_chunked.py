"""The body relay's chunked reader (proxy/chunked.py): whatever the reads' boundaries, it gives the chunks'
data in order, stops exactly at the last chunk or a bad frame, and hands back the bytes from there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.chunked import MAX_SIZE_LINE, ChunkedReader


def _frame(data: bytes, extension: bytes, upper: bool) -> bytes:
    size = b"%X" % len(data) if upper else b"%x" % len(data)
    return size + extension + b"\r\n" + data + b"\r\n"


def _read(body: bytes, cuts: list[int]) -> tuple[bytes, bytes | None, ChunkedReader]:
    reader = ChunkedReader()
    got, rest, start = [], None, 0
    for end in [*sorted(set(c % (len(body) + 1) for c in cuts)), len(body)]:
        pieces, back = reader.feed(body[start:end])
        got.extend(pieces)
        if back is not None and rest is None:
            rest = back
        elif back is not None:
            rest += back
        start = end
    return b"".join(got), rest, reader


chunks = st.lists(st.binary(min_size=1, max_size=300), min_size=0, max_size=12)
extensions = st.sampled_from([b"", b";name=value", b" ;x", b';a="b c"'])
tails = st.sampled_from([b"0\r\n\r\n", b"0\r\nx-trailer: 1\r\n\r\n", b"000\r\n\r\nHTTP/1.1 200 OK\r\n"])


@given(chunks, extensions, st.booleans(), tails, st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_any_reads_give_the_data_and_hand_back_from_the_last_chunk(parts, extension, upper, tail, cuts):
    body = b"".join(_frame(p, extension, upper) for p in parts) + tail
    data, rest, reader = _read(body, cuts)
    assert data == b"".join(parts)
    assert rest == tail
    assert reader.stopped


@given(chunks, st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_a_body_cut_short_gives_what_came_and_holds_an_unfinished_size_line(parts, cuts):
    frames = [_frame(p, b"", False) for p in parts]
    body = b"".join(frames)
    boundaries = {sum(len(f) for f in frames[:k]) for k in range(len(frames) + 1)}
    for end in range(0, len(body) + 1, max(1, len(body) // 17)):
        data, rest, reader = _read(body[:end], cuts)
        assert rest is None and not reader.stopped
        assert b"".join(parts).startswith(data)
        assert body[:end].endswith(reader.held())
        at_boundary = reader.inside() == (0, b"") and not reader.held()
        assert at_boundary == (end in boundaries)


@given(chunks, st.sampled_from([b"zz\r\n", b"\r\n", b"1 2\r\n", b"-1\r\n", b"12\n", b"1" * 17 + b"\r\n"]))
def test_a_bad_size_line_hands_back_from_its_first_byte(parts, bad):
    good = b"".join(_frame(p, b"", False) for p in parts)
    data, rest, _ = _read(good + bad + b"more", [])
    assert data == b"".join(parts)
    assert rest == bad + b"more"


def test_a_bad_chunk_footer_hands_back_from_it():
    data, rest, _ = _read(b"3\r\nabcXY5\r\n", [])
    assert (data, rest) == (b"abc", b"XY5\r\n")
    data, rest, _ = _read(b"3\r\nabc\rX", [7])
    assert (data, rest) == (b"abc", b"X")


def test_a_size_line_longer_than_any_is_handed_back_whole():
    reader = ChunkedReader()
    line = b"1" + b";" + b"x" * MAX_SIZE_LINE
    pieces, rest = reader.feed(line[:100])
    assert (pieces, rest) == ([], None)
    pieces, rest = reader.feed(line[100:])
    assert pieces == [] and rest == line


def test_after_it_stopped_every_byte_is_handed_back():
    reader = ChunkedReader()
    assert reader.feed(b"1\r\na\r\n0\r\n") == ([b"a"], b"0\r\n")
    assert reader.feed(b"\r\n") == ([], b"\r\n")
