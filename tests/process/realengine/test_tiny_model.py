"""The tiny model does what the real-engine tests rely on, first in numpy (no server), then in llama-server.

The numpy forward pass is the specification; the server must agree with it token for token on
prompts the server itself renders from its chat templates.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.process.realengine import tiny_model as tm

SYSTEM_WITH_TOOLS = (
    "<|im_start|>system\n# Tools\n\n<tools>\n{}\n</tools>\n\nFor each function call ... within"
    " <tool_call></tool_call> XML tags:\n<tool_call>\n{}\n</tool_call><|im_end|>\n"
)
USER = "<|im_start|>user\nhi<|im_end|>\n"
ASSISTANT = "<|im_start|>assistant\n"
CALL_TEXT = "<tool_call>" + "".join(tm.CALL_PIECES) + "</tool_call>"


def test_with_tools_and_no_result_it_calls_write_once_and_stops():
    text, stopped = tm.generate(SYSTEM_WITH_TOOLS + USER + ASSISTANT)
    assert stopped
    assert text == CALL_TEXT
    body = text.removeprefix("<tool_call>").removesuffix("</tool_call>")
    assert json.loads(body) == {"name": tm.CALL_NAME, "arguments": tm.CALL_ARGUMENTS}


def test_after_a_tool_result_it_answers():
    result = "<|im_start|>user\n<tool_response>\nWrote file successfully.\n</tool_response><|im_end|>\n"
    prompt = SYSTEM_WITH_TOOLS + USER + ASSISTANT + CALL_TEXT + "<|im_end|>\n" + result + ASSISTANT
    assert tm.generate(prompt) == (tm.ANSWER, True)


def test_without_tools_it_answers():
    assert tm.generate(USER + ASSISTANT) == (tm.ANSWER, True)
    assert tm.generate("<|im_start|>system\nBe brief.<|im_end|>\n" + USER + ASSISTANT) == (tm.ANSWER, True)


def test_with_thinking_open_it_reasons_then_answers():
    assert tm.generate(USER + ASSISTANT + "<think>\n") == (tm.REASONING + "</think>" + tm.ANSWER, True)
    # thinking wins over a pending tool call: the reasoning template is the one that opened <think>
    text, _ = tm.generate(SYSTEM_WITH_TOOLS + USER + ASSISTANT + "<think>\n")
    assert text.startswith(tm.REASONING + "</think>")


@pytest.mark.parametrize("closed", ["<think>\n</think>", "<think>\n\n</think>\n\n"])
def test_with_thinking_closed_it_answers(closed):
    assert tm.generate(USER + ASSISTANT + closed) == (tm.ANSWER, True)


def test_detection_does_not_depend_on_position():
    padding = "<|im_start|>user\n" + "x " * 3000 + "<|im_end|>\n"
    assert tm.generate(SYSTEM_WITH_TOOLS + padding + USER + ASSISTANT)[0] == CALL_TEXT


def test_a_prompt_the_tables_do_not_cover_degenerates_instead_of_stopping():
    text, stopped = tm.generate("Once upon a time", max_tokens=8)
    assert not stopped and tm.ANSWER not in text


@pytest.mark.parametrize("pieces", range(1, len(tm.ANSWER_PIECES)))
def test_a_prefill_of_the_answer_is_continued_to_the_end(pieces):
    """An assistant prefill (what a continuation sends) carries on as the model would have: the pieces
    are what BPE reaches, so a prefix cut where the pre-tokenizer cuts tokenizes into them."""
    prefix = "".join(tm.ANSWER_PIECES[:pieces])
    text, stopped = tm.generate(USER + ASSISTANT + prefix)
    assert (prefix + text, stopped) == (tm.ANSWER, True)


def test_pieces_spell_the_strings():
    assert "".join(tm.ANSWER_PIECES) == tm.ANSWER
    assert "".join(tm.REASONING_PIECES) == tm.REASONING
    vocab = tm.Vocab()
    assert len(set(vocab.stored)) == len(vocab), "every token's text is unique"


CONVERSATIONS = {
    "plain": {"messages": [{"role": "user", "content": "hi"}]},
    "prefill": {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello from"}]},
    "prefill_mid_sentence": {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "I say Hello from the"}]
    },
    "tools": {"messages": [{"role": "user", "content": "hi"}], "tools": [tm.WRITE_TOOL]},
    "tool_result": {"messages": tm.after_the_call(), "tools": [tm.WRITE_TOOL]},
}


def _server_agrees_with_numpy(url: str, conversation: dict) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        prompt = client.post("/apply-template", json=conversation).json()["prompt"]
        tokens = client.post("/tokenize", json={"content": prompt, "add_special": False, "parse_special": True})
        assert tokens.json()["tokens"] == tm.Vocab().tokenize(prompt), "numpy tokenizes as llama.cpp does"
        done = client.post(
            "/completion", json={"prompt": prompt, "temperature": 0, "n_predict": 64, "cache_prompt": False}
        ).json()
    want, stopped = tm.generate(prompt, max_tokens=64)
    assert done["content"] == want
    assert (done["stop_type"] == "eos") == stopped


@pytest.mark.realengine
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_llama_server_agrees_with_the_numpy_forward_pass(llama, name):
    _server_agrees_with_numpy(llama.url, CONVERSATIONS[name])


@pytest.mark.realengine
@pytest.mark.parametrize(
    "kwargs", [{}, {"chat_template_kwargs": {"enable_thinking": False}}], ids=["think", "no_think"]
)
def test_llama_server_with_the_reasoning_template_agrees_with_numpy(llama_reasoning, kwargs):
    _server_agrees_with_numpy(llama_reasoning.url, {**CONVERSATIONS["plain"], **kwargs})


@pytest.mark.realengine
@pytest.mark.parametrize("stream", [False, True])
def test_llama_server_continues_an_assistant_prefix(llama, stream):
    """llama.cpp's explicit continuation (docs/regenerate.md): the stream leaves the prefix out, the
    whole message keeps it; either way the model carries on from "Hello from" as it would have."""
    body = {
        **CONVERSATIONS["prefill"],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "temperature": 0,
        "stream": stream,
    }
    with httpx.Client(base_url=llama.url, timeout=30) as client:
        response = client.post("/v1/chat/completions", json=body)
    if stream:
        chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert "Hello from" + content == tm.ANSWER
    else:
        assert response.json()["choices"][0]["message"]["content"] == tm.ANSWER
