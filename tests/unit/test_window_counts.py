"""Issue 37: a next turn's prompt is counted from the earlier one's count and its new suffix."""

from __future__ import annotations

from tapfix.proxy.window.counts import MIN_PREFIX, Counted, PromptCounts

MODEL = ("gpu0", "m")
TURN = "<|im_start|>system\\nYou are opencode." + "x" * MIN_PREFIX + "<|im_start|>assistant\\n"


def test_the_longest_earlier_prompt_is_found_and_a_thread_keeps_one():
    counts = PromptCounts(kept=2)
    counts.remember(MODEL, TURN, Counted(1000, exact=True))
    next_turn = TURN + "Done.<|im_end|>\\n<|im_start|>user\\nnow test<|im_start|>assistant\\n"
    assert counts.known(MODEL, next_turn) == (TURN, Counted(1000, exact=True))
    assert counts.known(MODEL, TURN) == (TURN, Counted(1000, exact=True))  # a retry: counted already
    assert counts.known(("gpu1", "m"), next_turn) is None  # another upstream's tokenizer
    counts.remember(MODEL, next_turn, Counted(1012, exact=False))
    assert counts.known(MODEL, next_turn + "more")[0] == next_turn  # the longest
    counts.remember(MODEL, "another thread " * 400, Counted(800, exact=True))
    counts.remember(MODEL, "a third thread " * 400, Counted(800, exact=True))
    assert counts.known(MODEL, next_turn) is None  # the oldest went (the thread's earlier turn went at once)


def test_a_short_earlier_prompt_is_not_worth_an_inexact_sum():
    counts = PromptCounts()
    counts.remember(MODEL, "short", Counted(2, exact=True))
    assert counts.known(MODEL, "short and more") is None and counts.known(MODEL, "short") is not None
