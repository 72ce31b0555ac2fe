"""Sampling defaults: fill what the client omitted, override, clamp or drop, per model and parameter.

Agents mostly send no sampling parameters (clients.md §1), so the server's defaults decide, and
several servers ignore the model card: Ollama `/v1` forces temperature/top_p 1.0, TabbyAPI uses its
preset, llama.cpp its own constants unless the GGUF carries them (engines.md §3). The model's
`generation_config.json`, or explicit values in the config, are written into the request instead.

Modes: `fill` (default) sets a value only when the client omitted it, and keeps a sent value within
`min`/`max` when those are given; `override` always sets it; `clamp` only keeps a sent value within
bounds; `drop` removes it. Only parameters the engine and the endpoint accept are ever added.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.config.model import ParamPolicy
from tapfix.proxy.jsonsplice import Delete, Edit, Set, json_path
from tapfix.proxy.surfaces import Surface, api_surface

PARAMS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_tokens",
)
MODES = ("fill", "override", "clamp", "drop")
ENGINES = ("vllm", "sglang", "llamacpp", "ollama", "tabbyapi", "openai", "anthropic")
# Any of these means the client chose a length limit: none is added then (they are one parameter).
MAX_TOKEN_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
SAMPLING_SIGNALS = ("temperature", "top_p", "top_k", "min_p")

# What the engines read from generation_config.json (vLLM get_diff_sampling_param, SGLang
# --sampling-defaults model). Presence/frequency penalties are never read from it.
_GENERATION_CONFIG_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}

_ALL = frozenset(PARAMS)
_OPENAI = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty", "max_tokens"})
# Parameters each engine's OpenAI-compatible routes accept; None = unknown engine (quick mode).
ENGINE_PARAMS: dict[str | None, frozenset[str]] = {
    None: _ALL,
    "vllm": _ALL,
    "sglang": _ALL,
    "tabbyapi": _ALL,
    "llamacpp": _ALL,  # repetition_penalty is spelled repeat_penalty there
    "ollama": _OPENAI,  # /v1 ignores top_k, min_p and repeat penalties
    "openai": _OPENAI,
    "anthropic": frozenset({"temperature", "top_p", "top_k", "max_tokens"}),
}


def wire_name(param: str, engine: str | None, surface: Surface) -> str:
    """The body key a parameter is written under for this engine and endpoint."""
    if param == "repetition_penalty" and engine == "llamacpp":
        return "repeat_penalty"  # llama-server reads only repeat_penalty (server params_from_json)
    if param == "max_tokens":
        return api_surface(surface).max_tokens_field(engine)
    return param


class GenerationConfigError(ValueError):
    pass


def generation_config_file(path: str | Path) -> Path:
    """Accept the model folder or the file itself."""
    p = Path(path).expanduser()
    return p / "generation_config.json" if p.is_dir() else p


def load_generation_config(path: str | Path) -> tuple[dict[str, float | int], str]:
    """Sampling values from a `generation_config.json` and the reason label for changes."""
    file = generation_config_file(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise GenerationConfigError(f"{file}: cannot read generation_config ({e.strerror or e})") from e
    except ValueError as e:
        raise GenerationConfigError(f"{file}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise GenerationConfigError(f"{file}: expected a JSON object, found {type(data).__name__}")
    values: dict[str, float | int] = {}
    for key, param in _GENERATION_CONFIG_KEYS.items():
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[param] = value
    label = f"generation_config.json of {file.parent.name or file.parent}"
    return values, label


@dataclass(frozen=True, slots=True)
class SamplingPolicy:
    """The merged policy of one model: explicit config entries first, then generation_config."""

    params: Mapping[str, ParamPolicy] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        configured: Mapping[str, ParamPolicy],
        generation: Mapping[str, float | int] | None = None,
        generation_label: str = "generation_config.json",
    ) -> SamplingPolicy:
        merged: dict[str, ParamPolicy] = {}
        generation = generation or {}
        for param in PARAMS:
            policy = configured.get(param)
            if policy is None:
                if param in generation:
                    merged[param] = ParamPolicy("fill", generation[param], reason=generation_label)
                continue
            if policy.value is None and policy.mode in ("fill", "override") and param in generation:
                policy = ParamPolicy(policy.mode, generation[param], policy.min, policy.max, generation_label)
            merged[param] = policy
        return cls(merged)

    def __bool__(self) -> bool:
        return bool(self.params)


def apply_sampling(
    body: Mapping[str, Any], policy: SamplingPolicy, surface: Surface, engine: str | None
) -> tuple[list[Edit], list[Change]]:
    """The edits (for `jsonsplice.splice`) and changes that bring `body` in line with `policy`."""
    edits: list[Edit] = []
    changes: list[Change] = []
    accepted = ENGINE_PARAMS.get(engine, _ALL) & api_surface(surface).sampling_params
    if engine == "llamacpp":
        _rename_repetition_penalty(body, edits, changes)
    for param, rule in policy.params.items():
        keys = _present_keys(body, param)
        if rule.mode == "drop":
            for key in keys:
                edits.append(Delete((key,)))
                changes.append(Change("sampling", "drop", json_path((key,)), body[key], None, rule.reason))
            continue
        if rule.mode == "override" and rule.value is not None and param in accepted:
            value = _engine_value(param, rule.value, engine)
            if value is None:
                continue
            for key in keys or [wire_name(param, engine, surface)]:
                before = body.get(key)
                if before != value:
                    edits.append(Set((key,), value))
                    kind = "override" if key in body and before is not None else "inject"
                    changes.append(Change("sampling", kind, json_path((key,)), before, value, rule.reason))
            continue
        if keys:
            if rule.min is not None or rule.max is not None:
                for key in keys:
                    before = body[key]
                    after = _clamp(before, rule.min, rule.max)
                    if after is not None:
                        edits.append(Set((key,), after))
                        reason = f"{rule.reason}: within [{_bound(rule.min)}, {_bound(rule.max)}]"
                        changes.append(Change("sampling", "clamp", json_path((key,)), before, after, reason))
            continue
        if rule.mode == "fill" and rule.value is not None and param in accepted:
            value = _engine_value(param, rule.value, engine)
            if value is None:
                continue
            key = wire_name(param, engine, surface)
            edits.append(Set((key,), value))
            changes.append(Change("sampling", "inject", json_path((key,)), body.get(key), value, rule.reason))
    return edits, changes


def sent_sampling(body: Mapping[str, Any]) -> bool:
    """Whether the client chose any of temperature/top_p/top_k/min_p (else the defaults decide)."""
    return any(body.get(key) is not None for key in SAMPLING_SIGNALS)


def _present_keys(body: Mapping[str, Any], param: str) -> list[str]:
    if param == "max_tokens":
        names: tuple[str, ...] = MAX_TOKEN_KEYS
    elif param == "repetition_penalty":
        names = ("repetition_penalty", "repeat_penalty")
    else:
        names = (param,)
    return [k for k in names if body.get(k) is not None]


def _rename_repetition_penalty(body: Mapping[str, Any], edits: list[Edit], changes: list[Change]) -> None:
    if body.get("repetition_penalty") is not None and "repeat_penalty" not in body:
        value = body["repetition_penalty"]
        edits += [Delete(("repetition_penalty",)), Set(("repeat_penalty",), value)]
        changes.append(
            Change(
                "sampling",
                "rename",
                "$.repetition_penalty",
                "repetition_penalty",
                "repeat_penalty",
                "llama.cpp reads repeat_penalty and ignores repetition_penalty",
            )
        )


def _engine_value(param: str, value: float | int, engine: str | None) -> float | int | None:
    """top_k <= 0 means "off", spelled -1 by vLLM/SGLang (SGLang rejects 0) and 0 by llama.cpp/TabbyAPI."""
    if param == "top_k" and value <= 0:
        if engine in ("llamacpp", "tabbyapi"):
            return 0
        if engine in ("openai", "anthropic", "ollama"):
            return None
        return -1
    return value


def _clamp(value: Any, low: float | int | None, high: float | int | None) -> float | int | None:
    """The bound a sent number must move to, or None when it is already inside (or not a number)."""
    if not _is_number(value):
        return None
    if low is not None and value < low:
        return low
    if high is not None and value > high:
        return high
    return None


def _bound(value: float | int | None) -> str:
    return "-" if value is None else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
