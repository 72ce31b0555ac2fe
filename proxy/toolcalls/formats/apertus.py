"""Swiss AI Apertus: `<|tools_prefix|>[{"NAME": {…}}, …]<|tools_suffix|>`.

As Apertus-8B-Instruct.jinja renders it: a JSON list of one-member objects, each the tool's name
holding its arguments (an object, or the JSON text the client sent). Markup inside the model's
thought span (`<|inner_prefix|>…<|inner_suffix|>`) is thinking, not a call.
"""

from __future__ import annotations

import json
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, dumps, inside, json_value, skip_ws

OPEN, CLOSE = "<|tools_prefix|>", "<|tools_suffix|>"
THOUGHT_OPEN, THOUGHT_CLOSE = "<|inner_prefix|>", "<|inner_suffix|>"


class Apertus(ToolFormat):
    name = "apertus"
    family = "Swiss AI Apertus"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return not inside(text, at, THOUGHT_OPEN, THOUGHT_CLOSE)

    def parse(self, text: str, at: int) -> Markup | None:
        value, pos = json_value(text, at + len(OPEN))
        calls: list[RawCall] = []
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict) or len(item) != 1:
                raise ValueError("an Apertus call is {name: arguments}")
            ((name, args),) = item.items()
            if not name or not isinstance(args, dict | str):
                raise ValueError("arguments are an object or its JSON text")
            calls.append((name, args))
        pos = skip_ws(text, pos)
        if not text.startswith(CLOSE, pos):
            return Markup(at, len(text), calls, closed=False) if pos >= len(text) else None
        return Markup(at, pos + len(CLOSE), calls)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return OPEN + "[" + ", ".join(f"{{{json.dumps(n)}: {dumps(a)}}}" for n, a in calls) + "]" + CLOSE
