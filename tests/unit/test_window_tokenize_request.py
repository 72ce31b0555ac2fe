"""What tapfix asks the engine's tokenizer to count: the prompt as the chat template renders it for the
generation, so the tools and the template's arguments go with the messages, in chat completions' shape."""

from __future__ import annotations

from tapfix.proxy.window.clamp import tokenize_request

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
CHAT, MESSAGES, RESPONSES = "chat", "messages", "responses"  # the surfaces' names, as surface_for gives them
AS_CHAT = {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": SCHEMA}}


def test_chat_tools_and_template_arguments_go_with_the_messages():
    parsed = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [AS_CHAT],
        "tool_choice": "auto",
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 9000,
    }
    assert tokenize_request(CHAT, parsed) == {
        "messages": parsed["messages"],
        "tools": [AS_CHAT],
        "chat_template_kwargs": {"enable_thinking": False},
    }


def test_anthropic_and_responses_tools_are_counted_in_chat_shape():
    anthropic = {"name": "read", "description": "Read a file.", "input_schema": SCHEMA}
    messages = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}], "tools": [anthropic]}
    assert tokenize_request(MESSAGES, messages) == {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "tools": [AS_CHAT],
    }
    responses_tool = {"type": "function", "name": "read", "description": "Read a file.", "parameters": SCHEMA}
    built_in = {"type": "web_search_preview"}  # no chat template renders a built-in: not part of the count
    responses = {"input": "hi", "instructions": "be brief", "tools": [responses_tool, built_in]}
    assert tokenize_request(RESPONSES, responses) == {
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "tools": [AS_CHAT],
    }


def test_no_tools_no_messages_and_odd_values():
    assert tokenize_request(CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": []}) == {
        "messages": [{"role": "user", "content": "hi"}]
    }
    assert tokenize_request(CHAT, {"prompt": "hi"}) is None
    odd = {"messages": [], "tools": ["x", {"type": "function"}, 3], "chat_template_kwargs": "no"}
    assert tokenize_request(CHAT, odd) == {"messages": []}
