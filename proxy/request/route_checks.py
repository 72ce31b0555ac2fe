"""`tapfix check` for a model's routes (issue 38): the silent no-ops found before the first request. A route
whose credential isn't set, whose model its upstream doesn't serve, whose window can't hold what its rule
sends it, or that promotes long prompts to a window no larger than the default's, can never do what it says;
each is an error naming the route (and, here, the environment variable)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from tapfix.proxy.config.file import Config, ModelConfig
from tapfix.proxy.config.routes import DEFAULT_ROUTE, RouteRule
from tapfix.proxy.request.routing import Problem


class Reported(Protocol):
    """What `preflight.UpstreamStatus` gives about one upstream."""

    name: str
    ok: bool
    served: list[str]
    windows: dict[str, tuple[int, str]]


def route_problems(config: Config, environ: Mapping[str, str], statuses: list[Reported]) -> list[Problem]:
    by_name = {s.name: s for s in statuses}
    problems: list[Problem] = []
    for model in config.models.values():
        if not model.routes:
            continue
        default_window = _window(model.context_window, by_name.get(model.upstream), model.upstream_model)
        for rule in model.routes:
            where = f"models.{model.name}.routes.{rule.name}"
            served = rule.upstream_model or model.upstream_model
            for upstream in rule.upstreams:
                problems += _upstream_problems(config, environ, where, upstream, served, by_name.get(upstream))
            problems += _capability_problems(config, model, rule, where)
            window = min(
                (w for u in rule.upstreams if (w := _window(rule.context_window, by_name.get(u), served))),
                default=None,
            )
            problems += _window_problems(rule, where, window, default_window)
        where = f"models.{model.name} ({DEFAULT_ROUTE} route)"
        problems += _upstream_problems(
            config, environ, where, model.upstream, model.upstream_model, by_name.get(model.upstream)
        )
    return problems


def _upstream_problems(
    config: Config, environ: Mapping[str, str], where: str, upstream: str, served: str, status: Reported | None
) -> list[Problem]:
    found = []
    env = config.upstreams[upstream].api_key_env
    if env and not environ.get(env):
        found.append(
            Problem("error", where, f"upstream {upstream} has no credential ({env} is not set): it can never be taken")
        )
    if status is not None and status.ok and served not in status.served:
        listing = ", ".join(status.served) or "nothing"
        found.append(
            Problem(
                "error",
                where,
                f"upstream {upstream} does not serve {served!r} (it serves {listing}): it can never be taken",
            )
        )
    return found


def _capability_problems(config: Config, model: ModelConfig, rule: RouteRule, where: str) -> list[Problem]:
    found = []
    for upstream in rule.upstreams:
        supports = rule.supports or model.supports or config.upstreams[upstream].supports
        if supports is None:
            if rule.when.needs:
                found.append(
                    Problem(
                        "warning",
                        where,
                        f"upstream {upstream} declares no `supports`: {', '.join(rule.when.needs)} assumed",
                    )
                )
            continue
        missing = [n for n in rule.when.needs if n not in supports]
        if missing:
            found.append(
                Problem(
                    "error",
                    where,
                    f"its rule needs {', '.join(missing)}, which upstream {upstream} "
                    f"does not support (supports = {list(supports)}): it can never be taken",
                )
            )
    return found


def _window_problems(rule: RouteRule, where: str, window: int | None, default_window: int | None) -> list[Problem]:
    over = rule.when.prompt_tokens_over
    if over is None:
        return []
    if window is None:
        return [
            Problem(
                "warning",
                where,
                "its window is unknown (set context_window on the route): "
                "whether it holds the prompts it is promised can't be told",
            )
        ]
    if window <= over:
        return [
            Problem(
                "error", where, f"its window {window:,} can't hold a prompt over {over:,} tokens: it can never be taken"
            )
        ]
    if default_window is not None and window <= default_window:
        return [
            Problem(
                "error",
                where,
                f"a promotion to a window no larger than the default's ({window:,} <= {default_window:,})",
            )
        ]
    return []


def _window(configured: int | None, status: Reported | None, served: str) -> int | None:
    if configured:
        return configured
    reported = status.windows.get(served) if status is not None else None
    return reported[0] if reported else None


def route_lines(config: Config) -> list[str]:
    """One line per route, for `tapfix check`'s listing."""
    lines = []
    for model in config.models.values():
        for rule in model.routes:
            served = rule.upstream_model or model.upstream_model
            lines.append(
                f"route    {model.name}/{rule.name:<12} → {'|'.join(rule.upstreams)}/{served}"
                f"  when {rule.when.describe()}"
            )
    return lines
