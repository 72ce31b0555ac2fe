"""Reasoning on the Anthropic Messages surface (`/v1/messages`): what local engines accept there.

Claude Code and omp send Anthropic's forms: `thinking: {type: "enabled", budget_tokens}` (the
budget must be ≥ 1024 and < `max_tokens`), or, for newer models, `thinking: {type: "adaptive"}`
plus `output_config.effort`. vLLM, SGLang and llama.cpp serve `/v1/messages` and read `thinking`
with a budget; none knows "adaptive". So, with a dialect configured:

- `adaptive` becomes `enabled` with a budget from the effort level (the model's `budgets` table,
  else the clients' own: minimal 1024, low 2048, medium 8192, high 16384, xhigh 24576, max 32768);
- a budget is moved into [1024, max_tokens − 1] (a `max_tokens` ≤ 1024 can't hold one: warning);
- `output_config.effort` is kept (vLLM reads it) but clamped to the levels it validates
  (low … max; "minimal" → low, "none" removes the key);
- the model family's template variable (`template_var`) is set in `chat_template_kwargs`, which
  vLLM's `/v1/messages` passes to the template, unless the client set it.

Nothing else on this surface is rewritten; the full table is in docs/surfaces.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tapfix.proxy.config.model import LEVELS, ReasoningSettings
from tapfix.proxy.jsonsplice import Delete, Set
from tapfix.proxy.request.reasoning_levels import (
    ReasoningResult,
    clamp_level,
    level_from_budget,
    parse_level,
)

MIN_BUDGET = 1024
LEVEL_BUDGET = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384, "xhigh": 24576, "max": 32768}
# What vLLM's AnthropicOutputConfig validates (`Literal["low", "medium", "high", "xhigh", "max"]`).
OUTPUT_EFFORTS = ("low", "medium", "high", "xhigh", "max")
_TEMPLATE_DIALECTS = ("vllm", "sglang", "llamacpp", "template")


def apply_messages_reasoning(
    body: Mapping[str, Any], settings: ReasoningSettings, result: ReasoningResult
) -> ReasoningResult:
    thinking = body.get("thinking")
    output_config = body.get("output_config")
    effort = output_config.get("effort") if isinstance(output_config, dict) else None
    max_tokens = body.get("max_tokens")
    max_tokens = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None
    on, level = parse_level(effort) if effort is not None else (None, None)
    if isinstance(thinking, dict) and thinking.get("type") == "adaptive":
        chosen = level if level not in (None, "none") else settings.default_level
        budget = settings.budgets.get(chosen) or LEVEL_BUDGET.get(chosen, LEVEL_BUDGET["medium"])
        new = {**thinking, "type": "enabled", "budget_tokens": _bounded(budget, max_tokens)}
        result.add(
            "override",
            ("thinking",),
            thinking,
            new,
            f"{settings.dialect} /v1/messages reads thinking{{type: enabled, budget_tokens}}, not "
            f"adaptive; budget from effort {chosen}",
            Set(("thinking",), new),
        )
        thinking = new
    elif isinstance(thinking, dict) and thinking.get("type", "enabled") == "enabled":
        sent = thinking.get("budget_tokens")
        if isinstance(sent, int) and not isinstance(sent, bool):
            if max_tokens is not None and max_tokens <= MIN_BUDGET:
                result.add(
                    "warning",
                    ("thinking", "budget_tokens"),
                    sent,
                    sent,
                    f"max_tokens {max_tokens} leaves no room for a budget >= {MIN_BUDGET}; unchanged",
                )
            elif (bounded := _bounded(sent, max_tokens)) != sent:
                result.add(
                    "clamp",
                    ("thinking", "budget_tokens"),
                    sent,
                    bounded,
                    f"budget_tokens must be >= {MIN_BUDGET} and < max_tokens ({max_tokens})",
                    Set(("thinking", "budget_tokens"), bounded),
                )
    if effort is not None and settings.dialect == "vllm":
        _clamp_effort(effort, level, output_config, result)
    _template_var(body, settings, thinking, level, result)
    return result


def _bounded(budget: int, max_tokens: int | None) -> int:
    value = max(MIN_BUDGET, budget)
    if max_tokens is not None and max_tokens > MIN_BUDGET:
        value = min(value, max_tokens - 1)
    return value


def _clamp_effort(effort: Any, level: str | None, output_config: Any, result: ReasoningResult) -> None:
    path = ("output_config", "effort")
    if level is None or effort in OUTPUT_EFFORTS:
        return
    if level == "none":
        drop = ("output_config",) if isinstance(output_config, dict) and len(output_config) == 1 else path
        result.add("drop", drop, effort, None, "vLLM's output_config.effort has no 'none'", Delete(drop))
        return
    want = clamp_level(level, OUTPUT_EFFORTS)
    result.add(
        "clamp", path, effort, want, f"vLLM reads output_config.effort {', '.join(OUTPUT_EFFORTS)}", Set(path, want)
    )


def _template_var(
    body: Mapping[str, Any],
    settings: ReasoningSettings,
    thinking: Any,
    level: str | None,
    result: ReasoningResult,
) -> None:
    var = settings.template_var
    if var is None or settings.dialect not in _TEMPLATE_DIALECTS:
        return
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and var in kwargs:
        return
    if isinstance(thinking, dict):
        on = thinking.get("type") != "disabled"
    elif level is not None:
        on = level != "none"
    else:
        return
    if var == "reasoning_effort":
        if not on:
            value: Any = "none"
        else:
            budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
            value = clamp_level(level or _level_of(budget) or settings.default_level, settings.accepted())
    else:
        value = on
    path = ("chat_template_kwargs", var)
    result.add(
        "inject", path, None, value, f"thinking {'on' if on else 'off'} for the model's template", Set(path, value)
    )


def _level_of(budget: Any) -> str | None:
    if isinstance(budget, int) and not isinstance(budget, bool):
        level = level_from_budget(budget)
        return level if level in LEVELS else None
    return None
