"""Hypothesis strategies more than one test module draws from."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_values(text: st.SearchStrategy[str], max_leaves: int) -> st.SearchStrategy[Any]:
    """Any JSON value: null, booleans, integers, finite floats and `text` at the leaves; lists and objects
    (keyed by `text`) of up to three."""
    return st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3),
        max_leaves=max_leaves,
    )


# The request keys through which clients and engines switch reasoning on or off (docs/request-side.md's dialects).
REASONING_KEYS = (
    "reasoning_effort",
    "reasoning",
    "thinking",
    "enable_thinking",
    "think",
    "chat_template_kwargs",
)
