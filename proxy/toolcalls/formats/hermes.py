"""Hermes / Qwen2.5 / Qwen3 / ERNIE: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

The opener is shared with Qwen3-Coder XML (`<tool_call>\n<function=…`) and GLM (`<tool_call>name`):
hermes claims it only when a JSON object follows.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call, skip_ws

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class Hermes(ToolFormat):
    name = "hermes"
    family = "Hermes, Qwen2.5, Qwen3, ERNIE"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return text.startswith("{", skip_ws(text, at + len(OPEN)))

    def parse(self, text: str, at: int) -> Markup | None:
        calls = []
        pos = at
        while text.startswith(OPEN, pos):
            value, pos = json_value(text, pos + len(OPEN))
            calls.append(named_call(value))
            pos = skip_ws(text, pos)
            if not text.startswith(CLOSE, pos):
                return Markup(at, len(text), calls, closed=False) if pos >= len(text) else None
            pos = skip_ws(text, pos + len(CLOSE))
        return Markup(at, pos, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(f"{OPEN}\n{dumps({'name': n, 'arguments': a})}\n{CLOSE}" for n, a in calls)
