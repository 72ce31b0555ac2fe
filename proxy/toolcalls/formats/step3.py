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

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, XmlArgs, dumps, frame, open_markup, skip_ws, unframe

CALLS_BEGIN, CALLS_END = "<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool_call_begin｜>", "<｜tool_call_end｜>", "<｜tool_sep｜>"
INVOKE, INVOKE_END = '<steptml:invoke name="', "</steptml:invoke>"
PARAM, PARAM_END = '<steptml:parameter name="', "</steptml:parameter>"


class Step3(ToolFormat):
    name = "step3"
    family = "StepFun Step 3"
    openers = (CALLS_BEGIN,)

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[tuple[str | None, Any]] = []
        pos = skip_ws(text, at + len(CALLS_BEGIN))
        while text.startswith(CALL_BEGIN, pos):
            pos = skip_ws(text, pos + len(CALL_BEGIN))
            if not text.startswith(INVOKE, pos):
                sep = text.find(SEP, pos)
                if sep < 0:
                    return open_markup(at, text, calls)
                if text[pos:sep].strip() != "function":
                    return None
                pos = skip_ws(text, sep + len(SEP))
            if not text.startswith(INVOKE, pos):
                return open_markup(at, text, calls) if INVOKE.startswith(text[pos:]) else None
            name, pos = _attr(text, pos + len(INVOKE))
            args = XmlArgs()
            pos = skip_ws(text, pos)
            while text.startswith(PARAM, pos):
                key, pos = _attr(text, pos + len(PARAM))
                value_end = text.find(PARAM_END, pos)
                if value_end < 0:
                    return open_markup(at, text, calls)
                args[key] = unframe(text[pos:value_end])
                pos = skip_ws(text, value_end + len(PARAM_END))
            if not text.startswith(INVOKE_END, pos):
                return open_markup(at, text, calls) if INVOKE_END.startswith(text[pos:]) else None
            pos = skip_ws(text, pos + len(INVOKE_END))
            if not text.startswith(CALL_END, pos):
                return open_markup(at, text, calls) if CALL_END.startswith(text[pos:]) else None
            calls.append((name, args))
            pos = skip_ws(text, pos + len(CALL_END))
            if text.startswith(SEP, pos):
                pos = skip_ws(text, pos + len(SEP))
        if not calls:
            return None
        if text.startswith(CALLS_END, pos):
            return Markup(at, pos + len(CALLS_END), calls)
        return open_markup(at, text, calls) if CALLS_END.startswith(text[pos:]) else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        out = [CALLS_BEGIN]
        for name, args in calls:
            out.append(f'{CALL_BEGIN}function{SEP}{INVOKE}{name}">')
            for key, value in args.items():
                out.append(f'{PARAM}{key}">{frame(value) if isinstance(value, str) else dumps(value)}{PARAM_END}')
            out.append(f"{INVOKE_END}{CALL_END}")
        out.append(CALLS_END)
        return "".join(out)


def _attr(text: str, pos: int) -> tuple[str, int]:
    end = text.find('">', pos)
    if end < 0 or "\n" in text[pos:end]:
        raise ValueError("a name attribute is cut")
    return text[pos:end], end + 2
