"""What a `[models.NAME]` table sets beyond names and routes: a sampling policy per parameter and the
reasoning settings, with the words they are written in (levels, dialects, the engine → dialect default).

Value types only: `request/` applies them to requests (sampling.py, reasoning*.py), the config file
(`file.py`) builds them, and neither needs the other's code for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as _field  # ReasoningSettings has a field named `field`
from typing import Literal

# The reasoning-effort scale every dialect is mapped onto.
LEVELS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
DIALECTS = ("vllm", "sglang", "llamacpp", "ollama", "tabbyapi", "openai", "int", "template", "passthrough")
# The dialect an upstream's engine reads unless its model says otherwise.
ENGINE_DIALECT = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "ollama": "ollama",
    "tabbyapi": "tabbyapi",
    "openai": "openai",
    "anthropic": "passthrough",
}
# The engines quick mode (`--upstream`) knows how to talk to: reasoning dialect and sampling parameters.
QUICK_ENGINES = ("vllm", "sglang", "llamacpp", "ollama", "tabbyapi", "openai")
DIALECT_LEVELS: dict[str, tuple[str, ...]] = {
    "ollama": ("none", "low", "medium", "high"),
    "openai": ("none", "minimal", "low", "medium", "high", "xhigh"),
}

# fill what the client omitted, override what it sent, clamp into [min, max], or drop the parameter.
SamplingMode = Literal["fill", "override", "clamp", "drop"]


@dataclass(frozen=True, slots=True)
class ParamPolicy:
    mode: SamplingMode = "fill"
    value: float | int | None = None
    min: float | int | None = None
    max: float | int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ReasoningSettings:
    dialect: str | None = None  # None: pass every reasoning field through untouched
    levels: tuple[str, ...] | None = None  # levels the model accepts; None = the dialect's own
    template_var: str | None = None  # the chat-template variable the model family reads
    field: str = "reasoning_effort"  # the field of the `int` dialect (dotted for nested)
    reject_unmappable: bool = False
    default_level: str = "medium"  # for "thinking on" without a level, where a level is needed
    budgets: Mapping[str, int] = _field(default_factory=dict)  # level → thinking_budget_tokens (llama.cpp)

    def accepted(self) -> tuple[str, ...]:
        return self.levels or DIALECT_LEVELS.get(self.dialect or "", LEVELS)
