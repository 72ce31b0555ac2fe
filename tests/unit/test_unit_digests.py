"""Issue 34: the capture writer remembers prompt units' digests by their serialization (store/unit_digests.py)
instead of digesting every unit of every turn again, and compares prompts by their units' signature instead of
unit by unit. The prompts it builds and the requests it finds, and so the stored prefix breaks, are those of the
computation without either (kept here as the oracles: the normal form's digest, the loops over units)."""

import dataclasses
import hashlib
import math

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from tapfix.proxy.request.prefix_break import (
    Unit,
    _extends_conversation,
    extends,
    normal,
    previous_in_thread,
    prompt_of,
    shared,
)
from tapfix.proxy.store.unit_digests import UnitDigests
from tapfix.proxy.surfaces import surface_for

from tests.support.depth import examples

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


def _fields(prompt):
    units = [(u.kind, u.path, id(u.value), u.digest, u.volatile) for u in prompt.units]
    return units, prompt.conversation, prompt.settings, prompt.cache_key, prompt.signature, prompt.volatile


def _by_oracle(units: tuple[Unit, ...]) -> list[tuple[str, object, bytes, bool]]:
    return [(u.kind, u.path, _oracle(u.value), u.volatile) for u in units]


@settings(max_examples=examples(200))
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
            assert (cached is None) == (fresh is None)
            if cached is not None and fresh is not None:  # field by field: a NaN value is not equal to itself
                assert _fields(cached) == _fields(fresh)
            if cached is not None:
                assert [(u.kind, u.path, u.digest, u.volatile) for u in cached.units] == _by_oracle(cached.units)


@settings(max_examples=examples(200))
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


def _unit_by_unit(prompt):
    """The prompt without its signature: compared unit by unit, as before signatures (the oracle)."""
    return dataclasses.replace(prompt, signature=None)


billing = st.sampled_from([f"x-anthropic-billing-header: cc_version=2.1.{v}; cc_entrypoint=cli;" for v in "ab"])
system = st.lists(st.builds(lambda t: {"type": "text", "text": t}, billing | texts), max_size=3)


@settings(max_examples=examples(150))
@given(st.lists(bodies, min_size=2, max_size=4), st.lists(system, min_size=2, max_size=4), st.sampled_from(PATHS))
def test_prompts_compare_by_signature_as_unit_by_unit(turns, systems, path):
    """`shared`, `extends` and the thread lookup read the units' signature: the same answers as the loops over
    units, billing lines (passed over by `shared`) and grown conversations included."""
    surface = surface_for(path)
    prompts, grown = [], []
    for body, lead in zip(turns, systems, strict=False):
        grown = [*grown, *body["messages"]]
        for request in ({**body, "system": lead}, {**body, "messages": grown, "system": lead}):
            prompt = prompt_of(request, surface)
            if prompt is not None:
                prompts.append(prompt)
    for new in prompts:
        plain_new = _unit_by_unit(new)
        for old in prompts:
            plain_old = _unit_by_unit(old)
            assert shared(old, new) == shared(plain_old, plain_new)
            assert shared(old.light(), new) == shared(plain_old, plain_new)
            assert extends(old, new) == extends(plain_old, plain_new)
            assert _extends_conversation(old, new) == _extends_conversation(plain_old, plain_new)
        candidates = [(str(i), p.light()) for i, p in enumerate(prompts)]
        found = previous_in_thread(new, candidates)
        oracle = previous_in_thread(plain_new, [(i, _unit_by_unit(p)) for i, p in candidates])
        assert (found and found[0]) == (oracle and oracle[0])
