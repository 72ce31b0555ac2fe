"""The facts of vLLM 0.32.0 that tapfix's request-side work builds on, pinned against the real server.

- `/v1/models` reports `max_model_len` (the window tapfix can read instead of asking the user);
- `/tokenize` takes a chat request and renders it with the model's chat template, as a generation would;
- the two context errors, byte for byte: a prompt over the window, and a prompt that fits whose `max_tokens`
  doesn't;
- which field of an assistant message in the history reaches the chat template: `reasoning` (vLLM's own
  name, which it also hands the template as `reasoning_content`); a client's `reasoning_content` is dropped.
"""

from __future__ import annotations

import json

import httpx
import jinja2
import pytest

from tests.process.vllm.engine import MAX_MODEL_LEN, MODEL, VllmServer
from tests.process.vllm.wire import CHAT, chat_body, rendered_prompt

pytestmark = [pytest.mark.vllm]

HI = [{"role": "user", "content": "hi"}]


def post(server: VllmServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60)


def rendered(server: VllmServer, messages: list[dict], **extra: object) -> str:
    return rendered_prompt(server, {"messages": messages, **extra})


def test_v1_models_reports_the_window(vllm: VllmServer, tiny_qwen3_dir) -> None:
    listing = httpx.get(vllm.url + "/v1/models", timeout=30).json()
    [model] = listing["data"]
    assert (model["id"], model["owned_by"], model["root"]) == (MODEL, "vllm", str(tiny_qwen3_dir))
    assert model["max_model_len"] == MAX_MODEL_LEN


def test_tokenize_renders_a_chat_request_with_the_chat_template(vllm: VllmServer, vllm_install) -> None:
    answer = post(vllm, "/tokenize", {"model": MODEL, "messages": HI}).json()
    assert set(answer) == {"count", "max_model_len", "tokens", "token_strs"}
    assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == MAX_MODEL_LEN
    assert answer["token_strs"] is None  # only with `return_token_strs: true`
    template = jinja2.Environment().from_string(vllm_install.template.read_text())
    want = template.render(messages=HI, add_generation_prompt=True)
    assert rendered(vllm, HI) == want == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # the generation prompt's own switch, as chat_template_kwargs passes it
    off = rendered(vllm, HI, chat_template_kwargs={"enable_thinking": False})
    assert off == want + "<think>\n\n</think>\n\n"
    # and the count is what a generation's usage reports for the same messages
    usage = post(vllm, CHAT, chat_body(HI, max_tokens=1)).json()["usage"]
    assert usage["prompt_tokens"] == answer["count"]


def overflow_prompt(server: VllmServer) -> tuple[list[dict], int]:
    """A user message whose rendered prompt is one token over the window, and its token count."""
    base = post(server, "/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": ""}]}).json()["count"]
    # each digit is a pre-token of its own (Qwen2's split): a token per character
    messages = [{"role": "user", "content": "1" * (MAX_MODEL_LEN + 1 - base)}]
    count = post(server, "/tokenize", {"model": MODEL, "messages": messages}).json()["count"]
    assert count == MAX_MODEL_LEN + 1
    return messages, count


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_prompt_over_the_window_is_vllms_400(vllm: VllmServer, stream: bool) -> None:
    messages, count = overflow_prompt(vllm)
    answer = post(vllm, CHAT, chat_body(messages, stream=stream))
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/json"
    message = (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt contains at least"
        f" {count} input tokens, which exceeds this limit even without any output tokens. Please reduce the"
        f" length of the input prompt. (parameter=input_tokens, value={count})"
    )
    error = {"error": {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}}
    assert answer.content == json.dumps(error, separators=(",", ":")).encode()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_max_tokens_over_the_window_is_vllms_400(vllm: VllmServer, stream: bool) -> None:
    too_many = MAX_MODEL_LEN + 1
    answer = post(vllm, CHAT, chat_body(HI, max_tokens=too_many, stream=stream))
    assert answer.status_code == 400
    message = (
        f"max_tokens={too_many} cannot be greater than max_model_len={MAX_MODEL_LEN}."
        f" Please request fewer output tokens. (parameter=max_tokens, value={too_many})"
    )
    error = {"error": {"message": message, "type": "BadRequestError", "param": "max_tokens", "code": 400}}
    assert answer.content == json.dumps(error, separators=(",", ":")).encode()


CALL = {"id": "call_1", "type": "function", "function": {"name": "write", "arguments": "{}"}}


def after_a_call(**reasoning: str) -> list[dict]:
    """A turn after a tool call, so the assistant message is past the last user query: Qwen3's template
    renders its reasoning then (and drops it from earlier turns)."""
    assistant = {"role": "assistant", "content": "", "tool_calls": [CALL], **reasoning}
    return [*HI, assistant, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]


def test_the_history_field_that_reaches_the_template_is_reasoning(vllm: VllmServer) -> None:
    block = "<|im_start|>assistant\n<think>\nI should write.\n</think>\n\n<tool_call>"
    assert block in rendered(vllm, after_a_call(reasoning="I should write."))
    dropped = rendered(vllm, after_a_call(reasoning_content="I should write."))
    assert "I should write." not in dropped
    assert dropped == rendered(vllm, after_a_call())
