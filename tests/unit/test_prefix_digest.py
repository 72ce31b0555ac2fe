"""A prompt unit's digest is the digest of its normal form, whether or not the normal form had to be built."""

from __future__ import annotations

import hashlib

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.request.prefix_break import digest, normal

keys = st.sampled_from(["type", "text", "cache_control", "content", "role", "name", "x"])
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["text", "ephemeral", '[{"text":', '"cache_control"', ""]),
    st.text(max_size=8),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(keys, inner, max_size=4),
        st.builds(lambda t: [{"type": "text", "text": t}], st.text(max_size=5)),
        st.builds(lambda t, c: {"type": "text", "text": t, "cache_control": c}, st.text(max_size=5), inner),
    ),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(values)
def test_digest_is_that_of_the_normal_form(value: object) -> None:
    try:
        text = orjson.dumps(normal(value), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        text = repr(normal(value)).encode()
    assert digest(value) == hashlib.sha256(text).digest()[:16]
