"""InternLM2 / 2.5 / 3: `<|action_start|><|plugin|>\n{"name": ..., "parameters": {...}}<|action_end|>`.

One call per action block (vLLM's internlm2 parser reads one; the model writes a block per call, back to
back). InternLM's own protocol names the arguments `parameters`; vLLM's example template writes
`arguments`, as a Python literal when the arguments are a dict: both are read.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_value, named_call, skip_ws

OPEN, CLOSE = "<|action_start|><|plugin|>", "<|action_end|>"


class InternLM(ToolFormat):
    name = "internlm"
    family = "InternLM2, InternLM2.5, InternLM3"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        calls = []
        pos = end = at
        while text.startswith(OPEN, pos):
            value, pos = json_value(text, pos + len(OPEN))
            calls.append(named_call(value))
            pos = skip_ws(text, pos)
            if not text.startswith(CLOSE, pos):
                return Markup(at, len(text), calls, closed=False) if CLOSE.startswith(text[pos:]) else None
            end = pos + len(CLOSE)
            pos = skip_ws(text, end)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(f"{OPEN}\n{dumps({'name': n, 'parameters': a})}{CLOSE}" for n, a in calls)
