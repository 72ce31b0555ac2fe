"""InternLM2 / 2.5 / 3: `<|action_start|><|plugin|>\n{"name": ..., "parameters": {...}}<|action_end|>`.

One call per action block (vLLM's internlm2 parser reads one; the model writes a block per call, back to
back). InternLM's own protocol names the arguments `parameters`; vLLM's example template writes
`arguments`, as a Python literal when the arguments are a dict: both are read.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.tagged import TaggedJson


def _parameters(name: str, args: dict[str, Any]) -> Any:
    return {"name": name, "parameters": args}


INTERNLM = TaggedJson(
    "internlm",
    "InternLM2, InternLM2.5, InternLM3",
    "<|action_start|><|plugin|>",
    "<|action_end|>",
    block="{opener}\n{call}{closer}",
    as_json=_parameters,
)
