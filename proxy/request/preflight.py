"""Preflight checks (`tapfix check`, and `tapfix run` at start): config, credentials, routes, models.

A route to a provider with no credential, or a model id the server doesn't serve, fails silently at
request time; this finds both before the first request. It lives beside routing (it asks what
`routing.py` would do), above the config it reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from tapfix.proxy.config.file import Config
from tapfix.proxy.request.route_checks import route_lines, route_problems
from tapfix.proxy.request.routing import Problem, compare_served, preflight_static
from tapfix.proxy.request.slots import slot_count_problem
from tapfix.proxy.window.sources import engine_url, probes_for


@dataclass
class UpstreamStatus:
    name: str
    url: str
    ok: bool
    detail: str
    served: list[str]
    windows: dict[str, tuple[int, str]] = field(default_factory=dict)  # served id → (window, where it came from)


def models_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return f"{base}/models" if base.endswith("/v1") else f"{base}/v1/models"


def engine_windows(
    client: httpx.Client, base_url: str, engine: str | None, listing: object, served: list[str]
) -> dict[str, tuple[int, str]]:
    """Each served model's window as its engine states it (`window/sources.py` says where), asked as
    `tapfix run` asks it; the `/v1/models` answer already read is reused."""
    windows: dict[str, tuple[int, str]] = {}
    answers: dict[tuple[str, str], object] = {("GET /v1/models", ""): listing}
    for model in served:
        for probe in probes_for(engine):
            key = (probe.label, model if probe.post else "")  # a POST asks about one model, a GET about all
            if key not in answers:
                try:
                    url = engine_url(base_url, probe.path)
                    answer = client.post(url, json={"model": model}) if probe.post else client.get(url)
                    answers[key] = answer.json() if answer.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    answers[key] = None
            if found := probe.read(answers[key], model):
                windows[model] = (found, probe.label)
                break
    return windows


def slot_problems(client: httpx.Client, base_url: str, name: str, slots: int) -> list[Problem]:
    """The configured `slots` against the count llama-server reports (request/slots.py `slot_count_problem`)."""
    try:
        answer = client.get(engine_url(base_url, "/props"))
        props = answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        props = None
    found = slot_count_problem(name, slots, props)
    return [found] if found is not None else []


def check_upstreams(
    config: Config, environ: Mapping[str, str] | None = None, timeout: float = 5.0
) -> tuple[list[UpstreamStatus], list[Problem]]:
    environ = os.environ if environ is None else environ
    statuses, problems = [], []
    for name, upstream in config.upstreams.items():
        url = models_url(upstream.base_url)
        verify: bool | str = not upstream.insecure
        if upstream.ca_file:
            verify = upstream.ca_file
        try:
            response = httpx.get(url, headers=upstream.auth_headers(environ), timeout=timeout, verify=verify)
        except httpx.HTTPError as e:
            statuses.append(UpstreamStatus(name, upstream.base_url, False, f"unreachable: {e}", []))
            problems.append(Problem("error", f"upstreams.{name}", f"{upstream.base_url} unreachable: {e}"))
            continue
        if response.status_code != 200:
            detail = f"GET {url} answered {response.status_code}"
            statuses.append(UpstreamStatus(name, upstream.base_url, False, detail, []))
            problems.append(Problem("error", f"upstreams.{name}", detail))
            continue
        try:
            listing = response.json()
            served = [m["id"] for m in listing.get("data", []) if isinstance(m, dict) and "id" in m]
        except (ValueError, AttributeError):
            listing, served = None, []
        with httpx.Client(headers=upstream.auth_headers(environ), timeout=timeout, verify=verify) as client:
            windows = engine_windows(client, upstream.base_url, upstream.engine, listing, served)
            if upstream.slots is not None:
                problems += slot_problems(client, upstream.base_url, name, upstream.slots)
        status = UpstreamStatus(name, upstream.base_url, True, f"serves {', '.join(served) or 'nothing'}", served)
        status.windows = windows
        statuses.append(status)
        if not config.is_quick:
            problems += compare_served(config, name, served)
    return statuses, problems


def run_checks(
    config: Config, environ: Mapping[str, str] | None = None, timeout: float = 5.0
) -> tuple[list[UpstreamStatus], list[Problem]]:
    environ = os.environ if environ is None else environ
    statuses, problems = check_upstreams(config, environ, timeout)
    return statuses, preflight_static(config, environ) + problems + route_problems(config, environ, list(statuses))


def window_text(configured: int | None, reported: tuple[int, str] | None) -> str:
    """A model's window and where it came from, as `tapfix run` picks it: the config wins."""
    if configured:
        also = f"; the engine says {reported[0]:,}" if reported and reported[0] != configured else ""
        return f"window {configured:,} tokens (config context_window{also})"
    if reported:
        return f"window {reported[0]:,} tokens ({reported[1]})"
    return "window unknown (set context_window in its [models] table)"


def render(config: Config, statuses: list[UpstreamStatus], problems: list[Problem]) -> str:
    lines = [f"config: {config.source or 'command line'}: valid"]
    for s in statuses:
        lines.append(f"upstream {s.name:<12} {'ok  ' if s.ok else 'FAIL'} {s.url}  {s.detail}")
    reachable = {s.name for s in statuses if s.ok}
    reported = {s.name: s.windows for s in statuses}
    for model in config.models.values():
        if any(p.where.startswith(f"models.{model.name}") for p in problems):
            mark = "FAIL"
        elif model.upstream not in reachable:
            mark = "?   "  # its upstream didn't answer, so whether it is served is unknown
        else:
            mark = "ok  "
        aliases = f" (aliases: {', '.join(model.aliases)})" if model.aliases else ""
        lines.append(
            f"model    {model.name:<12} {mark} → {model.upstream}/{model.upstream_model}{aliases}"
            f"  {window_text(model.context_window, reported.get(model.upstream, {}).get(model.upstream_model))}"
        )
    lines += route_lines(config)
    if config.is_quick:
        for s in statuses:
            lines += [f"model    {m:<12} {window_text(None, s.windows.get(m))}" for m in s.served]
    if problems:
        lines.append("")
        lines += [str(p) for p in problems]
    else:
        lines.append("no problems found")
    return "\n".join(lines)
