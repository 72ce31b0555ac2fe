"""Where each engine states its context window, read from its own answers, and where on the engine's server
tapfix asks (`engine_url`, the one rule `tapfix check` and `tapfix run` share).

vLLM and SGLang: `GET /v1/models`, each entry's `max_model_len`; llama.cpp: `GET /props`,
`default_generation_settings.n_ctx` (a slot's window: `-c` divided by `--parallel`); TabbyAPI: `GET /v1/model`,
`parameters.max_seq_len`. Ollama: `GET /api/ps`, a loaded model's `context_length` (the window it runs with);
else `POST /api/show`, the model's `num_ctx` parameter, else `model_info["<arch>.context_length"]` (the model's
own maximum: an upper bound, the server may run it with less). A request's own `options.num_ctx` (Ollama's
native API) is not read: its OpenAI-compatible API, the one agents use, takes none.
A config value (`[models.X] context_window`, `--context-window`) wins over all of them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

Reader = Callable[[Any, str], int | None]


class Probe(NamedTuple):
    """One question to an engine: `GET path`, or `POST path` with `{"model": <served id>}` (Ollama's show)."""

    path: str
    read: Reader
    post: bool = False

    @property
    def label(self) -> str:
        return f"{'POST' if self.post else 'GET'} {self.path}"


def engine_url(base_url: str, path: str) -> str:
    """`path` (`/v1/...`, or a root path such as llama.cpp's `/props`, Ollama's `/api/ps`) on the server of
    `base_url`, which may end in `/v1` (never doubled) or carry a prefix of its own."""
    return base_url.rstrip("/").removesuffix("/v1") + path


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


def ollama_name(model: str) -> str:
    """Ollama's full name of a model: `llama3` is `llama3:latest`."""
    return model if ":" in model.rsplit("/", 1)[-1] else f"{model}:latest"


def from_ollama_ps(obj: Any, model: str) -> int | None:
    """`GET /api/ps`: the loaded model's `context_length`, the window it was loaded with (docs.ollama.com/api/ps)."""
    models = obj.get("models") if isinstance(obj, dict) else None
    for entry in models if isinstance(models, list) else []:
        if isinstance(entry, dict) and ollama_name(model) in (
            ollama_name(str(entry.get("name", ""))),
            ollama_name(str(entry.get("model", ""))),
        ):
            return _positive(entry.get("context_length"))
    return None


_NUM_CTX = re.compile(r"^num_ctx\s+(\d+)\s*$", re.M)


def from_ollama_show(obj: Any, model: str) -> int | None:
    """`POST /api/show`: the model's `num_ctx` parameter (its Modelfile's, the window it is run with), else
    `model_info["<general.architecture>.context_length"]` (docs.ollama.com/api/show)."""
    if not isinstance(obj, dict):
        return None
    parameters = obj.get("parameters")
    if isinstance(parameters, str) and (match := _NUM_CTX.search(parameters)):
        return _positive(int(match.group(1)))
    info = obj.get("model_info")
    if not isinstance(info, dict):
        return None
    arch = info.get("general.architecture")
    return _positive(info.get(f"{arch}.context_length")) if isinstance(arch, str) else None


# engine → the probes to ask, in order; None (quick mode without --engine): vLLM's, the common one.
PROBES: dict[str | None, list[Probe]] = {
    "vllm": [Probe("/v1/models", from_models)],
    "sglang": [Probe("/v1/models", from_models)],
    "llamacpp": [Probe("/props", from_props), Probe("/v1/models", from_models)],
    "tabbyapi": [Probe("/v1/model", from_tabby_model)],
    "ollama": [Probe("/api/ps", from_ollama_ps), Probe("/api/show", from_ollama_show, post=True)],
    None: [Probe("/v1/models", from_models)],
}


def probes_for(engine: str | None) -> list[Probe]:
    return PROBES.get(engine, [])
