"""proxy/regenerate/continuation.py: the next attempt continues what the client has, or starts again."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.regenerate.continuation import (
    SEED_LIMIT,
    NextAttempt,
    Received,
    Skip,
    deterministic,
    next_attempt,
    system_seed,
)

from tests.support.builders import tool

USER = {"role": "user", "content": "Write hello.txt"}
ENGINES = [None, "vllm", "sglang", "llamacpp", "tabbyapi", "ollama", "openai", "anthropic"]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], "stream": True, "tools": [tool("write")], **extra}


def attempt(request: dict[str, Any], engine: str | None, received: Received, surface: Any = "chat") -> Any:
    return next_attempt(request, surface, engine, received, attempt=2, seed=lambda: 1234)


def test_llamacpp_continues_content_with_the_explicit_flags():
    result = attempt(chat(), "llamacpp", Received(content="Sure.\n"))
    assert isinstance(result, NextAttempt) and result.how == "continuation"
    assert result.body["messages"] == [USER, {"role": "assistant", "content": "Sure.\n"}]
    assert result.body["continue_final_message"] is True and result.body["add_generation_prompt"] is False
    assert "seed" not in result.body
    assert result.prefix == {"content": "Sure.\n"}
    assert [(c.kind, c.path, c.after) for c in result.changes] == [
        ("inject", "$.messages[1]", {"role": "assistant", "content": "Sure.\n"}),
        ("inject", "$.continue_final_message", True),
        ("inject", "$.add_generation_prompt", False),
    ]
    assert all("attempt 2" in c.reason and "llamacpp" in c.reason for c in result.changes)


def test_llamacpp_sends_reasoning_as_received_and_both_fields_with_content():
    result = attempt(chat(), "llamacpp", Received(content="\n", reasoning="\nHmm.\n"))
    assert isinstance(result, NextAttempt)
    assert result.body["messages"][-1] == {"role": "assistant", "content": "\n", "reasoning_content": "\nHmm.\n"}
    assert result.prefix == {"content": "\n", "reasoning": "\nHmm.\n"}


def test_llamacpp_continues_reasoning_alone():
    result = attempt(chat(temperature=0), "llamacpp", Received(reasoning="Hmm.\n"))
    assert isinstance(result, NextAttempt) and result.how == "continuation"  # deterministic is fine here
    assert result.body["messages"][-1] == {"role": "assistant", "content": "", "reasoning_content": "Hmm.\n"}


@pytest.mark.parametrize(("engine", "field"), [("vllm", "reasoning"), ("sglang", "reasoning_content")])
def test_vllm_and_sglang_continue_content_but_not_reasoning_alone(engine, field):
    """The reasoning goes in the field the engine's chat template gets: vLLM reads `reasoning` from an
    assistant message and drops `reasoning_content` (tests/process/vllm/test_facts.py, against vLLM 0.32.0)."""
    result = attempt(chat(), engine, Received(content="Sure.", reasoning="Hmm."))
    assert isinstance(result, NextAttempt) and result.how == "continuation"
    assert result.body["messages"][-1] == {"role": "assistant", "content": "Sure.", field: "Hmm."}
    alone = attempt(chat(), engine, Received(reasoning="Hmm."))
    assert isinstance(alone, NextAttempt) and alone.how == "fresh_seed"
    assert "reasoning alone" in alone.reason
    greedy = attempt(chat(temperature=0), engine, Received(reasoning="Hmm."))
    assert isinstance(greedy, Skip) and greedy.reason == "deterministic"


def test_client_add_generation_prompt_is_overridden_and_recorded():
    result = attempt(chat(add_generation_prompt=True), "vllm", Received(content="Sure."))
    assert isinstance(result, NextAttempt)
    flags = [(c.kind, c.before, c.after) for c in result.changes if c.path == "$.add_generation_prompt"]
    assert flags == [("override", True, False)]


def test_nothing_received_starts_from_scratch_with_a_fresh_seed():
    request = chat(temperature=0.7)
    result = attempt(request, "llamacpp", Received())
    assert isinstance(result, NextAttempt) and result.how == "fresh_seed"
    assert result.body == {**request, "seed": 1234}
    assert [(c.kind, c.path, c.before, c.after) for c in result.changes] == [("inject", "$.seed", None, 1234)]
    assert "no text to continue" in result.changes[0].reason and result.prefix == {}


@pytest.mark.parametrize(
    ("extra", "why"),
    [({"seed": 7}, "seed 7"), ({"temperature": 0}, "temperature 0"), ({"top_k": 1}, "top_k 1")],
)
def test_a_deterministic_request_without_continuation_is_skipped(extra, why):
    result = attempt(chat(**extra), "tabbyapi", Received(content="Sure."))
    assert isinstance(result, Skip) and result.reason == "deterministic"
    assert why in result.detail and "tabbyapi" in result.detail


def test_a_deterministic_request_is_continued_with_its_own_seed():
    result = attempt(chat(seed=7), "vllm", Received(content="Sure."))
    assert isinstance(result, NextAttempt) and result.how == "continuation" and result.body["seed"] == 7


@pytest.mark.parametrize("engine", ["tabbyapi", "anthropic"])
def test_engines_without_a_seed_field_get_the_request_unchanged(engine):
    request = chat()
    result = attempt(request, engine, Received(content="Sure."))
    assert isinstance(result, NextAttempt) and result.how == "fresh"
    assert result.body == request and result.changes == []


@pytest.mark.parametrize("engine", [None, "ollama", "openai"])
def test_engines_that_take_a_seed_but_cant_continue(engine):
    result = attempt(chat(), engine, Received(content="Sure."))
    assert isinstance(result, NextAttempt) and result.how == "fresh_seed" and result.body["seed"] == 1234


@pytest.mark.parametrize(("surface", "turns"), [("responses", "input"), ("messages", "messages")])
def test_responses_and_messages_regenerate_from_scratch_without_a_seed(surface, turns):
    request = {"model": "m", turns: [USER], "stream": True}
    result = attempt(request, "llamacpp", Received(content="Sure."), surface)
    assert isinstance(result, NextAttempt) and result.how == "fresh" and result.body == request
    greedy = attempt({**request, "temperature": 0}, "vllm", Received(), surface)
    assert isinstance(greedy, Skip) and greedy.reason == "deterministic"


def test_skips_before_anything_else():
    sent = attempt(chat(), "llamacpp", Received(content="Sure.", tool_call_sent=True))
    assert isinstance(sent, Skip) and sent.reason == "tool_call_sent"
    many = attempt(chat(n=2), "llamacpp", Received(content="Sure."))
    assert isinstance(many, Skip) and many.reason == "n_gt_1"
    assert isinstance(attempt(chat(n=1), "llamacpp", Received()), NextAttempt)
    other = attempt({"prompt": "x"}, "vllm", Received(), "completions")
    assert isinstance(other, Skip) and other.reason == "unsupported_surface"
    empty = attempt({"model": "m", "messages": []}, "vllm", Received())
    assert isinstance(empty, Skip) and empty.reason == "malformed_request"


def test_a_request_ending_with_the_clients_own_prefill_is_not_continued():
    request = chat(messages=[USER, {"role": "assistant", "content": "I"}])
    result = attempt(request, "llamacpp", Received(content=" will"))
    assert isinstance(result, NextAttempt) and result.how == "fresh_seed"
    assert result.body["messages"] == request["messages"] and "own prefill" in result.reason


def test_the_seed_source_is_checked():
    with pytest.raises(ValueError, match="seed source gave -1"):
        next_attempt(chat(), "chat", "vllm", Received(), seed=lambda: -1)
    assert all(0 <= system_seed() < SEED_LIMIT for _ in range(50))


def test_deterministic_reads_numbers_only():
    assert deterministic({"temperature": False}) is None  # a bool is not a temperature
    assert deterministic({"seed": None, "temperature": 0.0}) is not None
    assert deterministic({"temperature": 0.2, "top_k": 40}) is None


REQUESTS = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": st.just([USER])},
    optional={
        "temperature": st.sampled_from([0, 0.0, 0.7, 1]),
        "seed": st.integers(0, 10),
        "top_k": st.sampled_from([1, 40]),
        "n": st.sampled_from([1, 2]),
        "add_generation_prompt": st.booleans(),
    },
)
RECEIVED = st.builds(Received, st.sampled_from(["", "\n", "Sure.\n"]), st.sampled_from(["", "\nHmm."]), st.booleans())


@given(REQUESTS, st.sampled_from(ENGINES), RECEIVED)
def test_every_attempt_keeps_the_rules(request, engine, received):
    before = copy.deepcopy(request)
    result = attempt(request, engine, received)
    assert request == before  # never mutated
    if isinstance(result, Skip):
        if received.tool_call_sent:
            assert result.reason in ("tool_call_sent", "n_gt_1")
        if result.reason == "deterministic":
            assert deterministic(request) is not None
        return
    assert not received.tool_call_sent and request.get("n", 1) == 1
    body = result.body
    assert not (body.get("continue_final_message") and body.get("add_generation_prompt", True))
    if result.how == "continuation":
        last = body["messages"][-1]
        assert engine in ("llamacpp", "vllm", "sglang") and len(body["messages"]) == 2
        assert last["role"] == "assistant" and "tool_calls" not in last
        reasoning = last.get("reasoning" if engine == "vllm" else "reasoning_content", "")
        assert last["content"] == received.content and reasoning == received.reasoning
        assert set(last) <= {"role", "content", "reasoning", "reasoning_content"} and len(last) <= 3
        assert last["content"] or reasoning  # never an empty prefix
    else:
        assert deterministic(request) is None and body["messages"] == [USER]
        assert {k: v for k, v in body.items() if k != "seed"} == request
        assert ("seed" in body) == (result.how == "fresh_seed")
