"""One answer, independent of the API surface: what the Responses and Messages renderers draw from.

The scripted model (`agent_script.respond`) and the corpus cases both speak chat; the other two
surfaces need the same answer as an ordered list of parts — reasoning pieces, text pieces, and calls
with their argument fragments *as they were split* — so that a broken fragment sequence (a resent
copy, a lost first chunk) reaches the Responses or Messages wire exactly as it reached the chat one.
Requests go the other way: a Responses or Messages body is turned into the chat request the script
reads (messages, tools, tool_choice, effort, max_tokens).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from tapfix.proxy.mock.chat import Reply
from tapfix.proxy.mock.jsonish import arr, obj
from tapfix.proxy.mock.reading import turn_role

PartKind = Literal["reasoning", "text", "call"]
# The two surfaces this module renders for (chat has its own renderer in mock/chat.py).
EventedSurface = Literal["responses", "messages"]


@dataclass
class Part:
    kind: PartKind
    pieces: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    custom: bool = False  # a Responses custom tool call (raw input text, no JSON)


@dataclass
class Script:
    parts: list[Part]
    finish: str = "stop"  # chat vocabulary: stop | length | tool_calls
    completion_tokens: int = 0


def from_reply(reply: Reply) -> Script:
    parts: list[Part] = []
    if reply.reasoning_pieces:
        parts.append(Part("reasoning", list(reply.reasoning_pieces)))
    if reply.content_pieces:
        parts.append(Part("text", list(reply.content_pieces)))
    for call, frags in zip(reply.tool_calls, reply.arg_pieces, strict=True):
        parts.append(Part("call", list(frags), call.id, call.name, custom=call.custom))
    finish = "tool_calls" if reply.tool_calls and reply.finish_reason == "stop" else reply.finish_reason
    return Script(parts, finish, reply.completion_tokens)


def from_case(stream: list[Any]) -> Script:
    """A chat corpus case's chunks as parts; fragments kept as sent, calls keyed by index."""
    parts: list[Part] = []
    calls: dict[int, Part] = {}
    finish = "stop"
    tokens = 0
    for chunk in map(obj, stream):
        for choice in map(obj, arr(chunk.get("choices"))):
            delta = obj(choice.get("delta"))
            keys: tuple[tuple[str, PartKind], ...] = (
                ("reasoning", "reasoning"),
                ("reasoning_content", "reasoning"),
                ("content", "text"),
            )
            for key, kind in keys:
                text = delta.get(key)
                if isinstance(text, str) and text:
                    if not parts or parts[-1].kind != kind:
                        parts.append(Part(kind))
                    parts[-1].pieces.append(text)
                    tokens += 1
            for tc in map(obj, arr(delta.get("tool_calls"))):
                given = tc.get("index")
                index = given if isinstance(given, int) else 0
                fn = obj(tc.get("function"))
                part = calls.get(index)
                if part is None:
                    part = calls[index] = Part("call", call_id=str(tc.get("id") or f"call_{index}"))
                    parts.append(part)
                if isinstance(fn.get("name"), str) and not part.name:
                    part.name = fn["name"]
                args = fn.get("arguments")
                if args is not None and args != "":
                    part.pieces.append(args if isinstance(args, str) else json.dumps(args))
                    tokens += 1
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    return Script(parts, finish, tokens)


def break_pieces(reply: Reply, mode: str) -> Reply:
    """Fragment-level damage, applied after tokenization (the other modes damage the text).

    resend_whole: a last fragment repeats the whole arguments (vLLM's hermes final delta): repairable.
    drop_opening: the first fragment lost its `{"` (a missing first chunk): repairable.
    """
    if not reply.tool_calls or not reply.arg_pieces or not reply.arg_pieces[-1]:
        return reply
    frags = reply.arg_pieces[-1]
    whole = "".join(frags)
    if mode == "resend_whole":
        frags.append(whole)
    elif mode == "drop_opening":
        stripped = whole.lstrip()
        cut = 2 if stripped.startswith('{"') else 1
        rest = stripped[cut:]
        head = len(frags[0])
        reply.arg_pieces[-1] = [rest[:head], rest[head:]] if len(rest) > head else [rest]
    reply.tool_calls[-1].arguments = "".join(reply.arg_pieces[-1])
    return reply


# -- requests → the chat request the script reads ------------------------------------------------
def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    texts = [p.get("text") for p in arr(content) if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(t for t in texts if t and not t.lstrip().startswith("<system-reminder>"))


def _image_url(part: dict[str, Any]) -> str | None:
    """The URL of an image part of any surface: chat `image_url`, Responses `input_image`, Anthropic
    `image` (a base64 `source` becomes a data: URL)."""
    kind = part.get("type")
    if kind == "image_url":
        ref = part.get("image_url")
        url = ref.get("url") if isinstance(ref, dict) else ref
    elif kind == "input_image":
        url = part.get("image_url")
    elif kind == "image":
        source = obj(part.get("source"))
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            url = f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
        else:
            url = source.get("url")
    else:
        return None
    return url if isinstance(url, str) else None


def _content(content: Any) -> Any:
    """A content as the script reads it: the text, or text and image parts in chat's shape when it
    holds images (so an image in a user message or a tool result is seen on every surface)."""
    parts = [p for p in arr(content) if isinstance(p, dict)]
    images = [url for url in map(_image_url, parts) if url]
    if not images:
        return _text(content)
    text = [{"type": "text", "text": t} for t in [_text(content)] if t]
    return text + [{"type": "image_url", "image_url": {"url": url}} for url in images]


def chat_from_responses(req: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if isinstance(req.get("instructions"), str):
        messages.append({"role": "system", "content": req["instructions"]})
    items = req.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in map(obj, arr(items)):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role") if item.get("role") in ("user", "assistant", "system") else "user"
            role = "system" if item.get("role") == "developer" else role
            messages.append({"role": role, "content": _content(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call"):
            args = (item.get("arguments") or "{}") if kind == "function_call" else (item.get("input") or "")
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": args},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else _content(output),
                }
            )
    # Function tools stay flat (the script reads both shapes); custom (freeform) tools keep
    # `type: custom`, so the call is drawn as a `custom_tool_call` with raw input text.
    offered = map(obj, arr(req.get("tools")))
    tools = [t for t in offered if t.get("type") in ("function", "custom") and t.get("name")]
    choice = req.get("tool_choice")
    if isinstance(choice, dict) and choice.get("name"):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    out: dict[str, Any] = {"model": req.get("model"), "messages": messages, "tools": tools}
    if choice is not None:
        out["tool_choice"] = choice
    if isinstance(req.get("max_output_tokens"), int):
        out["max_tokens"] = req["max_output_tokens"]
    if isinstance(req.get("reasoning"), dict):
        out["reasoning"] = req["reasoning"]
    return out


_BUDGET_LEVELS = ((0, "none"), (1024, "minimal"), (4095, "low"), (12287, "medium"))


def chat_from_messages(req: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = req.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system)})
    for m in map(obj, arr(req.get("messages"))):
        content = m.get("content")
        blocks = [b for b in arr(content) if isinstance(b, dict)]
        results = [b for b in blocks if b.get("type") == "tool_result"]
        uses = [b for b in blocks if b.get("type") == "tool_use"]
        for b in results:
            result = {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _content(b.get("content"))}
            if b.get("is_error") is True:
                result["is_error"] = True  # Anthropic's flag for a failed call (the script reads it)
            messages.append(result)
        if uses:
            calls = [
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input") or {})},
                }
                for b in uses
            ]
            messages.append({"role": "assistant", "content": _text(content), "tool_calls": calls})
        elif not results or _text(content) or any(_image_url(b) for b in blocks):
            messages.append({"role": m.get("role") or "user", "content": _content(content)})
    tools = [
        {"type": "function", "function": {"name": t.get("name"), "parameters": t.get("input_schema") or {}}}
        for t in map(obj, arr(req.get("tools")))
        if t.get("name")
    ]
    out: dict[str, Any] = {"model": req.get("model"), "messages": messages, "tools": tools}
    choice = obj(req.get("tool_choice"))
    if choice.get("type") == "any":
        out["tool_choice"] = "required"
    elif choice.get("type") == "none":
        out["tool_choice"] = "none"
    elif choice.get("type") == "tool" and choice.get("name"):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(req.get("max_tokens"), int):
        out["max_tokens"] = req["max_tokens"]
    thinking = obj(req.get("thinking"))
    effort = obj(req.get("output_config")).get("effort")
    if thinking.get("type") == "disabled":
        out["reasoning_effort"] = "none"
    elif isinstance(effort, str):
        out["reasoning_effort"] = effort
    elif isinstance(thinking.get("budget_tokens"), int):
        budget = thinking["budget_tokens"]
        out["reasoning_effort"] = next((lvl for bound, lvl in _BUDGET_LEVELS if budget <= bound), "high")
    elif thinking.get("type") in ("enabled", "adaptive"):
        out["thinking"] = thinking
    return out


# -- the role of the last message, for the scenario condition `last_role` -------------------------
def last_role(req: dict[str, Any], surface: str) -> str | None:
    """The role whose turn it is: `user`, `assistant`, or `tool` when a tool result is the last thing
    said; `system`/`developer` only when nothing else is there. Instructions (system and developer
    messages, which Claude Code sends after the prompt too) never decide the turn
    (`reading.turn_role`).

    chat: a message's role (`function` counts as `tool`); responses: an `input` item (a string is a
    user message; `function_call_output` and `custom_tool_call_output` are `tool`, a call or reasoning
    item `assistant`); messages: a message's role, `tool` for a user message whose content is all
    `tool_result` blocks; completions: always `user` (a prompt).
    """
    if surface == "completions":
        return "user"
    if surface == "responses":
        items = req.get("input")
        if isinstance(items, str):
            return "user"
        return turn_role([_item_role(i) for i in arr(items) if isinstance(i, dict)])
    return turn_role([_message_role(m, surface) for m in arr(req.get("messages")) if isinstance(m, dict)])


def _item_role(item: dict[str, Any]) -> str | None:
    kind = item.get("type", "message")
    if kind == "message":
        return str(item.get("role") or "user")
    return "tool" if str(kind).endswith("_output") else "assistant"


def _message_role(message: dict[str, Any], surface: str) -> str | None:
    role = message.get("role")
    if surface == "messages" and role == "user":
        blocks = arr(message.get("content"))
        if blocks and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
            return "tool"
    if role == "function":
        return "tool"
    return role if isinstance(role, str) else None
