"""Issue 37: the budget read from its own bytes is the one a full parse gives (the messages skipped)."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.window.clamp import budget_in, budget_of

VALUES = st.one_of(st.integers(-5, 10**6), st.booleans(), st.none(), st.text(max_size=3), st.floats(0, 10))
BODIES = st.fixed_dictionaries(
    {
        "model": st.just("m"),
        "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.text()})),
    },
    optional={
        "max_tokens": VALUES,
        "max_completion_tokens": VALUES,
        "max_output_tokens": VALUES,
        "stream": st.booleans(),
    },
)


@given(BODIES, st.sampled_from(["chat", "completions", "responses", "messages", None]))
def test_the_budget_from_its_bytes_is_the_parsed_one(body, surface):
    raw = orjson.dumps(body, option=orjson.OPT_INDENT_2) if body.get("stream") else orjson.dumps(body)
    assert budget_in(surface, raw) == budget_of(surface, body)


def test_a_body_that_is_no_object_has_no_budget():
    assert budget_in("chat", b"[1]") is None and budget_in("chat", b"not json") is None
