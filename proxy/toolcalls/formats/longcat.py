"""Meituan LongCat-Flash: `<longcat_tool_call>\n{"name": ..., "arguments": {...}}\n</longcat_tool_call>`.

Hermes' JSON object under LongCat's own tag (vLLM's longcat parser is the hermes parser with these tags);
one block per call.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call, skip_ws

OPEN, CLOSE = "<longcat_tool_call>", "</longcat_tool_call>"


class LongCat(ToolFormat):
    name = "longcat"
    family = "Meituan LongCat-Flash"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        calls = []
        pos = end = at
        while text.startswith(OPEN, pos):
            value, pos = json_value(text, pos + len(OPEN))
            calls.append(named_call(value))
            pos = skip_ws(text, pos)
            if not text.startswith(CLOSE, pos):
                return Markup(at, len(text), calls, closed=False) if CLOSE.startswith(text[pos:]) else None
            end = pos + len(CLOSE)
            pos = skip_ws(text, end)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join(f"{OPEN}\n{dumps({'name': n, 'arguments': a})}\n{CLOSE}" for n, a in calls)
