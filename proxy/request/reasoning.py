"""Reasoning effort: read every client form, write the one the upstream and model understand.

Clients say "think harder" in a dozen ways (engines.md §2, clients.md §3): a `reasoning_effort`
string, OpenRouter's `reasoning{}`, Anthropic's `thinking{}`, Qwen's `enable_thinking`, Ollama's
`think`, numbers on a 0-100 or 0-1 scale. Each engine reads only some of them, and a template
ignores variables it does not know, so a knob in the wrong dialect silently does nothing.

The rule is minimal change: a form the target already reads is kept (its value only normalized or
clamped to the levels the model accepts); a foreign form is removed and translated into the
target's form. The full rules and thresholds are in docs/request-side.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tapfix.proxy.config.model import DIALECT_LEVELS, ReasoningSettings
from tapfix.proxy.errors import LocalAnswer, request_error
from tapfix.proxy.jsonsplice import Delete, Path, Set, json_path
from tapfix.proxy.request.reasoning_levels import (
    ReasoningResult,
    clamp_level,
    level_from_budget,
    parse_level,
)
from tapfix.proxy.request.reasoning_messages import apply_messages_reasoning
from tapfix.proxy.surfaces import Surface, api_surface

TEMPLATE_VARS = ("enable_thinking", "thinking", "reasoning_effort")
# Level → the generic 0-100 dialect.
LEVEL_PERCENT = {"none": 0, "minimal": 10, "low": 25, "medium": 50, "high": 75, "xhigh": 90, "max": 100}
_KWARG_CONTAINERS = ("chat_template_kwargs", "template_vars")
_EFFORT_DIALECTS = ("vllm", "sglang", "llamacpp", "ollama", "openai")


@dataclass(frozen=True, slots=True)
class Signal:
    """One reasoning form found in the client's body."""

    path: Path  # where the value is
    value: Any
    on: bool | None  # None: the value can't be mapped
    level: str | None = None  # None: only on/off is known
    budget: int | None = None
    drop: Path = ()  # what to remove when the form is foreign; () = `path`


def _parse_budget(value: Any) -> tuple[bool | None, str | None, int | None]:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None, None, None
    tokens = int(value)
    level = level_from_budget(tokens)
    return level != "none", level, max(tokens, 0)


def _sig(path: Path, value: Any, drop: Path = ()) -> Signal:
    """A level-bearing form: a level name, a number or a bool."""
    on, level = parse_level(value)
    return Signal(path, value, on, level, None, drop)


def _switch(path: Path, value: Any, drop: Path = ()) -> Signal:
    """An on/off form: only a bool can be mapped."""
    on = value if isinstance(value, bool) else None
    return Signal(path, value, on, "none" if on is False else None, None, drop)


def detect(body: Mapping[str, Any]) -> list[Signal]:
    """Every reasoning form in the body, in precedence order (explicit template variables first,
    as vLLM and TabbyAPI let them win over a derived value)."""
    found: list[Signal] = []
    for container in _KWARG_CONTAINERS:
        kwargs = body.get(container)
        if isinstance(kwargs, dict):
            for var in TEMPLATE_VARS:
                if var in kwargs:
                    make = _sig if var == "reasoning_effort" else _switch
                    found.append(make((container, var), kwargs[var]))
    if "reasoning_effort" in body:
        found.append(_sig(("reasoning_effort",), body["reasoning_effort"]))
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        whole: Path = ("reasoning",)
        if "effort" in reasoning:
            found.append(_sig(("reasoning", "effort"), reasoning["effort"], whole))
        if "max_tokens" in reasoning:
            on, level, budget = _parse_budget(reasoning["max_tokens"])
            found.append(Signal(("reasoning", "max_tokens"), reasoning["max_tokens"], on, level, budget, whole))
        if "enabled" in reasoning:
            found.append(_switch(("reasoning", "enabled"), reasoning["enabled"], whole))
    elif "reasoning" in body and isinstance(reasoning, str | int | float | bool):
        found.append(_sig(("reasoning",), reasoning))
    output_config = body.get("output_config")
    if isinstance(output_config, dict) and "effort" in output_config:
        found.append(_sig(("output_config", "effort"), output_config["effort"]))
    if "thinking" in body:
        found.append(_thinking_signal(body["thinking"]))
    if "enable_thinking" in body:
        found.append(_switch(("enable_thinking",), body["enable_thinking"]))
    if "think" in body:
        found.append(_sig(("think",), body["think"]))
    return found


def _thinking_signal(value: Any) -> Signal:
    """Anthropic `thinking: {type, budget_tokens}` (Z.ai sends the same shape without a budget)."""
    path: Path = ("thinking",)
    if isinstance(value, bool):
        return Signal(path, value, value, None if value else "none")
    if not isinstance(value, dict):
        return Signal(path, value, None)
    kind = value.get("type")
    if "budget_tokens" in value and kind in (None, "enabled"):
        on, level, budget = _parse_budget(value["budget_tokens"])
        return Signal(path, value, on, level, budget)
    if kind == "disabled":
        return Signal(path, value, False, "none")
    if kind in ("enabled", "adaptive"):
        return Signal(path, value, True, None)
    return Signal(path, value, None)


def _native(dialect: str, surface: Surface, path: Path, settings: ReasoningSettings) -> bool:
    if dialect == "int":
        return path == tuple(settings.field.split("."))
    head = path[0]
    if head in _KWARG_CONTAINERS and len(path) == 2:
        if dialect == "tabbyapi":
            return True
        return head == "chat_template_kwargs" and dialect in ("vllm", "sglang", "llamacpp", "template")
    if dialect == "tabbyapi":
        return path in (("reasoning_effort",), ("enable_thinking",))
    if dialect in _EFFORT_DIALECTS:  # the surface's own field; Ollama also reads Responses' on chat
        return path == api_surface(surface).reasoning_effort or (
            dialect == "ollama" and path == ("reasoning", "effort")
        )
    return False


def apply_reasoning(body: Mapping[str, Any], settings: ReasoningSettings, surface: Surface) -> ReasoningResult:
    """The edits and changes that put the client's reasoning request into the target dialect."""
    result = ReasoningResult()
    dialect = settings.dialect
    if dialect in (None, "passthrough"):
        return result
    api = api_surface(surface)
    if api.typed_content:  # Messages: thinking is asked for with its own block (`thinking`), not an effort
        return apply_messages_reasoning(body, settings, result)
    signals = detect(body)
    accepted = settings.accepted()
    if api.openai_levels_only:
        # Engines validate Responses `reasoning` with OpenAI's type: no `max` level there.
        accepted = tuple(a for a in accepted if a in DIALECT_LEVELS["openai"]) or accepted
    for s in (s for s in signals if s.on is None):
        if settings.reject_unmappable:
            result.error = _error(s, accepted, surface)
            result.add("reject", s.path, s.value, None, f"can't be mapped; answered 400 ({_expected(accepted)})")
            return result
        result.add("warning", s.path, s.value, s.value, f"can't be mapped; passed through ({_expected(accepted)})")
    usable = [s for s in signals if s.on is not None]
    if not usable:
        return result
    on = usable[0].on
    level: str | None = "none"
    budget: int | None = None
    if on:
        level = next((s.level for s in usable if s.on and s.level), None)
        budget = next((s.budget for s in usable if s.on and s.budget is not None), None)
    if level is not None:
        level = clamp_level(level, accepted)
    native_seen = False
    dropped: dict[Path, None] = {}
    for s in usable:
        if not _native(dialect, surface, s.path, settings):
            dropped.setdefault(_drop_path(body, s, usable, dialect, surface, settings), None)
            continue
        native_seen = True
        if isinstance(s.value, bool) and s.path[-1] != "reasoning_effort":
            continue  # an on/off template variable: the engine reads it as sent
        want = _level_value(dialect, clamp_level(s.level, accepted) if s.level else settings.default_level)
        if want != s.value:
            kind = "clamp" if s.level and s.level not in accepted else "override"
            result.add(kind, s.path, s.value, want, f"{dialect} reads {_expected(accepted)}", Set(s.path, want))
    wanted: dict[Path, Any] = {}
    if dropped and not native_seen:
        wanted.update(_primary(dialect, surface, settings, body, on, level))
    if dialect == "llamacpp" and on and "thinking_budget_tokens" not in body:
        chosen = budget if budget is not None else settings.budgets.get(level or "")
        if chosen is not None:
            wanted[("thinking_budget_tokens",)] = chosen
    wanted.update(_template_var(dialect, settings, body, on, level, wanted))
    target = ", ".join(json_path(p) for p in wanted) or "the target's own form"
    for path in dropped:
        reason = f"{dialect} does not read {json_path(path)}; translated to {target}"
        result.add("drop", path, _get(body, path), None, reason, Delete(path))
    why = f"reasoning {'on' if on else 'off'}{f' ({level})' if level else ''} from {json_path(usable[0].path)}"
    for path, value in wanted.items():
        result.add("inject", path, _get(body, path), value, why, Set(path, value))
    return result


def _drop_path(
    body: Mapping[str, Any],
    s: Signal,
    usable: list[Signal],
    dialect: str,
    surface: Surface,
    settings: ReasoningSettings,
) -> Path:
    """The key to remove; a container left empty by the removal goes whole."""
    drop = s.drop or s.path
    if drop == ("reasoning",) and _native(dialect, surface, ("reasoning", "effort"), settings):
        drop = s.path  # keep `reasoning{effort, summary}`, remove only what the target rejects
    if len(drop) == 2:
        container = drop[0]
        foreign = {
            u.path[1]
            for u in usable
            if len(u.path) == 2 and u.path[0] == container and not _native(dialect, surface, u.path, settings)
        }
        if not [k for k in body.get(container, {}) if k not in foreign]:
            return (container,)
    return drop


def _level_value(dialect: str, level: str) -> str | int:
    return LEVEL_PERCENT[level] if dialect == "int" else level


def _container(body: Mapping[str, Any], dialect: str) -> str:
    if dialect == "tabbyapi" and "template_vars" not in body and isinstance(body.get("chat_template_kwargs"), dict):
        return "chat_template_kwargs"  # TabbyAPI's alias: don't send both
    return "template_vars" if dialect == "tabbyapi" else "chat_template_kwargs"


def _primary(
    dialect: str,
    surface: Surface,
    settings: ReasoningSettings,
    body: Mapping[str, Any],
    on: bool | None,
    level: str | None,
) -> dict[Path, Any]:
    """The target's own form, written when the client used only foreign ones."""
    if dialect == "int":
        return {tuple(settings.field.split(".")): _level_value("int", level or settings.default_level)}
    var = settings.template_var or "enable_thinking"
    if dialect in ("tabbyapi", "template"):
        return {(_container(body, dialect), var): _var_value(var, on, level, settings)}
    if level is None and settings.template_var in ("enable_thinking", "thinking"):
        return {}  # on/off only: the configured template variable says it exactly
    accepted = settings.accepted()
    api = api_surface(surface)
    if api.openai_levels_only:
        accepted = tuple(a for a in accepted if a in DIALECT_LEVELS["openai"]) or accepted
    effort = clamp_level(level or settings.default_level, accepted)
    return {api.reasoning_effort: effort}


def _template_var(
    dialect: str,
    settings: ReasoningSettings,
    body: Mapping[str, Any],
    on: bool | None,
    level: str | None,
    wanted: Mapping[Path, Any],
) -> dict[Path, Any]:
    """The model family's template variable, when the engine does not derive it itself."""
    var = settings.template_var
    if var is None or dialect not in ("vllm", "sglang", "llamacpp", "tabbyapi", "template"):
        return {}
    if var == "reasoning_effort" and dialect in ("vllm", "llamacpp"):
        return {}  # these pass the top-level reasoning_effort to the template already
    container = _container(body, dialect)
    kwargs = body.get(container)
    if (isinstance(kwargs, dict) and var in kwargs) or (container, var) in wanted:
        return {}
    return {(container, var): _var_value(var, on, level, settings)}


def _var_value(var: str, on: bool | None, level: str | None, settings: ReasoningSettings) -> bool | str:
    if var == "reasoning_effort":
        return clamp_level(level or settings.default_level, settings.accepted())
    if level is not None:
        return clamp_level(level, settings.accepted()) != "none"
    return bool(on)


def _get(body: Mapping[str, Any], path: Path) -> Any:
    node: Any = body
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    return node


def _expected(accepted: tuple[str, ...]) -> str:
    return f"levels {', '.join(accepted)}, an integer 0-100 or a fraction 0-1"


def _error(s: Signal, accepted: tuple[str, ...], surface: Surface) -> LocalAnswer:
    message = f"reasoning value {s.value!r} at {json_path(s.path)} can't be mapped; expected {_expected(accepted)}"
    return request_error(surface, 400, message, "unsupported_reasoning_value", param=".".join(s.path))
