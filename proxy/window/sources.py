"""Where each engine states its context window, read from its own answers.

vLLM and SGLang: `GET /v1/models`, each entry's `max_model_len`; llama.cpp: `GET /props`,
`default_generation_settings.n_ctx` (a slot's window: `-c` divided by `--parallel`); TabbyAPI: `GET /v1/model`,
`parameters.max_seq_len`. Ollama's depends on the request's `num_ctx` and is not read here.
A config value (`[models.X] context_window`, `--context-window`) wins over all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Reader = Callable[[Any, str], int | None]


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def from_models(obj: Any, model: str) -> int | None:
    """`max_model_len` of the served model's entry (or of the only entry) in a `/v1/models` list."""
    data = obj.get("data") if isinstance(obj, dict) else None
    entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
    chosen = [e for e in entries if e.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in chosen:
        meta = entry.get("meta")
        found = _positive(entry.get("max_model_len")) or (
            _positive(meta.get("n_ctx")) if isinstance(meta, dict) else None
        )
        if found:
            return found
    return None


def from_props(obj: Any, model: str) -> int | None:
    settings = obj.get("default_generation_settings") if isinstance(obj, dict) else None
    return _positive(settings.get("n_ctx")) if isinstance(settings, dict) else None


def from_tabby_model(obj: Any, model: str) -> int | None:
    parameters = obj.get("parameters") if isinstance(obj, dict) else None
    return _positive(parameters.get("max_seq_len")) if isinstance(parameters, dict) else None


# engine → the (path, reader) to ask, in order; None (quick mode without --engine): vLLM's, the common one.
PROBES: dict[str | None, list[tuple[str, Reader]]] = {
    "vllm": [("/v1/models", from_models)],
    "sglang": [("/v1/models", from_models)],
    "llamacpp": [("/props", from_props), ("/v1/models", from_models)],
    "tabbyapi": [("/v1/model", from_tabby_model)],
    None: [("/v1/models", from_models)],
}


def probes_for(engine: str | None) -> list[tuple[str, Reader]]:
    return PROBES.get(engine, [])
