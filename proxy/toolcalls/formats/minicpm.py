"""MiniCPM 5: `<function name="N"><param name="K">value</param>…</function>`, one element per call.

As openbmb-MiniCPM5-1B.jinja renders it (not hermes JSON): calls follow the content, each on its own
line; a value holding `<`, `&` or a newline is wrapped in `<![CDATA[…]]>`, anything else is printed as
Jinja prints it (`3`, `True`, `['a', 'b']`). Values are read byte for byte as `XmlArgs`, typed later by
the offered tool's schema: the template adds no framing newlines around them.
"""

from __future__ import annotations

import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, XmlArgs, skip_ws

OPEN = '<function name="'
CLOSE = "</function>"
PARAM, PARAM_CLOSE = '<param name="', "</param>"
CDATA, CDATA_CLOSE = "<![CDATA[", "]]>"
_NAME = re.compile(r'([^"<>\s]+)">')


class MiniCPM(ToolFormat):
    name = "minicpm"
    family = "MiniCPM 5"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = at
        while text.startswith(OPEN, pos):
            call, pos = _function(text, pos)
            if call is None:
                return Markup(at, len(text), calls, closed=False) if calls or pos >= len(text) else None
            calls.append(call)
            nxt = skip_ws(text, pos)
            if text.startswith(OPEN, nxt):
                pos = nxt
        return Markup(at, pos, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join(
            f'{OPEN}{n}">' + "".join(f'{PARAM}{k}">{_value(v)}{PARAM_CLOSE}' for k, v in a.items()) + CLOSE
            for n, a in calls
        )


def _function(text: str, pos: int) -> tuple[RawCall | None, int]:
    """One `<function …>` element; (None, len) when the text ends inside it."""
    m = _NAME.match(text, pos + len(OPEN))
    if m is None:
        if '">' not in text[pos:]:
            return None, len(text)
        raise ValueError("a function has a name")
    args = XmlArgs()
    pos = m.end()
    while text.startswith(PARAM, pos):
        end = text.find('">', pos + len(PARAM))
        if end < 0:
            return None, len(text)
        key = text[pos + len(PARAM) : end]
        pos = end + 2
        if text.startswith(CDATA, pos):
            close = text.find(CDATA_CLOSE, pos + len(CDATA))
            if close < 0:
                return None, len(text)
            value, pos = text[pos + len(CDATA) : close], close + len(CDATA_CLOSE)
            if not text.startswith(PARAM_CLOSE, pos):
                if pos >= len(text) - len(PARAM_CLOSE) and PARAM_CLOSE.startswith(text[pos:]):
                    return None, len(text)
                raise ValueError("CDATA ends the value")
        else:
            close = text.find(PARAM_CLOSE, pos)
            if close < 0:
                return None, len(text)
            value, pos = text[pos:close], close
        if not key or key in args:
            raise ValueError("a parameter has one name")
        args[key] = value
        pos += len(PARAM_CLOSE)
    if text.startswith(CLOSE, pos):
        return (m.group(1), args), pos + len(CLOSE)
    if CLOSE.startswith(text[pos:]) or PARAM.startswith(text[pos:]):  # the text ends inside a tag
        return None, len(text)
    raise ValueError("a function closes with </function>")


def _value(value: Any) -> str:
    """As the template prints a value: CDATA around text holding <, & or a newline; Python's str()."""
    if isinstance(value, str):
        return f"{CDATA}{value}{CDATA_CLOSE}" if any(c in value for c in "<&\n") else value
    return str(value)
