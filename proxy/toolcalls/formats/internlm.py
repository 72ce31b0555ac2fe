"""InternLM2 / 2.5 / 3: `<|action_start|><|plugin|>\n{"name": ..., "parameters": {...}}<|action_end|>`.

One call per action block (vLLM's internlm2 parser reads one; the model writes a block per call, back to
back). InternLM's own protocol names the arguments `parameters`; vLLM's example template writes
`arguments`, as a Python literal when the arguments are a dict: both are read.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, dumps, json_blocks

OPEN, CLOSE = "<|action_start|><|plugin|>", "<|action_end|>"


class InternLM(ToolFormat):
    name = "internlm"
    family = "InternLM2, InternLM2.5, InternLM3"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        return json_blocks(text, at, OPEN, CLOSE)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(f"{OPEN}\n{dumps({'name': n, 'parameters': a})}{CLOSE}" for n, a in calls)
