"""Issue 34: the capture writer remembers prompt units' digests by their serialization (store/unit_digests.py)
instead of digesting every unit of every turn again. The prompts it builds, and so the stored prefix breaks, are
byte for byte those of the computation without it (kept here as the oracle: the normal form's digest)."""

import hashlib
import math

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.request.prefix_break import Unit, normal, prompt_of
from tapfix.proxy.store.unit_digests import UnitDigests
from tapfix.proxy.surfaces import surface_for

keys = st.sampled_from(["text", "type", "cache_control", "content", "role", "tool_calls", "name", "a"])
texts = st.text(max_size=6) | st.sampled_from(["text", "system", '[{"text":', '"cache_control":', "é", "\ud800"])
numbers = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([0.0, -0.0, 1.0, 1, 2**64, math.nan, math.inf])
    | st.floats(allow_nan=False, allow_infinity=False)
)
values = st.recursive(
    st.none() | st.booleans() | numbers | texts,
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(keys, c, max_size=3)
        | st.builds(lambda t: [{"type": "text", "text": t}], texts)
    ),
    max_leaves=10,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"])},
        optional={"content": values, "cache_control": values, "a": values},
    )
    | values,
    max_size=5,
)
bodies = st.fixed_dictionaries(
    {"messages": messages},
    optional={
        "tools": st.lists(values, max_size=3),
        "system": values,
        "instructions": values,
        "input": values | messages,
    },
)
PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses"]


def _oracle(value):
    """The digest as it was computed for every unit of every turn: its normal form's, keys sorted."""
    try:
        text = orjson.dumps(normal(value), option=orjson.OPT_SORT_KEYS)
    except TypeError:
        text = repr(normal(value)).encode()
    return hashlib.sha256(text).digest()[:16]


def _by_oracle(units: tuple[Unit, ...]) -> list[tuple[str, object, bytes, bool]]:
    return [(u.kind, u.path, _oracle(u.value), u.volatile) for u in units]


@settings(max_examples=400)
@given(st.lists(bodies, min_size=1, max_size=4), st.sampled_from(PATHS))
def test_remembered_digests_are_the_computed_ones(turns, path):
    """Turns through one cache (the writer's: what one turn put in, the next finds), each the turn grown or
    changed: every unit's digest is the oracle's, and the prompt the one built without the cache."""
    surface = surface_for(path)
    remembered = UnitDigests()
    grown = []
    for body in turns:
        grown = [*grown, *body["messages"]]
        for request in (body, {**body, "messages": grown}):
            fresh = prompt_of(request, surface)
            cached = prompt_of(request, surface, remembered)
            assert cached == fresh
            if cached is not None:
                assert [(u.kind, u.path, u.digest, u.volatile) for u in cached.units] == _by_oracle(cached.units)


@settings(max_examples=300)
@given(values, values)
def test_a_value_is_never_given_anothers_digest(first, second):
    remembered = UnitDigests()
    assert remembered(first) == _oracle(first)
    assert remembered(second) == _oracle(second)
    assert remembered(first) == _oracle(first)


def test_what_is_kept_is_bounded_by_bytes():
    remembered = UnitDigests(max_bytes=1000)
    for i in range(100):
        assert remembered({"role": "user", "content": f"turn {i} " * 10}) == _oracle(
            {"role": "user", "content": f"turn {i} " * 10}
        )
    assert remembered._bytes <= 1000
