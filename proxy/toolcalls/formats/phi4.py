"""Phi-4-mini: `functools[{"name": ..., "arguments": {...}}, ...]`, a JSON list with no end marker.

Firefunction v2 writes the same list after the same word (its template: content + ` functools[`), so
the two read alike. Phi-4-mini's system prompt has it start the reply with `functools`; Firefunction's
template puts a space before it: Phi-4-mini claims the word when no space precedes it, and leaves
` functools[` to Firefunction.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call

OPEN = "functools["


class Phi4Mini(ToolFormat):
    name = "phi4_mini"
    family = "Phi-4-mini"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return at == 0 or text[at - 1] != " "

    def parse(self, text: str, at: int) -> Markup | None:
        items, end = json_value(text, at + len(OPEN) - 1)
        if not isinstance(items, list):
            return None
        calls = [named_call(item) for item in items]
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "functools" + dumps([{"name": n, "arguments": a} for n, a in calls])
