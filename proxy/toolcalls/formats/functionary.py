"""MeetKai Functionary v3.1 and v3.2.

- `functionary_v31` (Llama 3.1 based): `<function=get_weather>{"city": "Paris"}</function>`, calls
  back to back. The opener is shared with Qwen3-Coder's XML (`<function=NAME>\n<parameter=…`):
  v3.1 claims it only when a JSON object follows the `>`.
- `functionary_v32`: channels, each `>>>RECIPIENT\n…`: `>>>all\n` is text for the user, any other
  recipient is a call with JSON arguments (raw code for `python`, read as `{"code": …}` as llama.cpp
  does). The generation prompt already holds the first `>>>`, so a reply opening with a call starts
  `get_weather\n{…}` with no marker: that form is read only at the start of content (`anchored`).
"""

from __future__ import annotations

import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, dumps, json_value, skip_ws

V31_OPEN, V31_CLOSE = "<function=", "</function>"
CHANNEL = ">>>"
_V31_HEAD = re.compile(r"<function=([^>\s]+)>")
_RECIPIENT = re.compile(r"([A-Za-z_][\w.\-]*)\n")
TEXT_CHANNEL = "all"


class FunctionaryV31(ToolFormat):
    name = "functionary_v31"
    family = "Functionary v3.1 (MeetKai)"
    openers = (V31_OPEN,)

    def claims(self, text: str, at: int) -> bool:
        m = _V31_HEAD.match(text, at)
        return m is not None and text.startswith("{", skip_ws(text, m.end()))

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = end = at
        while (m := _V31_HEAD.match(text, pos)) is not None:
            args, pos = json_value(text, m.end())
            if not isinstance(args, dict):
                raise ValueError("arguments are an object")
            calls.append((m.group(1), args))
            pos = skip_ws(text, pos)
            if not text.startswith(V31_CLOSE, pos):
                return Markup(at, len(text), calls, closed=False) if pos >= len(text) else None
            end = pos + len(V31_CLOSE)
            pos = skip_ws(text, end)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(f"{V31_OPEN}{n}>{dumps(a)}{V31_CLOSE}" for n, a in calls)


class FunctionaryV32(ToolFormat):
    name = "functionary_v32"
    family = "Functionary v3.2 (MeetKai)"
    openers = (CHANNEL,)
    anchored = True

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = end = at
        first = True
        while True:
            marked = text.startswith(CHANNEL, pos)
            if not marked and not first:
                break
            m = _RECIPIENT.match(text, pos + len(CHANNEL) if marked else pos)
            if m is None or m.group(1) == TEXT_CHANNEL:
                break  # the text channel (or not a channel): what follows is for the user
            call, pos = _channel_call(text, m.group(1), m.end())
            calls.append(call)
            end, first = pos, False
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(f"{CHANNEL}{n}\n{dumps(a)}" for n, a in calls)


def _channel_call(text: str, name: str, pos: int) -> tuple[RawCall, int]:
    if text.startswith("{", pos):
        args, end = json_value(text, pos)
        if not isinstance(args, dict):
            raise ValueError("arguments are an object")
        return (name, args), end
    if name == "python":
        stop = text.find(CHANNEL, pos)
        stop = len(text) if stop < 0 else stop
        if text[pos:stop].strip():
            return (name, {"code": text[pos:stop]}), stop
    raise ValueError("a call's arguments are JSON")
