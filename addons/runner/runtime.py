"""State shared by the addons of one proxy process: settings, the capture writer, upstreams."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mitmproxy import connection, http
from mitmproxy.net.http import url
from mitmproxy.proxy.mode_specs import ReverseMode
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.config.upstream import UpstreamTarget, authority
from tapfix.proxy.errors import SHUTDOWN_MESSAGE as SHUTDOWN_MESSAGE  # the words stream.py ends a cut stream with
from tapfix.proxy.errors import SHUTDOWN_REASON
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.regenerate.eligibility import Admissions, RegenerateSettings
from tapfix.proxy.request.routing import resolve
from tapfix.proxy.sse import ends_stream
from tapfix.proxy.store.writer import CaptureWriter

log = logging.getLogger("tapfix")
REACHABLE_FOR_S = 2.0
META = "tapfix"
# An exchange the shutdown grace ended (addons/shutdown.py): what it is flagged, what its client is told.
SHUTDOWN_FLAG = SHUTDOWN_REASON
_ENDED = "ended_normally"  # ex.extra: the verdict of `ended_normally`


@dataclass
class Runtime:
    settings: Settings
    writer: CaptureWriter | None
    default_target: UpstreamTarget | None
    policy: Any = None  # tapfix.proxy.request.policy.RequestPolicy in config mode / with request-side flags
    targets: dict[str, UpstreamTarget] = field(default_factory=dict)
    intercept_hosts: set[str] = field(default_factory=set)
    exchanges_seen: int = 0
    malformed_unrecorded: int = 0  # malformed-request records over a peer's budget (with a token)
    started: float = field(default_factory=time.time)
    attempts: Any = None  # addons/attempts.LaterAttempts when regeneration is on (issue 19); None: off
    admissions: Admissions = field(default_factory=Admissions)  # per-upstream regeneration budgets
    export: Any = None  # issue 20: tapfix.proxy.telemetry.config.ExportConfig from --otlp / OTEL_*; None: off
    telemetry: Any = None  # issue 20: the OTLP export when on (tapfix.proxy.telemetry); None: export off
    # Each telemetry part's counters, under its own key in /tapfix/health's "telemetry".
    telemetry_health: dict[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    metrics: Any = None  # issue 20: what /tapfix/metrics serves (telemetry.prometheus.PrometheusExposition)
    fanout: Any = None  # issue 20: the writer's telemetry observer (telemetry.observe.TurnFanout)
    # issue 37: each upstream's context window as its engine reported it, by (upstream, served model):
    # (tokens, where it came from). Filled and refreshed by addons/window.py.
    windows: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    windows_unknown: dict[tuple[str, str], float] = field(default_factory=dict)  # key → asked again after
    replay_turns: Any = None  # issue 36: tapfix.proxy.store.replay_turns.RecentTurns where a model replays reasoning
    _reachable_until: dict[str, float] = field(default_factory=dict)

    def intercepted(self, flow: http.HTTPFlow) -> bool:
        """Regular mode captures only allow-listed hosts; reverse mode captures everything."""
        if self.settings.mode == "reverse":
            return True
        return flow.request.pretty_host in self.intercept_hosts

    async def unreachable(self, target: UpstreamTarget) -> str | None:
        """None if the upstream accepts TCP connections; else why not. Cached for a moment when it did."""
        now = time.monotonic()
        if self._reachable_until.get(target.name, 0.0) > now:
            return None
        config = getattr(self.policy, "config", None)
        upstream = config.upstreams.get(target.name) if config is not None else None
        timeout = upstream.connect_timeout if upstream is not None and upstream.connect_timeout else None
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(target.host, target.port), timeout or self.settings.connect_timeout
            )
        except (OSError, TimeoutError) as e:
            return str(e) or type(e).__name__
        writer.close()
        self._reachable_until[target.name] = now + REACHABLE_FOR_S
        return None

    def regenerate_settings(self, model: str | None = None) -> RegenerateSettings:
        """The regeneration rules for a request to `model`: the routed model's own `regenerate` and
        `regenerate_unknown_tool` where its config sets them, else the global ones (flags, config)."""
        attempts, unknown_tool = self.settings.regenerate, self.settings.regenerate_unknown_tool
        config = getattr(self.policy, "config", None)
        if config is not None and not config.is_quick:
            own = getattr(resolve(config, model), "settings", None)
            if own is not None and own.regenerate is not None:
                attempts = own.regenerate
            if own is not None and own.regenerate_unknown_tool is not None:
                unknown_tool = own.regenerate_unknown_tool
        return RegenerateSettings(attempts, self.settings.regenerate_budget, unknown_tool)

    def engine_of(self, target_name: object) -> str | None:
        """The engine dialect of an upstream (continuation and seeds depend on it); None: unknown."""
        config = getattr(self.policy, "config", None)
        upstream = config.upstreams.get(target_name) if config is not None and isinstance(target_name, str) else None
        engine = getattr(upstream, "engine", None) if upstream is not None else self.settings.engine
        return engine if isinstance(engine, str) else None

    def saw_upstream(self, target_name: str) -> None:
        self._reachable_until[target_name] = time.monotonic() + REACHABLE_FOR_S

    def submit(self, exchange: Exchange) -> None:
        if self.writer is not None:
            self.writer.submit(exchange)

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "uptime_s": round(time.time() - self.started, 1),
            "exchanges": self.exchanges_seen,
            "malformed_unrecorded": self.malformed_unrecorded,
            "capture_writer": self.writer.health() if self.writer else None,
            "mode": self.settings.mode,
            "upstreams": {name: t.url for name, t in self.targets.items()},
            "later_attempts": getattr(self.attempts, "sent", 0),  # issue 19: upstream requests regeneration made
            "telemetry": {name: report() for name, report in self.telemetry_health.items()},
            # issue 36: turns whose recorded reasoning went back upstream, and turns resent without it that
            # matched none tapfix answered; None: no model replays reasoning
            "reasoning_replay": self.replay_turns.health() if self.replay_turns is not None else None,
        }


def exchange_of(flow: http.HTTPFlow) -> Exchange | None:
    return flow.metadata.get(META)


def ended_normally(ex: Exchange) -> bool:
    """The stream's terminal event (`[DONE]`, `response.completed`, `message_stop`) went to the client.

    Decided once, by the first error hook that asks (the stream owner's, before it adds an error event
    of its own), so the recorder after it judges what the client had, not what tapfix then added."""
    verdict = ex.extra.get(_ENDED)
    if verdict is None:
        sent = ex.client_response_chunks if ex.client_response_chunks is not None else ex.response_chunks
        verdict = ex.extra[_ENDED] = ends_stream(sent)
    return bool(verdict)


def ended_by_attempts(ex: Exchange) -> None:
    """The upstream cut attempt 1 off, and a later attempt ended the client's stream (issue 19): for the
    error hooks after the stream owner's, the stream ended as the client's does without a reset."""
    ex.extra[_ENDED] = True


def peer_of(conn: connection.Client) -> str:
    return f"{conn.peername[0]}" if conn.peername else ""


def exchange_from_request(flow: http.HTTPFlow, store_bodies: bool) -> Exchange:
    """A new exchange holding the client's request as it arrived: the method as sent (`.method`
    upper-cases), the path, every header with repeats and order kept, the exact body."""
    request = flow.request
    ex = Exchange(
        client_addr=peer_of(flow.client_conn),
        method=request.data.method.decode("utf-8", "surrogateescape"),
        path=request.path,
        url=client_url(flow),
        user_agent=request.headers.get("user-agent", ""),
        request=request.raw_content or b"",
        request_headers=list(request.headers.items(multi=True)),
        store_bodies=store_bodies,
    )
    ex.started_at = request.timestamp_start or time.time()
    return ex


def client_url(flow: http.HTTPFlow) -> str:
    """The URL the client asked for. In regular mode it named it itself; in reverse mode the request's
    scheme, host and port are the upstream's from the start (mitmproxy fills them in from the mode),
    so the client's are whether it spoke TLS to tapfix and the Host it sent (kept: `keep_host_header`),
    else the address it connected to."""
    request = flow.request
    client = flow.client_conn
    if not isinstance(client.proxy_mode, ReverseMode):
        return request_url(request)
    scheme = "https" if client.tls_established else "http"
    named = request.host_header or (authority(*client.sockname[:2]) if client.sockname else authority(request.host))
    return f"{scheme}://{named}{request.path if request.path != '*' else ''}"


def request_url(request: http.Request) -> str:
    """mitmproxy's `pretty_url` (the Host header preferred to the address), with an IPv6 host in
    brackets: mitmproxy writes `http://::1:8080/v1`, which no URL parser reads back."""
    if request.first_line_format == "authority":
        return request.authority
    host, port = request.host, request.port
    if request.host_header:
        named_host, named_port = url.parse_authority(request.host_header, check=False)
        host, port = named_host, named_port or url.default_port(request.scheme) or 443
    return f"{request.scheme}://{authority(host, port, request.scheme)}{request.path if request.path != '*' else ''}"
