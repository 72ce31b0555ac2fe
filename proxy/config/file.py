"""The TOML configuration: upstreams, the models served through them, and per-model policy.

Validated with the JSON Schema in `schemas/config.schema.json` (config/shape.py), then with the checks
a schema can't express (references between tables, alias clashes, bounds), all reported at once. Every
error names the file, the path inside it, what was found and what was expected, so a user can fix it
without reading code.
Credentials are never written in the file: an upstream names the environment variable that holds
its key (`api_key_env`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tapfix.proxy.config.model import ENGINE_DIALECT, ParamPolicy, ReasoningSettings
from tapfix.proxy.config.routes import RouteRule, parse_routes
from tapfix.proxy.config.settings import declared
from tapfix.proxy.config.shape import key_name, shape_problems
from tapfix.proxy.vocabulary.store_url import is_postgres_url, url_like_problem

# Values config.schema.json allows (the file is validated before these are read).
KeyStyle = Literal["openai", "anthropic"]  # how the key is sent: Authorization: Bearer, or x-api-key
FieldChoice = Literal["keep", "reasoning", "reasoning_content"]  # "keep" = as the upstream sent it


class ConfigError(Exception):
    """A configuration that can't be used; `str(e)` is the message for the user, one line per problem."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    base_url: str
    engine: str | None = None
    api_key_env: str | None = None
    style: KeyStyle = "openai"
    ca_file: str | None = None
    insecure: bool = False
    connect_timeout: float | None = None
    read_timeout: float | None = None
    head_timeout: float | None = None  # issue 38: no response head in this long: a routed request's next route
    regenerate_concurrency: int | None = None  # issue 19: None: the declared default (config/settings.py)
    regenerate_per_minute: int | None = None
    supports: tuple[str, ...] | None = None  # issue 38: what its models can take; None: everything
    slots: int | None = None  # issue 38: llama-server's -np; each thread pinned to one with `id_slot`
    reserve_main_slot: bool = False  # a slot kept for each session's main agent thread

    def auth_headers(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The upstream's own credential (from the environment variable the config names), as it expects it."""
        key = environ.get(self.api_key_env) if self.api_key_env else None
        if not key:
            return {}
        return {"x-api-key": key} if self.style == "anthropic" else {"authorization": f"Bearer {key}"}


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    upstream: str
    upstream_model: str
    aliases: tuple[str, ...] = ()
    sampling: Mapping[str, ParamPolicy] = field(default_factory=dict)
    generation_config: Path | None = None
    reasoning: ReasoningSettings = field(default_factory=ReasoningSettings)
    store_bodies: bool = True  # privacy: false = metadata only for this model's exchanges
    tool_format: str | None = None  # the pinned tool-call format (toolcalls/formats); None: every one
    regenerate: int | None = None  # issue 19: this model's extra attempts; None: the global setting
    regenerate_unknown_tool: bool | None = None
    context_window: int | None = None  # issue 37: wins over the window the engine reports
    keep_billing_line: bool = False  # issue 36: forward Claude Code's billing block even to a local engine
    replay_reasoning: bool = False  # issue 36: recorded reasoning back into resent assistant turns
    replay_reasoning_as: str | None = None  # "field" | "think"; None: the engine's field
    routes: tuple[RouteRule, ...] = ()  # issue 38: tried in order before `upstream` (config/routes.py)
    supports: tuple[str, ...] | None = None  # issue 38: wins over its upstream's `supports`
    dialect_from_engine: bool = False  # the reasoning dialect is its upstream's engine's: a route's engine's instead


@dataclass(frozen=True, slots=True)
class ReasoningFieldPolicy:
    """Which reasoning field each client gets in responses; "keep" = as the upstream sent it."""

    default: FieldChoice = "keep"
    clients: Mapping[str, FieldChoice] = field(default_factory=dict)

    def for_user_agent(self, user_agent: str | None) -> FieldChoice | None:
        """The field to emit for this client, or None to leave responses as they are."""
        ua = (user_agent or "").lower()
        for needle, choice in self.clients.items():
            if needle.lower() in ua:
                return None if choice == "keep" else choice
        return None if self.default == "keep" else self.default


@dataclass(frozen=True, slots=True)
class Config:
    upstreams: Mapping[str, Upstream]
    models: Mapping[str, ModelConfig] = field(default_factory=dict)
    # The run settings the file gives (config/settings.py declares their keys), by `Settings` attribute,
    # as the file wrote them (`db` resolved against the file's folder); a flag given to `tapfix run` wins.
    run_settings: Mapping[str, Any] = field(default_factory=dict)
    strict: bool = False
    reasoning_field: ReasoningFieldPolicy = field(default_factory=ReasoningFieldPolicy)
    probe: Mapping[str, Any] = field(default_factory=dict)
    security: Mapping[str, Any] = field(default_factory=dict)
    retention: Mapping[str, Any] = field(default_factory=dict)
    source: str | None = None  # the file it came from
    quick_model: ModelConfig | None = None  # quick mode: the policy every model name gets

    @property
    def is_quick(self) -> bool:
        return self.quick_model is not None

    def aliases(self) -> dict[str, str]:
        """alias → public model name."""
        return {alias: m.name for m in self.models.values() for alias in m.aliases}

    @classmethod
    def quick(
        cls,
        upstream_url: str,
        engine: str | None = None,
        generation_config: str | Path | None = None,
        reasoning_dialect: str | None = None,
        upstream_key_env: str | None = None,
        keep_billing_line: bool = False,
        replay_reasoning: bool = False,
        replay_reasoning_as: str | None = None,
    ) -> Config:
        """Quick mode (`tapfix run --upstream URL ...`): one upstream, every model name passes through."""
        data: dict[str, Any] = {"base_url": upstream_url, "engine": engine or "openai"}
        if upstream_key_env:
            data["api_key_env"] = upstream_key_env
        flags: dict[str, Any] = {}
        if generation_config is not None:
            flags["generation_config"] = str(generation_config)
        if reasoning_dialect is not None:
            flags["reasoning"] = {"dialect": reasoning_dialect}
        checked = {"upstreams": {"default": data}, "models": {"*": flags}}
        validate(checked, "command line")
        upstream = _upstream("default", data)
        if engine is None:
            upstream = Upstream("default", upstream.base_url, None, upstream.api_key_env)
        dialect = reasoning_dialect or ENGINE_DIALECT.get(engine or "")
        model = ModelConfig(
            name="*",
            upstream="default",
            upstream_model="*",
            generation_config=Path(generation_config).expanduser() if generation_config is not None else None,
            reasoning=ReasoningSettings(dialect=dialect),
            keep_billing_line=keep_billing_line,
            replay_reasoning=replay_reasoning,
            replay_reasoning_as=replay_reasoning_as,
        )
        return cls(upstreams={"default": upstream}, quick_model=model)

    @classmethod
    def load(cls, path: str | Path) -> Config:
        return load(path)


def load(path: str | Path) -> Config:
    """The config in `path`. A UTF-8 byte-order mark (Windows editors write one) is read past: TOML has no
    use for it, and tomllib would refuse the first line for it."""
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8-sig"))
    except OSError as e:
        raise ConfigError(f"{file}: cannot read the config file ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"{file}: not UTF-8 text ({e})") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{file}: not valid TOML: {e}") from e
    return from_dict(data, source=str(file), base_dir=file.parent)


def from_dict(data: Mapping[str, Any], source: str = "<config>", base_dir: Path | None = None) -> Config:
    """Validate a parsed config and build it; relative paths resolve against `base_dir`.

    Every problem is reported at once: the schema's, then the checks it can't express (references
    between tables, alias clashes, bounds, numbers that must be finite). The latter run on every part
    the schema let through, so one mistake never hides another; a part the schema refused is left to
    its message."""
    problems = shape_problems(data, source)
    shaped = not problems  # the schema passed: every part has the shape the code below reads
    base = base_dir or Path(".")
    upstreams: dict[str, Upstream] = {}
    for name, u in _tables(data.get("upstreams")):
        with _unless_shaped(shaped):
            upstreams[name] = _upstream(name, u)
            problems += slot_problems(source, upstreams[name])
    names = [name for name, _ in _tables(data.get("upstreams"), everything=True)]
    models: dict[str, ModelConfig] = {}
    claimed: dict[str, str] = {}  # every routable name → where it was declared
    for name, m in _tables(data.get("models")):
        with _unless_shaped(shaped):
            model = _model(name, m, source, names, upstreams, claimed, base, data, problems)
            if model is not None:
                models[name] = model
    if isinstance(db := data.get("db"), str) and (why := url_like_problem(db)) is not None:
        problems.append(f"{source}: db: {why}")
    if problems:
        raise ConfigError("\n".join(problems), problems)
    rf = data.get("reasoning_field", {})
    return Config(
        upstreams=upstreams,
        models=models,
        run_settings=run_settings(data, base),
        strict=data.get("strict", False),
        reasoning_field=ReasoningFieldPolicy(rf.get("default", "keep"), dict(rf.get("clients", {}))),
        probe=dict(data.get("probe", {})),
        security=dict(data.get("security", {})),
        retention=dict(data.get("retention", {})),
        source=source,
    )


def run_settings(data: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The declared run settings the (validated) file gives, by `Settings` attribute; a dotted key is a
    table's (`tool_repair.mode`). A store path is relative to the file's folder, a URL stays a URL."""
    found: dict[str, Any] = {}
    for s in declared():
        if s.key is None:
            continue
        *tables, last = s.key.split(".")
        table: Any = data
        for name in tables:
            table = table.get(name, {}) if isinstance(table, Mapping) else {}
        if isinstance(table, Mapping) and last in table:
            value = table[last]
            found[s.name] = _store(base, value) if s.kind == "store" else value
    return found


def _tables(value: Any, everything: bool = False) -> list[tuple[str, Mapping[str, Any]]]:
    """The (name, table) entries of a table of tables; entries that aren't tables are the schema's to report
    (`everything`: keep them, for the names)."""
    if not isinstance(value, Mapping):
        return []
    return [(name, t) for name, t in value.items() if everything or isinstance(t, Mapping)]


@contextmanager
def _unless_shaped(shaped: bool) -> Iterator[None]:
    """Run a semantic check; when the schema already refused something, a part it refused may not have the
    shape the check reads: that part is skipped (its problem is already reported), the rest still checked."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, ValueError):
        if shaped:
            raise


def _model(
    name: str,
    m: Mapping[str, Any],
    source: str,
    names: list[str],
    upstreams: Mapping[str, Upstream],
    claimed: dict[str, str],
    base: Path,
    data: Mapping[str, Any],
    problems: list[str],
) -> ModelConfig | None:
    """One `[models.NAME]` table, its problems appended to `problems` (None when it can't be built)."""
    where = f"models.{key_name(name)}"
    if name in claimed:
        problems.append(f"{source}: {where}: found the name {name!r}, which is already {claimed[name]}")
    claimed[name] = f"the model {where}"
    upstream = m.get("upstream")
    if upstream is None:
        if len(names) != 1:
            problems.append(f"{source}: {where}: missing key 'upstream', expected one of {', '.join(names)}")
            return None
        upstream = names[0]
    elif upstream not in names:
        problems.append(f"{source}: {where}.upstream: found {upstream!r}, expected one of {', '.join(names)}")
        return None
    for alias in m.get("aliases", []):
        if alias in claimed:
            problems.append(f"{source}: {where}.aliases: found {alias!r}, which is already {claimed[alias]}")
        claimed[alias] = f"an alias of {where}"
    sampling = {p: _param(f"{source}: {where}.sampling.{p}", v, problems) for p, v in m.get("sampling", {}).items()}
    gc = m.get("generation_config")
    gc_path = None if gc is None else _resolve(base, gc)
    r = m.get("reasoning", {})
    engine = upstreams[upstream].engine if upstream in upstreams else None
    reasoning = ReasoningSettings(
        dialect=r.get("dialect") or ENGINE_DIALECT.get(engine or ""),
        levels=tuple(r["levels"]) if "levels" in r else None,
        template_var=r.get("template_var"),
        field=r.get("field", "reasoning_effort"),
        reject_unmappable=r.get("reject_unmappable", bool(data.get("strict", False))),
        default_level=r.get("default_level", "medium"),
        budgets=dict(r.get("budgets", {})),
    )
    if reasoning.levels and reasoning.default_level not in reasoning.levels and "default_level" in r:
        problems.append(
            f"{source}: {where}.reasoning.default_level: found {reasoning.default_level!r}, "
            f"expected one of the accepted levels {', '.join(reasoning.levels)}"
        )
    return ModelConfig(
        name=name,
        upstream=upstream,
        upstream_model=m.get("upstream_model", name),
        aliases=tuple(m.get("aliases", [])),
        sampling=sampling,
        generation_config=gc_path,
        reasoning=reasoning,
        store_bodies=m.get("store_bodies", True),
        tool_format=m.get("tool_format"),  # a registered name: the schema lists them
        regenerate=m.get("regenerate"),
        regenerate_unknown_tool=m.get("regenerate_unknown_tool"),
        context_window=m.get("context_window"),
        keep_billing_line=m.get("keep_billing_line", False),
        replay_reasoning=m.get("replay_reasoning", False),
        replay_reasoning_as=m.get("replay_reasoning_as"),
        routes=parse_routes(source, where, m.get("routes"), names, problems),
        supports=tuple(m["supports"]) if "supports" in m else None,
        dialect_from_engine=not r.get("dialect"),
    )


def _upstream(name: str, u: Mapping[str, Any]) -> Upstream:
    engine = u["engine"]
    return Upstream(
        name=name,
        base_url=u["base_url"].rstrip("/"),
        engine=engine,
        api_key_env=u.get("api_key_env"),
        style=u.get("style", "anthropic" if engine == "anthropic" else "openai"),
        ca_file=u.get("ca_file"),
        insecure=u.get("insecure", False),
        connect_timeout=u.get("connect_timeout"),
        read_timeout=u.get("read_timeout"),
        head_timeout=u.get("head_timeout"),
        regenerate_concurrency=u.get("regenerate_concurrency"),
        regenerate_per_minute=u.get("regenerate_per_minute"),
        supports=tuple(u["supports"]) if "supports" in u else None,
        slots=u.get("slots"),
        reserve_main_slot=u.get("reserve_main_slot", False),
    )


def slot_problems(source: str, u: Upstream) -> list[str]:
    """`slots` is llama-server's `-np`, pinned with its `id_slot`: no other engine has slots to pin, so on one
    it would be a setting that silently does nothing; and a main slot can only be kept when there are others."""
    where = f"{source}: upstreams.{u.name}"
    problems = []
    if u.slots is not None and u.engine != "llamacpp":
        problems.append(
            f'{where}.slots: only a llama.cpp upstream (engine = "llamacpp") has slots to pin a thread to; '
            f"this one's engine is {u.engine}: remove slots"
        )
    if u.reserve_main_slot and (u.slots or 0) < 2:
        found = f"slots = {u.slots}" if u.slots is not None else "no slots"
        problems.append(
            f"{where}.reserve_main_slot: needs slots = 2 or more (one for the main agent, one for the rest); "
            f"found {found}"
        )
    return problems


def _param(where: str, value: Any, problems: list[str]) -> ParamPolicy:
    reason = "config " + where.split(": ", 1)[1]
    if not isinstance(value, dict):
        return ParamPolicy("fill", value, reason=reason)
    mode = value.get("mode", "fill")
    low, high, v = value.get("min"), value.get("max"), value.get("value")
    if mode == "clamp" and low is None and high is None:
        problems.append(f"{where}: found mode 'clamp' without bounds, expected min and/or max")
    if mode == "drop" and (v is not None or low is not None or high is not None):
        problems.append(f"{where}: found mode 'drop' with value/min/max, expected none of them")
    if low is not None and high is not None and low > high:
        problems.append(f"{where}.min: found {low} > max {high}, expected min <= max")
    if v is not None and ((low is not None and v < low) or (high is not None and v > high)):
        problems.append(f"{where}.value: found {v}, expected a value within [{low}, {high}]")
    return ParamPolicy(mode, v, low, high, reason)


def _store(base: Path, value: str) -> str:
    """`db`: a PostgreSQL URL as it is, a path relative to the config file's folder."""
    return value if is_postgres_url(value) else str(_resolve(base, value))


def _resolve(base: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def validate(data: Mapping[str, Any], source: str) -> None:
    problems = shape_problems(data, source)
    if problems:
        raise ConfigError("\n".join(problems), problems)
