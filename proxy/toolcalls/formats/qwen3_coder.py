"""Qwen3-Coder / Qwen3.5 / Nemotron 3 XML: `<tool_call>\\n<function=NAME>\\n<parameter=k>\\nv\\n</parameter>\\n
</function>\\n</tool_call>`, also without the `<tool_call>` wrapper (the Qwen3-Coder, Qwen3.5 and
Nemotron-3-Nano chat templates; vLLM's qwen3_coder / qwen3_xml parsers).

`<tool_call>` is shared with hermes (JSON follows) and GLM (a name follows): this format claims it when
`<function=` follows. `<function=NAME>` is shared with Llama 3.1 / Functionary's `<function=NAME>{json}`:
this one claims it when a parameter (or the close) follows. One newline each side of a value is the
template's framing, not payload (vllm#48753); the rest is typed later by the tool's schema. A
parameter's close may be missing when the next parameter or the function's close follows.
"""

from __future__ import annotations

import re
from typing import Any

from tapfix.proxy.toolcalls.formats.base import FUNCTION_XML, Markup, RawCall, ToolFormat, XmlArgs, dumps, skip_ws

WRAP_OPEN, WRAP_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
NL = "\n"
_FUNCTION = re.compile(r"<function=([^>\n]+)>")
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>))", re.S)


def _is_xml_function(text: str, at: int) -> bool:
    head = _FUNCTION.match(text, at)
    if head is None:
        return len(text) - at < 64 and ">" not in text[at:]  # a name still arriving
    rest = skip_ws(text, head.end())
    return rest >= len(text) or text.startswith(("<parameter=", FUNCTION_CLOSE), rest)


def _read_function(text: str, pos: int) -> tuple[RawCall, int]:
    head = _FUNCTION.match(text, pos)
    if head is None:
        raise ValueError("not a function")
    close = text.find(FUNCTION_CLOSE, head.end())
    if close < 0:
        raise ValueError("function not closed")
    params: dict[str, str] = {}
    body = text[head.end() : close]
    pos_in = 0
    for param in _PARAM.finditer(body):
        if body[pos_in : param.start()].strip():
            raise ValueError("text between parameters")
        value = param.group(2)
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        params[param.group(1).strip()] = value
        pos_in = param.end()
    if body[pos_in:].strip():
        raise ValueError("text after the parameters")
    return (head.group(1).strip(), XmlArgs(params)), close + len(FUNCTION_CLOSE)


class Qwen3Coder(ToolFormat):
    name = "qwen3_coder"
    family = "Qwen3-Coder, Qwen3.5, Nemotron 3"
    openers = (WRAP_OPEN, FUNCTION_OPEN)

    def claims(self, text: str, at: int) -> bool:
        if text.startswith(WRAP_OPEN, at):
            pos = skip_ws(text, at + len(WRAP_OPEN))
            if pos >= len(text):
                return True
            if not text.startswith(FUNCTION_OPEN, pos):
                return FUNCTION_OPEN.startswith(text[pos:])
            at = pos
        return _is_xml_function(text, at)

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[RawCall] = []
        pos = end = at
        while True:
            wrapped = text.startswith(WRAP_OPEN, pos)
            inner = skip_ws(text, pos + len(WRAP_OPEN)) if wrapped else pos
            if not text.startswith(FUNCTION_OPEN, inner):
                break
            call, pos = _read_function(text, inner)
            calls.append(call)
            if wrapped:
                pos = skip_ws(text, pos)
                if text.startswith(WRAP_CLOSE, pos):
                    pos += len(WRAP_CLOSE)
                elif pos >= len(text):
                    return Markup(at, len(text), calls, closed=False)
            end = pos
            pos = skip_ws(text, pos)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return NL.join(
            f"{WRAP_OPEN}{NL}{FUNCTION_XML.write(n, a, _value, newline=NL)}{NL}{WRAP_CLOSE}" for n, a in calls
        )


def _value(value: Any) -> str:
    """On lines of its own (the template's framing); anything but a string as JSON."""
    return f"\n{value if isinstance(value, str) else dumps(value)}\n"
