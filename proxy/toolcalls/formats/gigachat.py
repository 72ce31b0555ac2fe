"""GigaChat 3 / 3.1: one call per turn, `{"name": N, "arguments": {…}}` after a role marker.

GigaChat3-10B-A1.8B.jinja renders the call as its own `function call` role message after the
assistant's: `<|message_sep|>\n\nfunction call<|role_sep|>\n{…}<|message_sep|>\n\n`; GigaChat 3.1
(GigaChat3.1-10B-A1.8B.jinja) inside the assistant message: `<|function_call|>{…}<|message_sep|>\n\n`.
Both render only the first of several calls, so one markup is one call. The separator after the
call belongs to the markup; the one before a `function call` role stays text (it was streamed before
the role said a call follows).
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call, skip_ws

ROLE = "function call<|role_sep|>"  # GigaChat 3
TOKEN = "<|function_call|>"  # GigaChat 3.1
SEP = "<|message_sep|>"


class GigaChat(ToolFormat):
    name = "gigachat"
    family = "GigaChat 3, GigaChat 3.1"
    openers = (ROLE, TOKEN)

    def parse(self, text: str, at: int) -> Markup | None:
        opener = ROLE if text.startswith(ROLE, at) else TOKEN
        if not text.startswith(opener, at):
            return None
        value, pos = json_value(text, at + len(opener))
        if not isinstance(value, dict):
            raise ValueError("a GigaChat call is one object")
        calls = [named_call(value)]
        sep = skip_ws(text, pos)
        if text.startswith(SEP, sep):
            return Markup(at, skip_ws(text, sep + len(SEP)), calls)
        if sep >= len(text) or SEP.startswith(text[sep:]):
            return Markup(at, len(text), calls, closed=False)  # ended on eos, or the separator is coming
        return Markup(at, pos, calls)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        if len(calls) != 1:
            raise ValueError("GigaChat renders one call per turn")
        ((name, args),) = calls
        return f"{SEP}\n\n{ROLE}\n" + f'{{"name": "{name}", "arguments": {dumps(args)}}}' + f"{SEP}\n\n"
