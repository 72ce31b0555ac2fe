"""Llama-Nemotron / Nemotron Nano v2: `<TOOLCALL>[{"name": N, "arguments": {…}}, …]</TOOLCALL>`.

As NVIDIA-Nemotron-Nano-v2.jinja renders it: one JSON list of calls (arguments an object, or the JSON
text the client sent) after the content and a newline. Nemotron 3 Nano writes Qwen3-Coder XML instead
(`qwen3_coder`).
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call, skip_ws

OPEN, CLOSE = "<TOOLCALL>", "</TOOLCALL>"


class Nemotron(ToolFormat):
    name = "nemotron"
    family = "Llama-Nemotron, Nemotron Nano v2"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        value, pos = json_value(text, at + len(OPEN))
        calls = [named_call(item) for item in (value if isinstance(value, list) else [value])]
        pos = skip_ws(text, pos)
        if not text.startswith(CLOSE, pos):
            return Markup(at, len(text), calls, closed=False) if pos >= len(text) else None
        return Markup(at, pos + len(CLOSE), calls)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        items = ", ".join(f'{{"name": "{n}", "arguments": {dumps(a)}}}' for n, a in calls)
        return f"{OPEN}[{items}]{CLOSE}"
