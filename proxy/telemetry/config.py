"""Where OTLP export goes and what it carries: `--otlp`, `--browse-url` and the standard OTEL_* variables.

The variables are the ones every OpenTelemetry SDK reads (the OTLP exporter spec), so a receiver
configured for other programs works for tapfix too:

- `OTEL_EXPORTER_OTLP_ENDPOINT` (or `--otlp`, which wins) is a base URL: for http/protobuf tapfix
  appends `v1/traces` and `v1/metrics` to its path; for grpc it is used as is.
- `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` are per-signal URLs, used as is (the spec's rule).
- `..._HEADERS` (`k=v,k2=v2`, values URL-encoded), `..._TIMEOUT` (milliseconds), `..._PROTOCOL`
  (`http/protobuf` by default, or `grpc`), each with a per-signal form that wins over the generic one.
- `OTEL_SDK_DISABLED=true` turns export off whatever else is set.
- `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`: whether prompts and answers leave the host.
- `TAPFIX_GENAI_SEMCONV`: `1.41.0` keeps semantic-conventions v1.41.0's names for one release.

An endpoint of Langfuse's gets `x-langfuse-ingestion-version: 4` (its real-time ingestion).

A value that can't be right (a URL without scheme or host, an unknown protocol or content mode) is a
usage error at start-up, exit 2, never a receiver that silently gets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, cast, get_args
from urllib.parse import unquote, urlsplit

import click
from tapfix.proxy.telemetry import semconv as sc

Protocol = Literal["http/protobuf", "grpc"]
ContentMode = Literal["NO_CONTENT", "SPAN_ONLY", "EVENT_ONLY", "SPAN_AND_EVENT"]
Signal = Literal["traces", "metrics"]

PROTOCOLS: tuple[str, ...] = get_args(Protocol)
CONTENT_MODES: tuple[str, ...] = get_args(ContentMode)
DEFAULT_TIMEOUT_S = 10.0  # the spec's default, 10 000 ms
# At exit, what the last spans and metrics may hold tapfix up, whatever the export timeout: a receiver that
# is down would otherwise keep Ctrl-C waiting through the exporters' retries for the whole timeout.
EXIT_FLUSH_S = 2.0
DEFAULT_SERVICE_NAME = "tapfix"
# Langfuse v4 takes OTLP spans in real time only with this header (without it, data arrives ~10 minutes
# late); tapfix sends it to a Langfuse endpoint unless the headers already name it. Each exchange is one
# span, exported once and whole (never re-exported to update it), as v4 ingestion wants.
LANGFUSE_VERSION_HEADER = "x-langfuse-ingestion-version"
_DEFAULT_BASE = {"http/protobuf": "http://localhost:4318", "grpc": "http://localhost:4317"}
_PREFIX = "OTEL_EXPORTER_OTLP_"


@dataclass(frozen=True)
class SignalConfig:
    """One signal's exporter settings (the per-signal variables applied over the generic ones)."""

    endpoint: str
    protocol: Protocol
    headers: dict[str, str]
    timeout_s: float


@dataclass(frozen=True)
class ExportConfig:
    """Where spans and metrics go. `protocol`, `headers` and `timeout_s` are the traces' (the generic
    values unless a TRACES_ variable overrides them); `metrics` holds the metrics' own."""

    traces_endpoint: str  # full URL for http/protobuf; the grpc endpoint URL (scheme://host:port) for grpc
    metrics_endpoint: str
    protocol: Protocol
    headers: dict[str, str]
    timeout_s: float
    content: ContentMode
    browse_url: str | None
    metrics: SignalConfig | None = None  # None: the same protocol, headers and timeout as traces
    service_name: str = DEFAULT_SERVICE_NAME  # OTEL_SERVICE_NAME, else the resource's service.name, else tapfix
    resource_attributes: dict[str, str] = field(default_factory=dict)
    naming: sc.Naming = sc.CURRENT  # TAPFIX_GENAI_SEMCONV: the GenAI conventions' names, or v1.41.0's

    def signal(self, name: Signal) -> SignalConfig:
        """The exporter settings of `name`, for the span exporter (traces) and the metric one."""
        if name == "metrics" and self.metrics is not None:
            return self.metrics
        endpoint = self.traces_endpoint if name == "traces" else self.metrics_endpoint
        return SignalConfig(endpoint, self.protocol, dict(self.headers), self.timeout_s)

    @property
    def content_on_span(self) -> bool:
        return self.content in ("SPAN_ONLY", "SPAN_AND_EVENT")

    @property
    def content_in_event(self) -> bool:
        return self.content in ("EVENT_ONLY", "SPAN_AND_EVENT")

    @property
    def captures_content(self) -> bool:
        return self.content != "NO_CONTENT"


def export_config(otlp: str | None, env: Mapping[str, str], browse_url: str | None) -> ExportConfig | None:
    """The export settings, or None when export is off: no `--otlp` and no OTLP endpoint variable, or
    `OTEL_SDK_DISABLED=true`. Raises `click.UsageError` (exit 2) for a value that can't be right."""
    naming = semconv_naming(env)  # checked even with export off: /tapfix/metrics uses it too
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    content = _content_mode(env)
    base = _checked_url("--otlp", otlp) if otlp else None
    if base is None:
        generic = _var(env, "ENDPOINT")
        base = _checked_url(_PREFIX + "ENDPOINT", generic) if generic else None
    signals: tuple[Signal, ...] = ("traces", "metrics")
    # --otlp wins over every endpoint variable; without it a per-signal one wins over the base.
    explicit = {s: None if otlp else _var(env, f"{s.upper()}_ENDPOINT") for s in signals}
    if base is None and not any(explicit.values()):
        return None
    browse = _checked_url("--browse-url", browse_url).rstrip("/") if browse_url else None
    traces, metrics = (_signal(env, s, base, explicit[s]) for s in signals)
    resource = _pairs("OTEL_RESOURCE_ATTRIBUTES", env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    same = (metrics.protocol, metrics.headers, metrics.timeout_s) == (traces.protocol, traces.headers, traces.timeout_s)
    return ExportConfig(
        traces_endpoint=traces.endpoint,
        metrics_endpoint=metrics.endpoint,
        protocol=traces.protocol,
        headers=traces.headers,
        timeout_s=traces.timeout_s,
        content=content,
        browse_url=browse,
        metrics=None if same else metrics,
        service_name=env.get("OTEL_SERVICE_NAME", "").strip() or resource.get("service.name") or DEFAULT_SERVICE_NAME,
        resource_attributes=resource,
        naming=naming,
    )


def semconv_naming(env: Mapping[str, str]) -> sc.Naming:
    """`TAPFIX_GENAI_SEMCONV`: which GenAI conventions' names spans and metrics use; a usage error otherwise."""
    try:
        return sc.naming_of(env)
    except ValueError as e:
        raise click.UsageError(str(e)) from e


def _signal(env: Mapping[str, str], signal: Signal, base: str | None, explicit: str | None) -> SignalConfig:
    upper = signal.upper()
    protocol = _protocol(env, upper)
    if explicit:
        endpoint = _checked_url(f"{_PREFIX}{upper}_ENDPOINT", explicit)
    else:
        root = base or _DEFAULT_BASE[protocol]
        endpoint = root if protocol == "grpc" else f"{root.rstrip('/')}/v1/{signal}"
    headers = _pairs(_PREFIX + "HEADERS", _var(env, "HEADERS") or "")
    headers |= _pairs(f"{_PREFIX}{upper}_HEADERS", _var(env, f"{upper}_HEADERS") or "")
    if is_langfuse(endpoint) and not any(k.lower() == LANGFUSE_VERSION_HEADER for k in headers):
        headers[LANGFUSE_VERSION_HEADER] = "4"
    return SignalConfig(endpoint, protocol, headers, _timeout(env, upper))


def is_langfuse(endpoint: str) -> bool:
    """Langfuse's OTLP endpoint (cloud or self-hosted: `<host>/api/public/otel`, or a langfuse.com host)."""
    try:
        parts = urlsplit(endpoint)
    except ValueError:
        return False
    host = (parts.hostname or "").lower()
    return "/api/public/otel" in parts.path or host == "langfuse.com" or host.endswith(".langfuse.com")


def _var(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(_PREFIX + name, "").strip()
    return value or None


def _protocol(env: Mapping[str, str], upper: str) -> Protocol:
    name = f"{upper}_PROTOCOL" if _var(env, f"{upper}_PROTOCOL") else "PROTOCOL"
    value = _var(env, name) or "http/protobuf"
    if value not in PROTOCOLS:
        raise click.UsageError(f"{_PREFIX}{name} {value!r}: tapfix exports with {' or '.join(PROTOCOLS)}")
    return cast(Protocol, value)


def _timeout(env: Mapping[str, str], upper: str) -> float:
    name = f"{upper}_TIMEOUT" if _var(env, f"{upper}_TIMEOUT") else "TIMEOUT"
    value = _var(env, name)
    if value is None:
        return DEFAULT_TIMEOUT_S
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not ms > 0:
        raise click.UsageError(f"{_PREFIX}{name} {value!r}: give the timeout in milliseconds, above 0")
    return ms / 1000


def _content_mode(env: Mapping[str, str]) -> ContentMode:
    name = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    value = env.get(name, "").strip().upper() or "NO_CONTENT"
    if value not in CONTENT_MODES:
        raise click.UsageError(f"{name} {env[name]!r}: give one of {', '.join(CONTENT_MODES)}")
    return cast(ContentMode, value)


def _checked_url(option: str, value: str) -> str:
    """`value` when it is an http(s) URL with a host; a usage error naming `option` otherwise."""
    value = value.strip()
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that isn't a number
    except ValueError:
        ok = False
    if not ok:
        raise click.UsageError(f"{option} {value!r}: give a URL with a scheme and a host, e.g. http://127.0.0.1:4318")
    return value


def _pairs(option: str, text: str) -> dict[str, str]:
    """`k=v,k2=v2` (the W3C baggage form the spec uses for headers and resource attributes)."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"{option}: {item.strip()!r} is not key=value")
        pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs
