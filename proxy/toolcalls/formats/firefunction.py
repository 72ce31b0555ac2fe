"""Fireworks Firefunction v2: ` functools[{"name": "get_weather", "arguments": {...}}, ...]`.

The template appends the list to the message's text after a space, and the model writes no closing
marker: the markup ends with the JSON list. Phi-4-mini's prompt asks for the same `functools[…]`
list (copied from Firefunction's), so the two are one wire form; what tells them apart is that
space: Firefunction claims ` functools[`, and leaves the word with no space before it to Phi-4-mini.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call

OPEN = "functools["


class Firefunction(ToolFormat):
    name = "firefunction"
    family = "Firefunction v2 (Fireworks)"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return at > 0 and text[at - 1] == " "

    def parse(self, text: str, at: int) -> Markup | None:
        value, end = json_value(text, at + len(OPEN) - 1)
        if not isinstance(value, list) or not value:
            return None
        return Markup(at, end, [named_call(item) for item in value])

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        items = ", ".join('{"name": "' + n + '", "arguments": ' + dumps(a) + "}" for n, a in calls)
        return f" {OPEN}{items}]"
