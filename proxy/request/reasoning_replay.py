"""Reasoning replay: the reasoning of an assistant turn tapfix answered, put back when the client resends
that turn without it (issue 36).

Interleaved-thinking models (MiniMax M2, Kimi K2, GLM 4.6+, DeepSeek V3.2+, Qwen3 templates that render the
reasoning of the turns since the last user message) are trained to see their own earlier reasoning between
tool calls; most clients drop it when they resend the conversation, and a self-hosted engine then degrades
silently. tapfix recorded that reasoning, byte for byte, when it delivered the turn.

Which recorded turn a resent assistant message is must be safe, because reasoning is private to the user
who caused it. A turn matches only when all of these hold:
- the conversation before it and the message itself continue one recorded exchange (the turn source finds
  it by the same chain digest sessions use: store/conversation.py; reasoning and ids don't count there);
- the message sits where that exchange's reply went (right after its request's messages);
- the message equals what tapfix delivered: its text, and each tool call's id, name and arguments (JSON
  compared parsed, so spacing and key order don't count). Ids alone never suffice: Kimi's repeat
  (`functions.write:0`) in every conversation;
- the same client sent it (address and user-agent) and the same session id, when the agent names one.

Where the reasoning goes is the engine's (`placement_for`): the field its request parser hands the chat
template, or `<think>…</think>` at the start of the content. Reasoning the client kept stays; kept in the
field the engine doesn't read, it is moved to the one it does. The message's bytes are spliced: nothing
else of the body changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tapfix.proxy.changes import Change
from tapfix.proxy.http_headers import SESSION_HEADERS
from tapfix.proxy.jsonbody import canonical_arguments
from tapfix.proxy.jsonsplice import Delete, Set, SpliceError, splice, top_level_item_spans
from tapfix.proxy.surfaces import Surface, api_surface

# What the engine's chat-completions parser reads from a history message and hands the template: vLLM's
# `_parse_chat_message_content` reads `message.get("reasoning")` (0.32: vllm/renderers/chat_utils.py; earlier
# vllm/entrypoints/chat_utils.py; 0.32's request validator also moves `reasoning_content` there, earlier ones
# don't); llama.cpp's `common_chat_msgs_parse_oaicompat` (common/chat.cpp) reads `reasoning_content`; SGLang's
# message model has `reasoning_content` and no `reasoning` (srt/entrypoints/openai/protocol.py,
# `ChatCompletionMessageGenericParam`).
ENGINE_FIELD: Mapping[str, str] = {"vllm": "reasoning", "sglang": "reasoning_content", "llamacpp": "reasoning_content"}
DEFAULT_FIELD = "reasoning_content"  # another engine: the field DeepSeek's API made the common one
# Hosted APIs: OpenAI's models take no reasoning back in the history, Anthropic's want signed thinking blocks
# only it can make; a route to one never gets replayed reasoning, whatever the model's setting.
NO_REPLAY_ENGINES = frozenset({"openai", "anthropic"})
REASONING_FIELDS = ("reasoning", "reasoning_content")
ReplayAs = Literal["field", "think"]
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"  # how Qwen3/DeepSeek templates write a turn's thinking

REPLAY_MARK = "replay_reasoning"  # Exchange.extra: its model replays reasoning, so its turn is remembered
REPLAY_MISSED = "reasoning_replay_missed"  # Exchange.extra: its resent turns that matched none tapfix answered
Client = tuple[str, str]  # (address, user-agent)
Call = tuple[str, str, bytes]  # (id, name, arguments in a normal form)


def placement_for(engine: str | None, replay_as: ReplayAs | None) -> str:
    """The message field the reasoning goes in (`replay_as` "field" or None: the engine's), or "think"
    (inline at the start of the content)."""
    if replay_as == "think":
        return "think"
    return ENGINE_FIELD.get(engine or "", DEFAULT_FIELD)


def session_key(headers: Sequence[tuple[str, str]] | Mapping[str, str], parsed: Mapping[str, Any]) -> str | None:
    """The session the agent names, as sessions.py reads it: its session header, else `prompt_cache_key`."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    named = {k.lower(): v for k, v in pairs if v}
    for header in SESSION_HEADERS:
        if header in named:
            return named[header][:200]
    key = parsed.get("prompt_cache_key")
    return key[:200] if isinstance(key, str) and key else None


def delivered_calls(tool_calls: Sequence[Any]) -> tuple[Call, ...]:
    """An assembled answer's tool calls (`{"id", "name", "arguments"}`) as compared."""
    return tuple(
        (str(c.get("id") or ""), str(c.get("name") or ""), canonical_arguments(c.get("arguments", c.get("input"))))
        for c in tool_calls
        if isinstance(c, dict)
    )


def replay_counts(changes: Sequence[Change], missed: int) -> dict[str, int]:
    """An exchange's resent turns by outcome (metrics): `replayed` (reasoning put back; a move is none), `missed`."""
    replayed = sum(1 for c in changes if c.kind == "replay_reasoning" and c.before is None)
    return {"replayed": replayed, "missed": missed} if replayed or missed else {}


@dataclass(frozen=True, slots=True)
class AnsweredTurn:
    """An assistant turn tapfix delivered: what the client received, and the reasoning it recorded."""

    capture_id: str
    client: Client
    session: str | None  # the session id the request named (None: none)
    prefix: int | None  # how many messages the recorded request held (the reply came after them); None: unknown
    content: str
    tool_calls: tuple[Call, ...]
    reasoning: str


class TurnSource(Protocol):
    def candidates(
        self, parsed: Mapping[str, Any], surface: Surface, wanted: Sequence[int]
    ) -> Mapping[int, Sequence[AnsweredTurn]]:
        """By the index of an assistant message in `parsed["messages"]` (of those `wanted`): the recorded
        exchanges whose conversation and reply that message and the messages before it continue."""
        ...


class ReplaySource(TurnSource, Protocol):
    """A `TurnSource` that also counts what became of the turns it was asked about (health, metrics)."""

    def counted(self, replayed: int, missed: int) -> None: ...


@dataclass(slots=True)
class Replayed:
    body: bytes
    parsed: dict[str, Any]  # what `body` parses to
    changes: list[Change] = field(default_factory=list)
    replayed: int = 0  # turns whose reasoning was put back
    missed: int = 0  # assistant turns sent without reasoning that matched no turn tapfix answered


def text_of(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") in ("text", "output_text")
        ).strip()
    return "\0"  # something else: equals no delivered text


def sent_calls(message: Mapping[str, Any], surface: Surface) -> tuple[Call, ...]:
    """The tool calls of a resent assistant message, as compared with `delivered_calls`."""
    calls: list[Call] = []
    if api_surface(surface).typed_content and isinstance(message.get("content"), list):
        for b in message["content"]:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                calls.append((str(b.get("id") or ""), str(b.get("name") or ""), canonical_arguments(b.get("input"))))
    for c in message.get("tool_calls") or []:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            calls.append((str(c.get("id") or ""), str(fn.get("name") or ""), canonical_arguments(fn.get("arguments"))))
    return tuple(calls)


def _kept_reasoning(message: Mapping[str, Any], surface: Surface) -> dict[str, str]:
    """The reasoning the client kept in the message, by where it kept it."""
    kept = {f: message[f] for f in REASONING_FIELDS if isinstance(message.get(f), str) and message[f]}
    content = message.get("content")
    if api_surface(surface).typed_content and isinstance(content, list):
        if any(isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking") for b in content):
            kept["thinking"] = "block"
    elif isinstance(content, str) and content.lstrip().startswith("<think>"):
        kept["think"] = content
    return kept


def matching_turn(
    text: str,
    calls: tuple[Call, ...],
    index: int,
    candidates: Sequence[AnsweredTurn],
    client: Client,
    session: str | None,
) -> AnsweredTurn | None:
    """The one recorded turn a resent reply (its text, its calls, where it sits) is, by every rule of the
    module docstring; None: none."""
    for turn in candidates:
        if (
            turn.client == client
            and turn.session == session
            and turn.prefix in (index, None)
            and turn.reasoning
            and turn.content.strip() == text
            and turn.tool_calls == calls
        ):
            return turn
    return None


def replay_reasoning(
    body: bytes,
    parsed: dict[str, Any],
    surface: Surface | None,
    source: TurnSource,
    client: Client,
    session: str | None,
    engine: str | None,
    replay_as: ReplayAs | None = None,
) -> Replayed | None:
    """The body with recorded reasoning put back into the assistant turns the client resent without it;
    None when nothing changes and nothing was missed. Raises SpliceError when `body` is not `parsed`."""
    api = api_surface(surface)
    if surface is None or not api.turns or api.item_turns:  # Responses: reasoning_replay_responses.py
        return None
    placement = placement_for(engine, replay_as)
    messages = parsed.get("messages")
    if not isinstance(messages, list):
        return None
    assistants = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
    if not assistants:
        return None
    kept_by = {i: _kept_reasoning(messages[i], surface) for i in assistants}
    found = source.candidates(parsed, surface, [i for i in assistants if not kept_by[i]])
    edits: dict[int, list[Set | Delete]] = {}
    new_messages = list(messages)
    out = Replayed(body, parsed)
    for i in assistants:
        message: dict[str, Any] = messages[i]
        kept = kept_by[i]
        if kept:
            if api.reasoning_fields and placement in REASONING_FIELDS and placement not in kept:
                other = next((f for f in REASONING_FIELDS if f in kept), None)
                if other is not None:  # kept where this engine doesn't look: moved where it does
                    edits[i] = [Delete((other,)), Set((placement,), kept[other])]
                    new_messages[i] = {**{k: v for k, v in message.items() if k != other}, placement: kept[other]}
                    out.changes.append(
                        Change(
                            "request",
                            "replay_reasoning",
                            f"$.messages[{i}].{placement}",
                            f"$.messages[{i}].{other}",
                            None,
                            f"the client kept this turn's reasoning in `{other}`; the engine reads `{placement}`",
                        )
                    )
            continue
        text, calls = text_of(message.get("content")), sent_calls(message, surface)
        turn = matching_turn(text, calls, i, found.get(i, ()), client, session)
        if turn is None:
            out.missed += 1
            continue
        placed = _place(message, turn.reasoning, placement, surface)
        if placed is None:
            out.missed += 1
            continue
        edits[i], new_messages[i], where = placed
        out.replayed += 1
        out.changes.append(replayed_change(f"$.messages[{i}]{where}", turn))
    if not edits:
        return out if out.missed else None
    out.body = _splice_messages(body, edits, parsed)
    out.parsed = {**parsed, "messages": new_messages}
    return out


def _place(
    message: dict[str, Any], reasoning: str, placement: str, surface: Surface
) -> tuple[list[Set | Delete], dict[str, Any], str] | None:
    """The edits of one message, the message after them, and the path suffix of what was put in."""
    if api_surface(surface).typed_content:
        content = message.get("content")
        block = {"type": "thinking", "thinking": reasoning, "signature": ""}
        if isinstance(content, str):
            blocks: list[Any] = [block, {"type": "text", "text": content}] if content else [block]
        elif isinstance(content, list):
            blocks = [block, *content]
        else:
            return None
        return [Set(("content",), blocks)], {**message, "content": blocks}, ".content[0]"
    if placement in REASONING_FIELDS:
        return [Set((placement,), reasoning)], {**message, placement: reasoning}, f".{placement}"
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return None  # parts: no place at "the start of the content" every template reads the same way
    inline = THINK_OPEN + reasoning + THINK_CLOSE + (content or "")
    return [Set(("content",), inline)], {**message, "content": inline}, ".content"


def replayed_change(path: str, turn: AnsweredTurn) -> Change:
    return Change(
        "request",
        "replay_reasoning",
        path,
        None,
        turn.reasoning,
        f"reasoning tapfix recorded in capture {turn.capture_id}, which delivered this turn; "
        "the client sent the turn back without it",
    )


def _splice_messages(body: bytes, edits: Mapping[int, Sequence[Set | Delete]], parsed: dict[str, Any]) -> bytes:
    """Each edited message spliced in place; the bytes between them stay as they came. `parsed`: the body's parse."""
    _, items = top_level_item_spans(body, ("messages",), parsed)
    spans = items.get("messages")
    if spans is None:
        raise SpliceError("no messages array")
    messages = parsed.get("messages")
    out, pos = [], 0
    for i in sorted(edits):
        start, end = spans[i]
        message = messages[i] if isinstance(messages, list) and i < len(messages) else None
        own = message if isinstance(message, dict) else None
        out += [body[pos:start], splice(body[start:end], list(edits[i]), own)]
        pos = end
    out.append(body[pos:])
    return b"".join(out)
