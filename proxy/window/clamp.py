"""The max_tokens clamp: lower a request's output budget to what the window leaves after the prompt, as the
engine counts it; never raise it, never below a floor.

vLLM refuses a request whose prompt plus `max_tokens` exceeds `max_model_len` instead of clamping (vllm
#42474), so an agent's fixed 32000 or 65536 fails on a prompt that fits. Counting costs a round trip to the
engine's tokenizer, so it happens only when a cheap bound says the request might not fit: a prompt has at
most as many tokens as its request has bytes, plus the chat template's own (`TEMPLATE_SLACK`).
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.surfaces import Surface, api_surface

TEMPLATE_SLACK = 1024  # tokens a chat template may add around the messages and tools


BUDGET_KEY = "budget"  # Exchange.extra: the request's budget_of(), noted by the router's one parse of the body


def budget_of(surface: Surface | None, parsed: dict[str, Any]) -> tuple[str, int] | None:
    """(field, value) of the request's output budget, when it sets one."""
    for key in api_surface(surface).max_tokens_fields:
        value = parsed.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None


def might_not_fit(body_bytes: int, budget: int, window: int) -> bool:
    return body_bytes + TEMPLATE_SLACK + budget > window


def clamped(budget: int, window: int, prompt_tokens: int, floor: int) -> int | None:
    """The lowered budget, or None when it stays as it is (it fits, or it is already at or under the floor)."""
    left = window - prompt_tokens
    if budget <= left:
        return None
    new = max(left, floor)
    return new if new < budget else None


def chat_messages(surface: Surface | None, parsed: dict[str, Any]) -> list[Any] | None:
    """The request's prompt as chat messages, for the engine's `/tokenize` (which applies the chat template):
    Messages' `system` and Responses' `instructions` as a first system message; None when there are none."""
    api = api_surface(surface)
    if api.conversation is None:
        return None
    source = parsed.get(api.conversation)
    messages = [{"role": "user", "content": source}] if api.item_turns and isinstance(source, str) else source
    system = parsed.get(api.instructions) if api.instructions is not None else None
    if not isinstance(messages, list):
        return None
    return ([{"role": "system", "content": system}] if system else []) + messages


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    """The request's function tools in chat completions' shape, which the engines' chat templates render:
    Responses' `{type, name, parameters}` and Anthropic's `{name, input_schema}` wrapped as `{type, function}`;
    tools that aren't functions (a Responses built-in such as web_search) are left out, no template renders them."""
    out: list[dict[str, Any]] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if isinstance(tool.get("function"), dict):
            out.append({"type": "function", "function": tool["function"]})
        elif isinstance(tool.get("name"), str) and tool.get("type", "function") in ("function", "custom"):
            schema = tool.get("parameters", tool.get("input_schema"))
            function = {"name": tool["name"], "parameters": schema if isinstance(schema, dict) else {}}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            out.append({"type": "function", "function": function})
    return out


def tokenize_request(surface: Surface | None, parsed: dict[str, Any]) -> dict[str, Any] | None:
    """What the engine's tokenizer needs to render the prompt as the generation will: the messages, the tools
    (an agent's tool list is thousands of tokens of the prompt) and the chat template's arguments (a thinking
    switch changes the rendered prompt). None when the request has no messages."""
    messages = chat_messages(surface, parsed)
    if messages is None:
        return None
    request: dict[str, Any] = {"messages": messages}
    tools = chat_tools(parsed.get("tools"))
    if tools:
        request["tools"] = tools
    kwargs = parsed.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and kwargs:
        request["chat_template_kwargs"] = kwargs
    return request
