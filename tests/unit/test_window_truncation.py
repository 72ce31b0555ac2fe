"""Issue 37, silent truncation: an engine that cut the prompt to its window (Ollama, to num_ctx) and reported
the count after the cut is flagged `prompt_truncated`; an answer to a prompt it didn't cut never is."""

from __future__ import annotations

import re

import orjson
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.window.truncation import lower_bound, prompt_truncation, reported_prompt_tokens, truncated, words

# Qwen2/Qwen3's pre-tokenizer (tokenizer.json `pre_tokenizer`, the same split as GPT-4's and Llama 3's but for
# digits), its \p{L} and \p{N} written in Python's classes: BPE encodes each piece apart, so a prompt has at
# least as many tokens as pieces.
_L, _N = r"[^\W\d_]", r"\d"
PRE_TOKENIZER = re.compile(
    rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?{_L}+|{_N}| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def pieces(text: str) -> int:
    return len(PRE_TOKENIZER.findall(text))


@given(st.text())
def test_a_text_has_at_least_as_many_pieces_as_words(text):
    assert "".join(PRE_TOKENIZER.findall(text)) == text  # the split covers the text
    assert words(text) <= pieces(text)


ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool"])
CONTENT = st.one_of(
    st.text(max_size=200),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=80)}), max_size=3),
)
MESSAGES = st.lists(st.fixed_dictionaries({"role": ROLES, "content": CONTENT}), max_size=8)


def tokens_of(messages) -> int:
    """At most what an engine that cut nothing reports: the pieces of every message (a template adds more)."""
    total = 0
    for m in messages:
        parts = [m["content"]] if isinstance(m["content"], str) else [p["text"] for p in m["content"]]
        total += sum(pieces(p) for p in parts)
    return total


def exchange(messages, window: int | None, counted: int | None = None, path="/v1/chat/completions") -> Exchange:
    ex = Exchange(id="c", path=path, request=orjson.dumps({"model": "m", "messages": messages}))
    ex.extra["window_hints"] = (window, counted)
    return ex


@given(MESSAGES, st.integers(1, 5000), st.integers(0, 64))
def test_an_answer_to_a_prompt_that_was_not_cut_is_never_flagged(messages, window, template):
    reported = tokens_of(messages) + template
    assert lower_bound("chat", {"messages": messages}) <= reported
    assert prompt_truncation(exchange(messages, window), {"prompt_tokens": reported}) is None


def test_ollama_cutting_to_num_ctx_is_flagged():
    """Ollama's runner keeps num_ctx of the prompt's tokens (runner.go, NewSequence) and reports that many."""
    messages = [{"role": "system", "content": "You are opencode. " * 50}, {"role": "user", "content": "word " * 6000}]
    cut = prompt_truncation(exchange(messages, 4096), {"prompt_tokens": 4096, "completion_tokens": 9})
    assert cut is not None and "reported 4096" in cut and "at least 6150" in cut and "4096-token window" in cut


def test_what_is_no_proof_is_not_flagged():
    long = [{"role": "user", "content": "word " * 6000}]
    assert prompt_truncation(exchange(long, None), {"prompt_tokens": 4096}) is None  # the window isn't known
    assert prompt_truncation(exchange(long, 8192), {"prompt_tokens": 4096}) is None  # it fits: no cut
    assert prompt_truncation(exchange(long, 4096), {}) is None  # no count reported
    # Words of earlier assistant turns are no proof (templates drop their reasoning)
    replies = [{"role": "assistant", "content": "word " * 6000}, {"role": "user", "content": "go"}]
    assert prompt_truncation(exchange(replies, 4096), {"prompt_tokens": 300}) is None
    # A cached prefix an engine left out of its count (Ollama 0.30, ollama#16428) on a prompt that fits
    assert prompt_truncation(exchange([{"role": "user", "content": "w " * 3000}], 4096), {"prompt_tokens": 12}) is None
    assert not truncated(4096, 4150, 4096)  # within the margin


def test_the_engines_own_count_and_the_other_surfaces():
    few = [{"role": "user", "content": "x" * 50000}]  # one word, many tokens: only the engine's count shows it
    assert prompt_truncation(exchange(few, 4096, counted=12000), {"prompt_tokens": 4096}) is not None
    assert prompt_truncation(exchange(few, 4096), {"prompt_tokens": 4096}) is None
    ex = Exchange(
        id="c", path="/v1/messages", request=orjson.dumps({"system": "s " * 5000, "messages": [], "max_tokens": 9})
    )
    ex.extra["window_hints"] = (2048, None)
    assert prompt_truncation(ex, {"input_tokens": 2000, "cache_read_input_tokens": 10}) is not None
    assert reported_prompt_tokens({"input_tokens": 5, "cache_read_input_tokens": 7}) == 12
    assert lower_bound("responses", {"instructions": "a b", "input": "c d e"}) == 5
    items = [{"role": "user", "content": [{"type": "input_text", "text": "f g"}]}, {"type": "function_call"}]
    assert lower_bound("responses", {"input": items}) == 2
