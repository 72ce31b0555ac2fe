"""IBM Granite 3.x: `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`, a JSON list and no end marker.

Granite 3.0 writes the `<|tool_call|>` token; Granite 3.1-3.3 may write the plain string `<tool_call>`
before the same list (vLLM's granite parser strips either). Granite 4.x writes hermes markup
(`<tool_call>\n{...}\n</tool_call>`), read by formats/hermes.py: `<tool_call>` is claimed here only when a
JSON list follows it, which hermes (an object), Qwen3-Coder (`<function=`) and GLM (a name) never do.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_list, named_json, skip_ws

TOKEN, STRING = "<|tool_call|>", "<tool_call>"


class Granite(ToolFormat):
    name = "granite"
    family = "IBM Granite 3.x"
    openers = (TOKEN, STRING)

    def claims(self, text: str, at: int) -> bool:
        return text.startswith("[", skip_ws(text, at + len(_opener(text, at))))

    def parse(self, text: str, at: int) -> Markup | None:
        opener = _opener(text, at)
        pos = skip_ws(text, at + len(opener))
        return json_list(text, at, pos) if text.startswith("[", pos) else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return TOKEN + dumps(named_json(calls))


def _opener(text: str, at: int) -> str:
    return TOKEN if text.startswith(TOKEN, at) else STRING
