"""`folded` (proxy/http_headers.py) gives the request side the same plain dict as mitmproxy's `dict(headers.items())`,
whatever the head: repeated names in any case, values that aren't UTF-8."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import http
from tapfix.proxy.http_headers import folded

NAMES = st.sampled_from([b"Host", b"host", b"HOST", b"Content-Type", b"x-a", b"X-A", b"accept", b"\xc3\xa9t\xc3\xa9"])
VALUES = st.binary(max_size=12).filter(lambda v: b"\r" not in v and b"\n" not in v)


@given(st.lists(st.tuples(NAMES | st.binary(min_size=1, max_size=6), VALUES), max_size=12))
def test_folded_is_what_mitmproxys_headers_items_give(fields: list[tuple[bytes, bytes]]) -> None:
    headers = http.Headers(fields)
    assert folded(headers.fields) == dict(headers.items())
    assert list(folded(headers.fields)) == list(dict(headers.items()))  # the same order, the same spelling


def test_repeated_names_fold_into_the_first_spelling() -> None:
    fields = [(b"Accept", b"a"), (b"host", b"h"), (b"ACCEPT", b"b")]
    assert folded(fields) == {"Accept": "a, b", "host": "h"}
