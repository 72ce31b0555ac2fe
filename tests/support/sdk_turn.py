"""One turn with a `write` tool through the real SDKs, on each surface, streamed or not: what the client got.

The openai SDK speaks Chat Completions and Responses, the anthropic SDK Messages, with `max_retries=0`
(a retryable error reaches the test, not a resend). `ask` returns what an agent would act on: the text,
the calls with their parsed arguments, how the turn ended, and the error the SDK raised, if any, with
the capture id from the response headers either way.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import anthropic
import openai

Surface = Literal["chat", "responses", "messages"]
SURFACES: tuple[Surface, ...] = ("chat", "responses", "messages")
PARAMETERS = {
    "type": "object",
    "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}},
    "required": ["filePath", "content"],
}
CHAT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "write", "description": "Write a file", "parameters": PARAMETERS}}
]
RESPONSES_TOOLS: list[Any] = [{"type": "function", "name": "write", "parameters": PARAMETERS}]
MESSAGES_TOOLS: list[Any] = [{"name": "write", "description": "Write a file", "input_schema": PARAMETERS}]


@dataclass
class Turn:
    capture_id: str | None = None
    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    end: str | None = None  # chat finish_reason, Responses status, Messages stop_reason
    error: BaseException | None = None  # what the SDK raised

    @property
    def error_text(self) -> str:
        return str(self.error) if self.error is not None else ""


def streamed_calls(chunks: Iterable[Any]) -> tuple[list[dict[str, str]], openai.APIError | None]:
    """The tool calls a streamed chat completion's chunks (as the openai SDK parses them) hand out, joined per
    index and in index order, and the error the SDK raised mid-stream, if any (the calls read until then)."""
    calls: dict[int, dict[str, str]] = {}
    error = None
    try:
        for chunk in chunks:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                    if call.function:
                        entry["name"] += call.function.name or ""
                        entry["arguments"] += call.function.arguments or ""
    except openai.APIError as e:
        error = e
    return [calls[i] for i in sorted(calls)], error


def prompt(tag: str = "") -> str:
    """A prompt of its own: the mock counts attempts per conversation, so every turn starts at attempt 1."""
    return f"Create a file hello.txt containing a greeting ({tag}{uuid.uuid4().hex[:12]})"


def ask(
    base_url: str, surface: Surface, model: str, stream: bool, text: str | None = None, timeout: float = 30
) -> Turn:
    text = text or prompt()
    turn = Turn()
    try:
        if surface == "messages":
            client = anthropic.Anthropic(base_url=base_url, api_key="k", max_retries=0, timeout=timeout)
            _messages(client, model, text, stream, turn)
        else:
            openai_client = openai.OpenAI(base_url=base_url + "/v1", api_key="k", max_retries=0, timeout=timeout)
            (_chat if surface == "chat" else _responses)(openai_client, model, text, stream, turn)
    except (openai.APIError, anthropic.APIError) as e:
        turn.error = e
        response = getattr(e, "response", None)
        if turn.capture_id is None and response is not None:
            turn.capture_id = response.headers.get("x-tapfix-capture-id")
    return turn


def _chat(client: openai.OpenAI, model: str, text: str, stream: bool, turn: Turn) -> None:
    messages: Any = [{"role": "user", "content": text}]
    raw: Any = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, tools=CHAT_TOOLS, stream=stream
    )
    turn.capture_id = raw.headers.get("x-tapfix-capture-id")
    if not stream:
        choice = raw.parse().choices[0]
        turn.text, turn.end = choice.message.content or "", choice.finish_reason
        calls = choice.message.tool_calls or []
        turn.calls = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
        return
    pieces: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for chunk in raw.parse():
        for choice in chunk.choices:
            turn.text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                if call.function and call.function.name:
                    names[call.index] = names.get(call.index, "") + call.function.name
                if call.function and call.function.arguments:
                    pieces.setdefault(call.index, []).append(call.function.arguments)
            turn.end = choice.finish_reason or turn.end
    turn.calls = [(names.get(i, ""), json.loads("".join(pieces.get(i, [])))) for i in sorted(names)]


def _responses(client: openai.OpenAI, model: str, text: str, stream: bool, turn: Turn) -> None:
    raw: Any = client.responses.with_raw_response.create(model=model, input=text, tools=RESPONSES_TOOLS, stream=stream)
    turn.capture_id = raw.headers.get("x-tapfix-capture-id")
    final = None
    if stream:
        for event in raw.parse():
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
    else:
        final = raw.parse()
    if final is None:
        return
    turn.end = final.status
    for item in final.output:
        if item.type == "message":
            turn.text += "".join(getattr(part, "text", "") for part in item.content)
        elif item.type == "function_call":
            turn.calls.append((item.name, json.loads(item.arguments)))


def _messages(client: anthropic.Anthropic, model: str, text: str, stream: bool, turn: Turn) -> None:
    messages: Any = [{"role": "user", "content": text}]
    raw: Any = client.messages.with_raw_response.create(
        model=model, max_tokens=1000, messages=messages, tools=MESSAGES_TOOLS, stream=stream
    )
    turn.capture_id = raw.headers.get("x-tapfix-capture-id")
    if not stream:
        message = raw.parse()
        turn.end = message.stop_reason
        for block in message.content:
            if block.type == "text":
                turn.text += block.text
            elif block.type == "tool_use":
                turn.calls.append((block.name, dict(block.input)))
        return
    blocks: dict[int, tuple[str, list[str]]] = {}
    for event in raw.parse():
        if event.type == "content_block_start" and event.content_block.type == "tool_use":
            blocks[event.index] = (event.content_block.name, [])
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            turn.text += event.delta.text
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            blocks[event.index][1].append(event.delta.partial_json)
        elif event.type == "message_delta":
            turn.end = event.delta.stop_reason
    turn.calls = [(name, json.loads("".join(parts) or "{}")) for _, (name, parts) in sorted(blocks.items())]
