"""Streamed and non-streamed tool-call repair: Chat Completions, Responses and Anthropic Messages.

`ChatToolCallRepair`, `ResponsesToolCallRepair` and `MessagesToolCallRepair` are incremental
`feed(event)/flush()` stages over whole raw SSE events (as `SSESplitter` yields them);
`repair_chat_completion`, `repair_responses_body` and `repair_messages_body` apply the same rules to
a non-streamed body. `stage_for(surface, ...)` / `body_repair_for(surface)` pick one by API surface;
both take the request's `tool_choice` on every surface (a named one lets a Chat Completions call
finish with `stop`; the other surfaces don't read it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from tapfix.proxy.changes import Change
from tapfix.proxy.surfaces import CHAT, MESSAGES, RESPONSES, PerSurface, Surface
from tapfix.proxy.toolcalls.accumulate import assemble_tool_calls
from tapfix.proxy.toolcalls.chat_stage import ChatToolCallRepair
from tapfix.proxy.toolcalls.messages import MessagesToolCallRepair, repair_messages_body
from tapfix.proxy.toolcalls.nonstream import repair_chat_completion
from tapfix.proxy.toolcalls.responses import ResponsesToolCallRepair
from tapfix.proxy.toolcalls.responses_body import repair_responses_body
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy


class ToolCallStage(Protocol):
    """A streaming tool-call repair stage, whichever surface it serves: `feed(event)/flush()` over whole raw
    SSE events, with its records (`changes`) and its verdict (`outcome`)."""

    @property
    def changes(self) -> list[Change]: ...
    @property
    def outcome(self) -> str: ...
    def feed(self, event: bytes) -> list[bytes]: ...
    def flush(self) -> list[bytes]: ...


# A surface's stage from (tools, policy, capture_id, stream_valid_prefix, tool_choice, tool_format).
_StageFactory = Callable[[list[Any], ToolRepairPolicy, str, bool, Any, str | None], ToolCallStage]


def _stage(
    cls: type[ChatToolCallRepair | ResponsesToolCallRepair | MessagesToolCallRepair], reads_choice: bool
) -> _StageFactory:
    """A surface's stage; only Chat Completions reads `stream_valid_prefix` and `tool_choice` (`reads_choice`)."""

    def make(
        tools: list[Any],
        policy: ToolRepairPolicy,
        capture_id: str,
        stream_valid_prefix: bool,
        tool_choice: Any,
        tool_format: str | None,
    ) -> ToolCallStage:
        chat_only = {"stream_valid_prefix": stream_valid_prefix, "tool_choice": tool_choice} if reads_choice else {}
        return cls(tools, policy=policy, capture_id=capture_id, tool_format=tool_format, **chat_only)

    return make


_STAGES: PerSurface[_StageFactory] = PerSurface(
    {
        CHAT: _stage(ChatToolCallRepair, reads_choice=True),
        RESPONSES: _stage(ResponsesToolCallRepair, reads_choice=False),
        MESSAGES: _stage(MessagesToolCallRepair, reads_choice=False),
    }
)
BodyRepair = Callable[..., tuple[bytes, list[Any], str]]


def _ignoring_tool_choice(repair: BodyRepair) -> BodyRepair:
    """A body repair that has no use for `tool_choice`, callable like the chat one."""

    def call(
        body: bytes, tools: list[Any] | None, *, tool_choice: Any = None, **kw: Any
    ) -> tuple[bytes, list[Any], str]:
        return repair(body, tools, **kw)

    return call


_BODIES: PerSurface[BodyRepair] = PerSurface(
    {
        CHAT: repair_chat_completion,
        RESPONSES: _ignoring_tool_choice(repair_responses_body),
        MESSAGES: _ignoring_tool_choice(repair_messages_body),
    }
)


def stage_for(
    surface: Surface | None,
    tools: list[Any],
    policy: ToolRepairPolicy,
    capture_id: str,
    stream_valid_prefix: bool = False,
    tool_choice: Any = None,
    tool_format: str | None = None,
) -> ToolCallStage | None:
    """The streaming repair stage of an API surface (None: the surface has none).

    `stream_valid_prefix` (Chat Completions only, off by default): forward tool-call fragments while
    they are provably fine instead of holding them; see `prefix.py` for what that gives up.
    `tool_choice` (the request's; read by Chat Completions only): a named one lets its call finish
    with `stop`, as OpenAI and vLLM send it. `tool_format` (every surface; a registered name, see
    docs/formats.md): the one format leaked markup is read in; UnknownFormat for a name not registered.
    """
    make = _STAGES.get(surface)
    return make(tools, policy, capture_id, stream_valid_prefix, tool_choice, tool_format) if make else None


def body_repair_for(surface: Surface | None) -> BodyRepair | None:
    """The non-streamed repair of an API surface, called as `(body, tools, *, capture_id, policy,
    tool_choice, tool_format)` on every surface."""
    return _BODIES.get(surface)


__all__ = [
    "ChatToolCallRepair",
    "MessagesToolCallRepair",
    "ResponsesToolCallRepair",
    "assemble_tool_calls",
    "body_repair_for",
    "repair_chat_completion",
    "repair_messages_body",
    "repair_responses_body",
    "stage_for",
    "ToolCallStage",
]
