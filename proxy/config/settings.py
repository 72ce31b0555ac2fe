"""The settings of one `tapfix run`, each declared once: here.

Every field is a `setting(...)` (`declare.py`): its type, default, range, help, flag, config key and the
per-model or per-upstream key that may set it. `tapfix run`'s options (cli/settings_options.py), the
config file's keys (file.py) and their JSON Schema, and the reference tables in README.md and
docs/reference/settings.md (`python -m tapfix.proxy.cli.reference`) are all derived from these; a test
fails when any of them differs. The field order is the order `tapfix run --help` lists them in.

Values are as the user gave them, converted (seconds, bytes, (host, port)): the capture store stays the
text that names it, the OTLP export its URL, and the runner resolves them (addons/runner/master.py).
Listen addresses are read and judged in `tapfix.proxy.net` (`parse_listen`, `is_loopback`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal, get_args

from tapfix.proxy.config.declare import SETTING, PerTable, Range, Setting, setting
from tapfix.proxy.config.model import QUICK_ENGINES
from tapfix.proxy.vocabulary.repair_policy import TOOL_REPAIR_POLICIES, ToolRepairPolicy

ProxyMode = Literal["reverse", "regular"]

SECONDS = "seconds"
AT_MOST_10 = Range(0, 10, zero="off")


@dataclass
class Settings:
    upstream: str | None = setting(
        None, kind="url", flag="--upstream", metavar="URL", help="the inference server's root URL (quick mode)"
    )
    config_path: Path | None = setting(
        None,
        kind="file",
        flag="--config",
        metavar="FILE",
        help="TOML config: several upstreams, models, aliases, per-model policy",
    )
    engine: str | None = setting(
        None,
        kind="choice",
        flag="--engine",
        choices=QUICK_ENGINES,
        help="the upstream engine (quick mode): reasoning dialect and accepted sampling parameters",
        per=PerTable("upstreams", "engine", "the upstream's engine", same_shape=False),
    )
    generation_config: Path | None = setting(
        None,
        kind="path",
        flag="--generation-config",
        metavar="PATH",
        help="fill omitted sampling parameters from this generation_config.json (or model folder)",
        per=PerTable("models", "generation_config", "Path to generation_config.json or to the model folder."),
    )
    reasoning_dialect: str | None = setting(
        None,
        kind="text",
        flag="--reasoning-dialect",
        metavar="NAME",
        help="override the engine's reasoning-effort dialect",
        per=PerTable("models", "reasoning.dialect", "the model's reasoning-effort dialect", same_shape=False),
    )
    keep_billing_line: bool = setting(
        False,
        kind="flag",
        flag="--keep-billing-line",
        help="forward Claude Code's x-anthropic-billing-header system block to a local engine (quick mode; by "
        "default it is removed: it changes between requests and defeats the engine's prefix cache)",
        per=PerTable(
            "models",
            "keep_billing_line",
            "Keep Claude Code's billing block for this model; otherwise a local engine (vllm, sglang, llamacpp, "
            "ollama, tabbyapi) never sees it.",
        ),
    )
    replay_reasoning: bool = setting(
        False,
        kind="flag",
        flag="--replay-reasoning",
        help="put the reasoning tapfix recorded back into assistant turns the client resends without it "
        "(quick mode; for interleaved-thinking models: see docs/request-side.md)",
        per=PerTable(
            "models",
            "replay_reasoning",
            "Put the reasoning tapfix recorded back into this model's assistant turns that the client resends "
            "without it, where the engine reads it.",
        ),
    )
    replay_reasoning_as: str | None = setting(
        None,
        kind="choice",
        flag="--replay-reasoning-as",
        choices=("field", "think"),
        help="where replayed reasoning goes (quick mode): the engine's message field (vllm: reasoning; "
        "llamacpp, sglang and others: reasoning_content) or <think>...</think> at the start of the content",
        per=PerTable(
            "models",
            "replay_reasoning_as",
            "Where replayed reasoning goes: `field` (the field the engine reads) or `think` (inline).",
        ),
    )
    upstream_key_env: str | None = setting(
        None,
        kind="text",
        flag="--key-env",
        old_flags=("--upstream-key-env",),
        metavar="NAME",
        help="send the key in this environment variable upstream (quick mode)",
        per=PerTable("upstreams", "api_key_env", "the variable holding the upstream's key", same_shape=False),
    )
    listen: tuple[str, int] = setting(
        ("127.0.0.1", 8080),
        kind="listen",
        flag="--listen",
        key="listen",
        metavar="HOST:PORT",
        help="HOST:PORT, :PORT, PORT or [IPv6]:PORT",
        docs="loopback unless told otherwise; beyond loopback `--token` is required",
    )
    db: str | None = setting(
        None,
        kind="store",
        flag="--db",
        key="db",
        metavar="PATH",
        help="capture database: a SQLite file or a postgresql:// URL",
        default_text="$TAPFIX_DB or captures/tapfix.db",
        docs="a file tapfix didn't create, or one migrated by a newer tapfix, is refused and left untouched; "
        "in the config file a path is relative to the file's folder",
    )
    mode: ProxyMode = setting(
        "reverse",
        kind="choice",
        flag="--mode",
        key="mode",
        choices=get_args(ProxyMode),
        help="reverse proxy, or an HTTP(S) proxy for clients that honour HTTPS_PROXY",
    )
    intercept: tuple[str, ...] = setting(
        (),
        kind="hosts",
        flag="--intercept",
        metavar="HOST",
        help="regular mode: capture only these hosts (default: the configured upstreams)",
        docs="repeatable; everything else passes untouched and unrecorded",
    )
    upstream_ca: Path | None = setting(
        None,
        kind="file",
        flag="--upstream-ca",
        metavar="FILE",
        help="CA bundle that signs a self-signed TLS upstream",
        per=PerTable("upstreams", "ca_file", "the upstream's CA bundle", same_shape=False),
    )
    insecure: bool = setting(
        False,
        kind="flag",
        flag="--insecure",
        help="do not verify the upstream's TLS certificate",
        per=PerTable(
            "upstreams",
            "insecure",
            "Do not verify TLS certificates: one setting for the whole proxy, which any upstream's true turns on.",
        ),
    )
    connect_timeout: float = setting(
        5.0,
        kind="number",
        flag="--connect-timeout",
        metavar="SECONDS",
        unit=SECONDS,
        range=Range(0, min_open=True),
        help="upstream connect timeout (and the start-up preflight's per upstream)",
    )
    idle_timeout: int = setting(
        600,
        kind="int",
        flag="--idle-timeout",
        metavar="SECONDS",
        unit=SECONDS,
        range=Range(1),
        help="seconds without traffic before a connection is closed",
    )
    tool_repair: ToolRepairPolicy = setting(
        "error",
        kind="choice",
        flag="--tool-repair",
        key="tool_repair.mode",
        choices=TOOL_REPAIR_POLICIES,
        help="what an unrecoverable streamed tool call becomes",
        docs="error: a retryable SSE server_error event agents retry; fail_fast: a permanent-looking error; "
        "passthrough: the original bytes plus an SSE comment; off: no repair at all",
    )
    stream_valid_prefix: bool = setting(
        False,
        kind="flag",
        flag="--stream-valid-prefix",
        key="tool_repair.stream_valid_prefix",
        help="forward tool-call fragments at once while they are a valid JSON prefix, instead of holding "
        "each call until it is complete (lower latency; a defect found later can only fail the turn)",
    )
    tool_format: str | None = setting(
        None,
        kind="text",
        flag="--tool-format",
        metavar="NAME",
        registry="tool-call formats",
        help="pin the tool-call format leaked markup is read in (quick mode; a name from docs/formats.md, e.g. glm47)",
        per=PerTable(
            "models",
            "tool_format",
            "Pin the model's tool-call format (a name of the registry, docs/formats.md): only it is read from "
            "leaked markup.",
        ),
    )
    store_bodies: bool = setting(
        True,
        kind="flag",
        flag="--no-bodies",
        help="privacy: store metadata only, never bodies",
        per=PerTable(
            "models",
            "store_bodies",
            "Privacy: false stores this model's exchanges as metadata only (no request or response bodies).",
        ),
    )
    token: str | None = setting(
        None,
        kind="secret",
        flag="--token",
        metavar="SECRET",
        envvar="TAPFIX_TOKEN",
        help="required to listen beyond loopback: clients send it as their API key (it is never forwarded)",
        docs="at least 8 characters",
    )
    max_age_s: float | None = setting(
        None,
        kind="age",
        flag="--max-age",
        metavar="AGE",
        help="retention: purge captures older than this (7d, 12h)",
        docs="enforced by the writer without blocking traffic; under 1 minute is refused; ages: `90s`, `30m`, "
        "`12h`, `7d`, `1y`, `1h30m`; in the config file: `[retention] max_age`",
    )
    max_db_bytes: int | None = setting(
        None,
        kind="size",
        flag="--max-size",
        old_flags=("--max-db-size",),
        metavar="SIZE",
        help="retention: purge the oldest captures above this size (2G)",
        docs="under the empty store's floor is refused; sizes take a unit (`500M`, `2G`, `256MiB`; binary); "
        "in the config file: `[retention] max_size`",
    )
    shutdown_grace: float = setting(
        5.0,
        kind="number",
        flag="--shutdown-grace",
        key="shutdown_grace",
        metavar="SECONDS",
        unit=SECONDS,
        range=Range(0, zero="at once"),
        help="on SIGTERM, let in-flight streams finish this long, then end them with a retryable error (0: at once)",
    )
    context_window: int = setting(
        0,
        kind="int",
        flag="--context-window",
        metavar="TOKENS",
        range=Range(0, zero="read from the engine"),
        help="the upstream's context window in tokens (quick mode); 0: read it from the engine",
        per=PerTable(
            "models",
            "context_window",
            "This model's context window in tokens; wins over what the engine reports.",
        ),
    )
    route_breaker_failures: int = setting(
        3,
        kind="int",
        flag="--route-breaker-failures",
        key="routing.breaker_failures",
        metavar="N",
        range=Range(1),
        help="a routed upstream that fails N times within --route-breaker-window is skipped by the routes for a while",
    )
    route_breaker_window: float = setting(
        30.0,
        kind="number",
        flag="--route-breaker-window",
        key="routing.breaker_window",
        metavar="SECONDS",
        unit=SECONDS,
        range=Range(0, min_open=True),
        help="the window a routed upstream's failures are counted in",
    )
    route_breaker_open: float = setting(
        30.0,
        kind="number",
        flag="--route-breaker-open",
        key="routing.breaker_open",
        metavar="SECONDS",
        unit=SECONDS,
        range=Range(0, min_open=True),
        help="how long the routes skip an upstream whose breaker opened, before trying it again",
    )
    max_tokens_floor: int = setting(
        256,
        kind="int",
        flag="--max-tokens-floor",
        key="max_tokens_floor",
        metavar="TOKENS",
        range=Range(1),
        help="max_tokens is clamped to what the context window leaves, never below this",
    )
    regenerate: int = setting(
        1,
        kind="int",
        flag="--regenerate",
        key="regenerate",
        metavar="N",
        range=AT_MOST_10,
        help="when a tool call can't be saved, ask the upstream again up to N times before the client sees an "
        "error (0: off)",
        per=PerTable(
            "models",
            "regenerate",
            "This model's extra upstream attempts for a tool call that can't be saved (0 = off); default: the "
            "global `regenerate`.",
        ),
    )
    regenerate_budget: float = setting(
        60.0,
        kind="number",
        flag="--regenerate-budget",
        key="regenerate_budget",
        metavar="SECONDS",
        unit=SECONDS,
        range=Range(0, 3600, min_open=True),
        help="the time all regeneration attempts of one request may take together",
    )
    regenerate_unknown_tool: bool = setting(
        False,
        kind="flag",
        flag="--regenerate-unknown-tool",
        key="regenerate_unknown_tool",
        help="also regenerate when a call names a tool the request didn't offer (otherwise it passes, flagged)",
        per=PerTable(
            "models",
            "regenerate_unknown_tool",
            "Whether a call to a tool that wasn't offered is regenerated for this model; default: the global setting.",
        ),
    )
    otlp: str | None = setting(
        None,
        kind="url",
        flag="--otlp",
        metavar="URL",
        help="export one OpenTelemetry GenAI span per exchange (and metrics) to this OTLP base URL, like "
        "OTEL_EXPORTER_OTLP_ENDPOINT (needs tapfix[otel])",
    )
    browse_url: str | None = setting(
        None,
        kind="url",
        flag="--browse-url",
        metavar="URL",
        help="where `tapfix browse` is reachable: exported spans link to the exchange's page there",
        docs="http:// or https:// only",
    )
    store_queue: int = setting(
        10_000,
        kind="int",
        flag="--store-queue",
        metavar="N",
        range=Range(1),
        help="while the capture database is out of reach, hold up to N exchanges in memory, then count the "
        "oldest as lost",
    )
    store_queue_bytes: int = setting(
        256 * 1024 * 1024,
        kind="size",
        flag="--store-queue-bytes",
        metavar="SIZE",
        help="...and up to SIZE of their bodies (a unit: 512MiB, 1G; at least 1MiB)",
    )
    strict: bool = setting(
        False,
        kind="flag",
        flag="--strict",
        help="refuse to start when the preflight checks find a problem, or the capture database can't be reached",
    )
    verbose: bool = setting(
        False,
        kind="flag",
        flag="--verbose",
        short="-v",
        help="one log line per exchange (default: only start-up, warnings and errors)",
        docs="the hot path never logs",
    )

    @property
    def listen_host(self) -> str:
        return self.listen[0]

    @property
    def listen_port(self) -> int:
        return self.listen[1]


# Settings an upstream's table sets for that upstream alone (there is no flag and no global key).
UPSTREAM_ONLY = (
    Setting(
        "int",
        name="regenerate_concurrency",
        default=2,
        range=Range(1, 64),
        help="regeneration attempts in flight to this upstream at once",
        per=PerTable(
            "upstreams", "regenerate_concurrency", "Regeneration attempts in flight to this upstream at once."
        ),
    ),
    Setting(
        "int",
        name="regenerate_per_minute",
        default=30,
        range=Range(1, 1000),
        help="regeneration attempts started to this upstream in any 60 s",
        per=PerTable(
            "upstreams", "regenerate_per_minute", "Regeneration attempts started to this upstream in any 60 s."
        ),
    ),
    Setting(
        "int",
        name="slots",
        range=Range(1, 4096),
        help="the slots this llama.cpp upstream runs with (llama-server's -np)",
        per=PerTable(
            "upstreams",
            "slots",
            "The slots this llama-server runs with (its `-np`): each conversation's turns are pinned to one slot "
            "with `id_slot` (chat completions, Responses; not Messages, which llama.cpp doesn't pin). "
            'engine = "llamacpp" only. Default: no pinning (docs/routing.md).',
        ),
    ),
    Setting(
        "flag",
        name="reserve_main_slot",
        default=False,
        help="keep one slot of this llama.cpp upstream for each session's main agent; subagents share the others",
        per=PerTable(
            "upstreams",
            "reserve_main_slot",
            "Keep a slot for each session's main agent thread, which subagent threads never take (they share the "
            "others); needs `slots` of 2 or more (docs/routing.md).",
        ),
    ),
)


@cache
def declared() -> tuple[Setting, ...]:
    """Every declared setting: `Settings`' fields in order, then the upstream-only ones."""
    fields = (dataclasses.replace(f.metadata[SETTING], name=f.name) for f in dataclasses.fields(Settings))
    return (*fields, *UPSTREAM_ONLY)


def setting_named(name: str) -> Setting:
    for s in declared():
        if s.name == name:
            return s
    raise KeyError(name)
