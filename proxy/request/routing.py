"""Model routing: the client's model name (or alias) → (upstream, served id), and preflight checks.

In config mode an unknown model is a clear 404 that lists what is served: silently sending a
request to another model would make every later capture misleading. In quick mode every name
passes through to the single upstream.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.config.file import Config, ModelConfig, Upstream
from tapfix.proxy.config.routes import glob_match, is_glob
from tapfix.proxy.errors import LocalAnswer, request_error
from tapfix.proxy.request.sampling import GenerationConfigError, load_generation_config
from tapfix.proxy.surfaces import Surface


@dataclass(frozen=True, slots=True)
class Route:
    model: str | None  # as the client sent it
    served_model: str | None  # what the upstream is asked for
    upstream: Upstream | None  # None in quick mode: the single upstream
    settings: ModelConfig | None  # the model's policy

    def change(self) -> Change | None:
        """The rewrite of `model`, if the served id differs from the client's name."""
        if self.model is None or self.served_model == self.model:
            return None
        via = f" on upstream {self.upstream.name}" if self.upstream else ""
        return Change("router", "rename", "$.model", self.model, self.served_model, f"served id{via}")


@dataclass(frozen=True, slots=True)
class RouteError:
    """A model tapfix can't route: a 400 (no usable name) or a 404 (not served), answered in the
    request's surface's shape (`answer`)."""

    status: int
    message: str
    code: str

    def answer(self, surface: Surface | None) -> LocalAnswer:
        return request_error(surface, self.status, self.message, self.code, param="model")


@dataclass(frozen=True, slots=True)
class Problem:
    severity: str  # "error" | "warning"
    where: str  # e.g. "upstreams.gpu0.api_key_env" or "models.qwen"
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.where}: {self.message}"


def resolve(config: Config, model: Any) -> Route | RouteError:
    if config.quick_model is not None:
        name = model if isinstance(model, str) else None
        return Route(name, name, None, config.quick_model)
    if not isinstance(model, str) or not model:
        found = "no 'model'" if model is None else f"'model' = {json.dumps(model)[:80]}"
        return _error(
            400,
            f"request has {found}; expected the name of a served model; {_served(config)}",
            "missing_model" if model is None else "invalid_model",
        )
    settings = public_model(config, model)
    if settings is None:
        return _error(404, f"model '{model}' is not served here; {_served(config)}", "model_not_found")
    served = settings.upstream_model
    if is_glob(settings.name) and served == settings.name:
        served = model  # `[models."claude-haiku-*"]` without upstream_model: the name asked for
    return Route(model, served, config.upstreams[settings.upstream], settings)


def public_model(config: Config, model: str) -> ModelConfig | None:
    """The `[models.X]` table a name asks for: an exact name, then an alias, then the first public name
    that is a glob pattern (`[models."claude-haiku-*"]`, issue 38) matching it, in the file's order."""
    settings = config.models.get(model)
    if settings is not None and not is_glob(model):
        return settings
    target = config.aliases().get(model)
    if target is not None:
        return config.models[target]
    return next((m for m in config.models.values() if is_glob(m.name) and glob_match(m.name, model)), None)


def _served(config: Config) -> str:
    text = "served models: " + ", ".join(config.models)
    aliases = config.aliases()
    if aliases:
        text += " (aliases: " + ", ".join(f"{a} → {m}" for a, m in aliases.items()) + ")"
    return text


def _error(status: int, message: str, code: str) -> RouteError:
    return RouteError(status, message, code)


def models_listing(config: Config, windows: Mapping[tuple[str, str], int] | None = None) -> dict[str, Any]:
    """The body of `GET /v1/models`: every served model and alias (empty in quick mode), with its context
    window where it is known (`context_length`, OpenRouter's name, and `max_model_len`, vLLM's): the
    config's `context_window`, else what the engine reported (`windows`, by (upstream, served model)).
    A glob name (`claude-haiku-*`) is a pattern for names clients already send, not an id one could pick:
    it isn't listed (a client that lists models to offer them would offer the pattern itself)."""
    data = []
    for m in config.models.values():
        if is_glob(m.name):
            continue
        entry: dict[str, Any] = {
            "id": m.name,
            "object": "model",
            "created": 0,
            "owned_by": m.upstream,
            "root": m.upstream_model,
        }
        window = m.context_window or (windows or {}).get((m.upstream, m.upstream_model))
        if window:
            entry["context_length"] = entry["max_model_len"] = window
        data.append(entry)
        for alias in m.aliases:
            data.append({**entry, "id": alias, "parent": m.name})
    return {"object": "list", "data": data}


def preflight_static(config: Config, environ: Mapping[str, str]) -> list[Problem]:
    """What can be checked without the network: credentials, files, unused upstreams."""
    problems: list[Problem] = []
    for u in config.upstreams.values():
        where = f"upstreams.{u.name}"
        if u.api_key_env and not environ.get(u.api_key_env):
            state = "is empty" if u.api_key_env in environ else "is not set"
            problems.append(Problem("error", f"{where}.api_key_env", f"environment variable {u.api_key_env} {state}"))
        if u.ca_file and not _readable(u.ca_file):
            problems.append(Problem("error", f"{where}.ca_file", f"cannot read {u.ca_file}"))
        if u.insecure:
            problems.append(Problem("warning", f"{where}.insecure", "TLS certificates are not verified"))
        if u.read_timeout is not None:  # accepted since the first config, never read: say so instead of ignoring it
            problems.append(
                Problem(
                    "warning",
                    f"{where}.read_timeout",
                    "has no effect: tapfix never cuts an upstream's pace (head_timeout bounds the wait for a "
                    "routed model's response head)",
                )
            )
        used = {m.upstream for m in config.models.values()} | {
            name for m in config.models.values() for r in m.routes for name in r.upstreams
        }
        if not config.is_quick and u.name not in used:
            problems.append(Problem("warning", where, "no model is routed to this upstream"))
    models = list(config.models.values()) + ([config.quick_model] if config.quick_model else [])
    for m in models:
        where = f"models.{m.name}" if m.name != "*" else "--generation-config"
        if m.generation_config is not None:
            try:
                load_generation_config(m.generation_config)
            except GenerationConfigError as e:
                problems.append(Problem("error", f"{where}.generation_config", str(e)))
        for param, rule in m.sampling.items():
            if rule.mode in ("fill", "override") and rule.value is None and m.generation_config is None:
                problems.append(
                    Problem(
                        "warning",
                        f"{where}.sampling.{param}",
                        f"mode {rule.mode} has no value and the model has no generation_config",
                    )
                )
    return problems


def compare_served(config: Config, upstream_name: str, served_ids: Iterable[str]) -> list[Problem]:
    """Configured ids the upstream does not list in its `/v1/models`."""
    if upstream_name not in config.upstreams:
        return [Problem("error", f"upstreams.{upstream_name}", "no such upstream in the config")]
    served = list(served_ids)
    problems = []
    for m in config.models.values():
        if m.upstream != upstream_name or m.upstream_model in served:
            continue
        if is_glob(m.name) and m.upstream_model == m.name:
            continue  # a glob name that passes the asked name on: no one id to look for
        close = difflib.get_close_matches(m.upstream_model, served, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        listing = ", ".join(served) or "nothing"
        problems.append(
            Problem(
                "error",
                f"models.{m.name}.upstream_model",
                f"upstream {upstream_name} does not serve {m.upstream_model!r}; it serves: {listing}{hint}",
            )
        )
    return problems


def _readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False
