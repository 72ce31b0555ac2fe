"""`functools[{"name": ..., "arguments": {...}}, ...]`: Firefunction v2's and Phi-4-mini's calls, one wire form.

A JSON list after the word `functools`, with no end marker: the markup ends with the list. Firefunction
v2's template appends it to the message's text after a space (content + ` functools[`); Phi-4-mini's
system prompt (copied from Firefunction's) has the model start its reply with `functools`. What tells
the two apart is that space: Firefunction claims ` functools[`, and Phi-4-mini the word with no space
before it.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_list, named_json

OPEN = "functools["


class FunctoolsList(ToolFormat):
    """The list after `functools`; `spaced`: the family writes a space before the word."""

    def __init__(self, name: str, family: str, *, spaced: bool) -> None:
        self.name, self.family, self.openers = name, family, (OPEN,)
        self.spaced = spaced

    def claims(self, text: str, at: int) -> bool:
        return (at > 0 and text[at - 1] == " ") == self.spaced

    def parse(self, text: str, at: int) -> Markup | None:
        return json_list(text, at, at + len(OPEN) - 1)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return (" " if self.spaced else "") + OPEN[:-1] + dumps(named_json(calls))


FIREFUNCTION = FunctoolsList("firefunction", "Firefunction v2 (Fireworks)", spaced=True)
PHI4_MINI = FunctoolsList("phi4_mini", "Phi-4-mini", spaced=False)
