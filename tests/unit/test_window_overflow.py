"""Each engine's overflow text read back into numbers; other errors left alone; the standard texts match the
agents' overflow patterns (tests/support/overflow_patterns.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.errors import overflow_message, prompt_never_fits
from tapfix.proxy.window.overflow import RepeatedOverflows, recognise

from tests.support.overflow_patterns import agents_recognise


@pytest.mark.parametrize(
    ("body", "engine", "prompt", "window"),
    [
        (
            {
                "error": {
                    "message": "This model's maximum context length is 4096 tokens. However, your prompt contains "
                    "at least 4097 input tokens, which exceeds this limit even without any output tokens."
                }
            },
            "vllm",
            4097,
            4096,
        ),
        (
            {
                "object": "error",
                "message": "The input (9 tokens) is longer than the model's context length (8 tokens).",
            },
            "sglang",
            9,
            8,
        ),
        (
            {
                "error": {
                    "message": "request (13392 tokens) exceeds the available context size (8192 tokens), try "
                    "increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 13392,
                    "n_ctx": 8192,
                }
            },
            "llamacpp",
            13392,
            8192,
        ),
        (
            {
                "error": {
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 70,
                    "n_ctx": 64,
                }
            },
            "llamacpp",
            70,
            64,
        ),
        (
            {"error": {"message": "input (70 tokens) is larger than the max context size (64 tokens). skipping"}},
            "llamacpp",
            70,
            64,
        ),
        ({"error": {"message": "Prompt length 9 exceeds the available context size of 8 tokens"}}, "tabbyapi", 9, 8),
        ({"error": {"message": "Prompt length 9 is greater than max_seq_len 8"}}, "tabbyapi", 9, 8),
        ({"error": "the input length exceeds the context length"}, "ollama", None, None),
    ],
)
def test_engine_texts(body, engine, prompt, window):
    found = recognise(body)
    assert found is not None and (found.engine, found.prompt_tokens, found.window) == (engine, prompt, window)


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "max_tokens=5000 cannot be greater than max_model_len=4096."}},
        {
            "error": {
                "message": "Requested token count exceeds the model's maximum context length of 8 tokens. You "
                "requested a total of 12 tokens: 4 tokens from the input messages and 8 tokens for the completion."
            }
        },
        {"error": {"message": "The model `x` does not exist."}},
        {"choices": []},
        "error",
        None,
    ],
)
def test_other_errors_are_not_overflows(body):
    assert recognise(body) is None


@given(
    st.sampled_from(["chat", "responses", "messages"]),
    st.one_of(st.none(), st.integers(1, 10**7)),
    st.one_of(st.none(), st.integers(1, 10**7)),
)
def test_every_standard_text_is_an_overflow_to_opencode_and_pi(surface, prompt, window):
    assert agents_recognise(overflow_message(surface, prompt, window))


@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
def test_the_answer_to_a_repeated_overflow_is_no_overflow_to_the_agents(surface):
    """The same request overflowing again means compacting didn't help: the answer must not read as an overflow
    (the agent would compact again, forever) but as a plain client error, which stops it."""
    answer = prompt_never_fits(surface, 14210, 4096)
    assert answer.status == 400
    assert not agents_recognise(answer.error["message"]) and "14210" in answer.error["message"]
    assert answer.error.get("code") != "context_length_exceeded"


def test_a_repeated_overflow_is_the_same_client_and_the_same_bytes():
    seen = RepeatedOverflows(kept=2)
    assert not seen.again("127.0.0.1 opencode/1", b"{1}")
    assert seen.again("127.0.0.1 opencode/1", b"{1}")
    assert not seen.again("127.0.0.2 opencode/1", b"{1}")  # another client's identical body is its own first
    assert not seen.again("127.0.0.1 opencode/1", b"{2}")
    assert not seen.again("127.0.0.1 opencode/1", b"{3}")
    assert not seen.again("127.0.0.1 opencode/1", b"{1}")  # forgotten: only the last `kept` are held
