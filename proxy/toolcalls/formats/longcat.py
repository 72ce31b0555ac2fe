"""Meituan LongCat-Flash: `<longcat_tool_call>\n{"name": ..., "arguments": {...}}\n</longcat_tool_call>`.

Hermes' JSON object under LongCat's own tag (vLLM's longcat parser is the hermes parser with these tags);
one block per call.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_blocks

OPEN, CLOSE = "<longcat_tool_call>", "</longcat_tool_call>"


class LongCat(ToolFormat):
    name = "longcat"
    family = "Meituan LongCat-Flash"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        return json_blocks(text, at, OPEN, CLOSE)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join(f"{OPEN}\n{dumps({'name': n, 'arguments': a})}\n{CLOSE}" for n, a in calls)
