"""The forcing rules of the vLLM suite (tests/process/vllm/served/forcing_plan.py): the directive a test puts
in its prompt and how much of the text a prompt already holds do what the logits processor vLLM loads relies
on. Pure: no server (the suite itself runs against vLLM in tests/process/vllm/)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.process.vllm.served.forcing_plan import ASSISTANT, already_written, directive, remaining, script

# Any text but the markup the rules look for (`<` of Qwen's headers, `[` of a directive).
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="<["), max_size=40)


@given(st.lists(TEXT, min_size=1, max_size=4), TEXT, TEXT)
def test_a_directive_carries_its_texts_exactly_and_the_last_one_counts(texts, before, after) -> None:
    prompt = f"{before}{directive('ignored')}{before}{directive(*texts)}{after}"
    assert script(prompt) == texts


@given(st.lists(TEXT, min_size=1, max_size=3), st.integers(0, 3))
def test_each_turn_gets_its_own_text(texts, done) -> None:
    history = "".join(f"{ASSISTANT}answer {n}<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n" for n in range(done))
    prompt = f"<|im_start|>user\nhi {directive(*texts)}<|im_end|>\n{history}{ASSISTANT}"
    assert remaining(prompt) == (texts[done] if done < len(texts) else None)


def test_without_a_directive_nothing_is_forced() -> None:
    assert remaining(f"<|im_start|>user\nhi<|im_end|>\n{ASSISTANT}") is None


@given(TEXT, st.integers(0, 40))
def test_a_continued_prefix_is_not_written_again(text, cut) -> None:
    prefix = text[:cut]
    assert already_written(prefix, text) == len(prefix)
    prompt = f"<|im_start|>user\n{directive(text)}<|im_end|>\n{ASSISTANT}{prefix}"
    assert remaining(prompt) == text[len(prefix) :]


def test_a_template_that_renders_the_open_message_differently_is_followed_by_its_tail() -> None:
    """Qwen3 renders a continued answer after an empty think block, and the cut may drop its trailing
    whitespace: the model writes on after the part of the text the open message ends with."""
    text = "<think>\nI will write it.\n</think>\n\nWriting now.\n<tool_call>\n{}\n</tool_call>"
    assert already_written("<think>\n\n</think>\n\nWriting now.", text) == text.index("Writing now.") + 12
    # Qwen3's own think block for `enable_thinking: false` is not the model's text: it writes it all
    assert already_written("<think>\n\n</think>\n\n", "Hello!") == 0
