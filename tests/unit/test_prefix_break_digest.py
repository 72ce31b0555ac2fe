"""Issue 34: a unit's digest skips the walk to its normal form when the value has nothing it would change; the
digest is the normal form's either way."""

import hashlib

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.request.prefix_break import digest, normal

from tests.support.depth import examples

keys = st.sampled_from(["text", "type", "cache_control", "content", "role", "a"])
texts = st.text(max_size=6) | st.sampled_from(["text", '[{"text":', '"cache_control":', '\\"', "é"])
values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(keys, c, max_size=3)
        | st.builds(lambda t: [{"type": "text", "text": t}], texts)
    ),
    max_leaves=10,
)


def _by_the_normal_form(value):
    try:
        text = orjson.dumps(normal(value), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        text = repr(normal(value)).encode()
    return hashlib.sha256(text).digest()[:16]


@settings(max_examples=examples(500))
@given(values)
def test_the_digest_is_the_normal_forms(value):
    assert digest(value) == _by_the_normal_form(value)


def test_what_the_normal_form_drops_still_compares_equal():
    part = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    assert digest(part) == digest({"role": "user", "content": "hi"})
