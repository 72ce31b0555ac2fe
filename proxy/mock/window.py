"""The mock playing a vLLM with a small `max_model_len`: `/tokenize` with chat messages counts the prompt, and a
request whose prompt, or prompt plus `max_tokens`, doesn't fit gets vLLM's 400 (vllm #42474: vLLM refuses
instead of clamping). The prompt's count is the mock's own (its JSON's bytes / 4, as its usage reports), the
same on both paths, so a test can prove a clamp exact to the token."""

from __future__ import annotations

from typing import Any

import orjson
from tapfix.proxy.mock.chat import error_body
from tapfix.proxy.mock.jsonish import arr


def prompt_count(messages: Any) -> int:
    return max(1, len(orjson.dumps(messages)) // 4)


def messages_of(req: dict[str, Any], surface: str) -> list[Any]:
    """The chat messages a request's prompt is counted from: Messages' `system` and Responses' `instructions`
    as a first system message, a Responses string `input` as one user message."""
    if surface == "responses":
        source = req.get("input")
        messages = [{"role": "user", "content": source}] if isinstance(source, str) else arr(source)
        system = req.get("instructions")
    else:
        messages = arr(req.get("messages"))
        system = req.get("system") if surface == "messages" else None
    return ([{"role": "system", "content": system}] if system else []) + list(messages)


def refusal(req: dict[str, Any], surface: str, window: int) -> bytes | None:
    """vLLM's 400 body when the request can't fit the window, else None. The prompt-alone text is vLLM
    0.32's real one (../shared/vllm-samples/hermes/15_error_context_too_long.body)."""
    prompt = prompt_count(messages_of(req, surface))
    if prompt > window:
        return error_body(
            f"This model's maximum context length is {window} tokens. However, your prompt contains at least "
            f"{prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
            f"length of the input prompt. (parameter=input_tokens, value={prompt})",
            400,
            param="input_tokens",
        )
    budget = next((req[k] for k in ("max_completion_tokens", "max_tokens", "max_output_tokens") if k in req), None)
    if isinstance(budget, int) and prompt + budget > window:
        return error_body(
            f"This model's maximum context length is {window} tokens. However, you requested {budget} output "
            f"tokens and your prompt contains at least {prompt} input tokens, for a total of at least "
            f"{prompt + budget} tokens. Please reduce the length of the input prompt or the number of requested "
            f"output tokens. (parameter=input_tokens, value={prompt})",
            400,
            param="input_tokens",
        )
    return None


def tokenize_body(req: dict[str, Any], window: int) -> bytes:
    """vLLM's `/tokenize` answer to `{"model", "messages"}` (or `{"prompt"}`): count, max_model_len, tokens."""
    source = req.get("messages") if "messages" in req else req.get("prompt", "")
    count = prompt_count(source)
    return orjson.dumps({"count": count, "max_model_len": window, "tokens": list(range(count)), "token_strs": None})
