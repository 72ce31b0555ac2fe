"""StepFun Step 3: full-width section tokens around `steptml` invokes.

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="N">
    <steptml:parameter name="k">v</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>

The tokens use `_` (DeepSeek's look alike but use `▁`). vLLM's and SGLang's step3 readers allow
whitespace between the tokens, skip a call whose type isn't `function`, and vLLM's tests also show the
type and `<｜tool_sep｜>` left out: read alike. A string value is written as is, anything else as JSON;
both readers strip a value, here only the two newlines of a value on lines of its own are dropped (code
keeps its indentation and its last newline).
Step 3.5 (StepFun3.5-Flash's template) writes Qwen3-Coder's `<tool_call>\n<function=…>` markup instead,
read by that format.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import (
    Markup,
    RawCall,
    ToolFormat,
    XmlCall,
    call_section,
    dumps,
    frame,
    open_markup,
    quoted_attr,
    skip_ws,
)

CALLS_BEGIN, CALLS_END = "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool_call_begin｜>", "<｜tool_call_end｜>", "<｜tool_sep｜>"
PARAM, PARAM_END = '<steptml:parameter name="', "</steptml:parameter>"
INVOKE = XmlCall('<steptml:invoke name="', "</steptml:invoke>", PARAM, PARAM_END, quoted_attr, '">')


class Step3(ToolFormat):
    name = "step3"
    family = "StepFun Step 3"
    openers = (CALLS_BEGIN,)

    def parse(self, text: str, at: int) -> Markup | None:
        return call_section(text, at, CALLS_BEGIN, CALLS_END, CALL_BEGIN, _call)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        invokes = "".join(f"{CALL_BEGIN}function{SEP}{INVOKE.write(n, a, _value)}{CALL_END}" for n, a in calls)
        return f"{CALLS_BEGIN}{invokes}{CALLS_END}"


def _call(text: str, at: int, pos: int, calls: list[RawCall]) -> tuple[RawCall, int] | Markup | None:
    """`<｜tool_call_begin｜>function<｜tool_sep｜>` (the type and the separator may be left out), an invoke,
    `<｜tool_call_end｜>` and a separator, as `XmlCall.read`; a call of another type than `function` is not read."""
    pos = skip_ws(text, pos + len(CALL_BEGIN))
    if not text.startswith(INVOKE.opener, pos):
        sep = text.find(SEP, pos)
        if sep < 0:
            return open_markup(at, text, calls)
        if text[pos:sep].strip() != "function":
            return None
        pos = skip_ws(text, sep + len(SEP))
    read = INVOKE.read(text, at, pos, calls)
    if not isinstance(read, tuple):
        return read
    call, pos = read
    pos = skip_ws(text, pos)
    if not text.startswith(CALL_END, pos):
        return open_markup(at, text, calls) if CALL_END.startswith(text[pos:]) else None
    pos = skip_ws(text, pos + len(CALL_END))
    return call, skip_ws(text, pos + len(SEP)) if text.startswith(SEP, pos) else pos


def _value(value: Any) -> str:
    return frame(value) if isinstance(value, str) else dumps(value)
