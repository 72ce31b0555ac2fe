"""AI21 Jamba: `<tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>`, one JSON list.

`<tool_calls>` also opens MiniMax-M1's JSON lines (an object follows) and Hunyuan Hy3's `<tool_call>`
items: Jamba claims it when a list follows. Hunyuan A13B writes the very same list (vLLM's hunyuan_a13b
parser reads it the same way); inside A13B's `<answer>` it is left to formats/hunyuan.py, anywhere else
it reads here, with the same calls.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call, named_json, skip_ws

OPEN, CLOSE = "<tool_calls>", "</tool_calls>"


def json_list_calls(text: str, at: int, opener: str, closer: str) -> Markup | None:
    """`opener [call, ...] closer` at `at` (shared with Hunyuan A13B, which writes the same list)."""
    pos = skip_ws(text, at + len(opener))
    if not text.startswith("[", pos):
        return None
    items, pos = json_value(text, pos)
    if not isinstance(items, list):
        return None
    calls = [named_call(item) for item in items]
    if not calls:
        return None
    pos = skip_ws(text, pos)
    if text.startswith(closer, pos):
        return Markup(at, pos + len(closer), calls)
    return Markup(at, len(text), calls, closed=False) if closer.startswith(text[pos:]) else None


def inside_answer(text: str, at: int) -> bool:
    """Hunyuan A13B answers inside `<answer>…</answer>`: its list follows the tag directly."""
    return text[:at].rstrip().endswith("<answer>")


class Jamba(ToolFormat):
    name = "jamba"
    family = "AI21 Jamba"
    openers = (OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return text.startswith("[", skip_ws(text, at + len(OPEN))) and not inside_answer(text, at)

    def parse(self, text: str, at: int) -> Markup | None:
        return json_list_calls(text, at, OPEN, CLOSE)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return OPEN + dumps(named_json(calls)) + CLOSE
