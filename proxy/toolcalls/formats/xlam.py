"""Salesforce xLAM: `[{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]`, one JSON list.

As vLLM's xlam parser reads it: the list as the whole message (no marker, so `anchored`), or in a
```` ```json ```` fenced block (a fence: a call only as the last thing in the text). Each item carries
both `name` and `arguments`, so a JSON answer that is merely a list of objects stays an answer.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, dumps, json_value, skip_ws

FENCE_OPEN, FENCE_CLOSE = "```json", "```"
_KEYS = {"name", "arguments", "id", "type"}


def _calls(value: Any) -> list[RawCall]:
    if not isinstance(value, list) or not value:
        raise ValueError("xLAM calls are a JSON list")
    calls: list[RawCall] = []
    for item in value:
        if not isinstance(item, dict) or not {"name", "arguments"} <= set(item) or not set(item) <= _KEYS:
            raise ValueError("an xLAM call is {name, arguments}")
        name, args = item["name"], item["arguments"]
        if not isinstance(name, str) or not name or not isinstance(args, dict | str):
            raise ValueError("an xLAM call is {name, arguments}")
        calls.append((name, args))
    return calls


class Xlam(ToolFormat):
    name = "xlam"
    family = "Salesforce xLAM"
    openers = (FENCE_OPEN,)
    anchored = True
    fence = True

    def claims(self, text: str, at: int) -> bool:
        if text.startswith(FENCE_OPEN, at):
            return text.startswith("[", skip_ws(text, at + len(FENCE_OPEN)))
        return text.startswith("[", at)  # the start of content (anchored)

    def parse(self, text: str, at: int) -> Markup | None:
        if text.startswith(FENCE_OPEN, at):
            value, end = json_value(text, at + len(FENCE_OPEN))
            calls = _calls(value)
            after = skip_ws(text, end)
            if text.startswith(FENCE_CLOSE, after):
                return Markup(at, after + len(FENCE_CLOSE), calls)
            return Markup(at, len(text), calls, closed=False) if after >= len(text) else None
        if not text.startswith("[", at):
            return None
        value, end = json_value(text, at)
        if text[end:].strip():
            return None  # a marker-less list is a call only as the whole message
        return Markup(at, end, _calls(value))

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "[" + ", ".join('{"name": "' + n + '", "arguments": ' + dumps(a) + "}" for n, a in calls) + "]"
