"""Preflight checks (`tapfix check`, and `tapfix run` at start): config, credentials, routes, models.

A route to a provider with no credential, or a model id the server doesn't serve, fails silently at
request time; this finds both before the first request. It lives beside routing (it asks what
`routing.py` would do), above the config it reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from tapfix.proxy.config.file import Config
from tapfix.proxy.request.routing import Problem, compare_served, preflight_static


@dataclass
class UpstreamStatus:
    name: str
    url: str
    ok: bool
    detail: str
    served: list[str]


def models_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return f"{base}/models" if base.endswith("/v1") else f"{base}/v1/models"


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
            served = [m["id"] for m in response.json().get("data", []) if isinstance(m, dict) and "id" in m]
        except ValueError:
            served = []
        statuses.append(
            UpstreamStatus(name, upstream.base_url, True, f"serves {', '.join(served) or 'nothing'}", served)
        )
        if not config.is_quick:
            problems += compare_served(config, name, served)
    return statuses, problems


def run_checks(
    config: Config, environ: Mapping[str, str] | None = None, timeout: float = 5.0
) -> tuple[list[UpstreamStatus], list[Problem]]:
    environ = os.environ if environ is None else environ
    statuses, problems = check_upstreams(config, environ, timeout)
    return statuses, preflight_static(config, environ) + problems


def render(config: Config, statuses: list[UpstreamStatus], problems: list[Problem]) -> str:
    lines = [f"config: {config.source or 'command line'}: valid"]
    for s in statuses:
        lines.append(f"upstream {s.name:<12} {'ok  ' if s.ok else 'FAIL'} {s.url}  {s.detail}")
    reachable = {s.name for s in statuses if s.ok}
    for model in config.models.values():
        if any(p.where.startswith(f"models.{model.name}") for p in problems):
            mark = "FAIL"
        elif model.upstream not in reachable:
            mark = "?   "  # its upstream didn't answer, so whether it is served is unknown
        else:
            mark = "ok  "
        aliases = f" (aliases: {', '.join(model.aliases)})" if model.aliases else ""
        lines.append(f"model    {model.name:<12} {mark} → {model.upstream}/{model.upstream_model}{aliases}")
    if problems:
        lines.append("")
        lines += [str(p) for p in problems]
    else:
        lines.append("no problems found")
    return "\n".join(lines)
