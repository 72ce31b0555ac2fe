"""Kimi K2: `<|tool_calls_section_begin|>` holding
`<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>` calls, then
`<|tool_calls_section_end|>` (the Kimi-K2 chat templates, vLLM's kimi_k2 parser).

The call id carries the name: `functions.` and `:IDX` are framing (models also drop them). A call may
start without the section opener; the arguments are one JSON object (or a JSON string holding one).
"""

from __future__ import annotations

import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, dumps, json_value, skip_ws

SECTION_OPEN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_OPEN, ARGS_OPEN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
_CALL_ID = re.compile(r"\s*(?:functions\.)?([\w\-.]+?)(?::\d+)?\s*" + re.escape(ARGS_OPEN))


class KimiK2(ToolFormat):
    name = "kimi_k2"
    family = "Kimi K2"
    openers = (SECTION_OPEN, CALL_OPEN)

    def parse(self, text: str, at: int) -> Markup | None:
        pos = at + len(SECTION_OPEN) if text.startswith(SECTION_OPEN, at) else at
        calls: list[RawCall] = []
        while True:
            pos = skip_ws(text, pos)
            if not text.startswith(CALL_OPEN, pos):
                break
            head = _CALL_ID.match(text, pos + len(CALL_OPEN))
            if head is None:
                raise ValueError("no Kimi call id")
            args, pos = json_value(text, head.end())
            if not isinstance(args, (dict, str)):
                raise ValueError("Kimi arguments are an object")
            pos = skip_ws(text, pos)
            if not text.startswith(CALL_END, pos):
                if pos >= len(text) and calls:
                    break
                raise ValueError("Kimi call not closed")
            calls.append((head.group(1), args))
            pos += len(CALL_END)
        if not calls:
            if pos >= len(text):
                raise ValueError("Kimi section cut before its first call")
            return None
        if text.startswith(SECTION_END, pos):
            return Markup(at, pos + len(SECTION_END), calls)
        return Markup(at, pos if pos < len(text) else len(text), calls, closed=False)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        body = "".join(
            f"{CALL_OPEN}functions.{name}:{k}{ARGS_OPEN}{dumps(args)}{CALL_END}" for k, (name, args) in enumerate(calls)
        )
        return f"{SECTION_OPEN}{body}{SECTION_END}"
