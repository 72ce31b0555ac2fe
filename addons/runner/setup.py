"""Build the request policy and upstream targets from flags (quick mode) or a config file."""

from __future__ import annotations

import logging
from typing import Any

from tapfix.proxy.config.file import Config, ConfigError
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.config.upstream import UpstreamTarget
from tapfix.proxy.request.policy import RequestPolicy

log = logging.getLogger("tapfix")


class StartupError(ValueError):
    """A config or check problem that stops `tapfix run`."""


def load_config(settings: Settings) -> Config:
    try:
        if settings.config_path is not None:
            return Config.load(settings.config_path)
        assert settings.upstream is not None
        return Config.quick(
            settings.upstream,
            engine=settings.engine,
            generation_config=settings.generation_config,
            reasoning_dialect=settings.reasoning_dialect,
            upstream_key_env=settings.upstream_key_env,
            keep_billing_line=settings.keep_billing_line,
            replay_reasoning=settings.replay_reasoning,
            replay_reasoning_as=settings.replay_reasoning_as,
        )
    except ConfigError as e:
        raise StartupError(str(e)) from e


def build_policy(settings: Settings) -> tuple[Any, dict[str, UpstreamTarget]]:
    if settings.mode == "regular" and not settings.upstream and settings.config_path is None:
        return None, {}
    config = load_config(settings)
    try:
        policy = RequestPolicy(config)
    except ConfigError as e:
        raise StartupError(str(e)) from e
    targets = {name: UpstreamTarget.parse(u.base_url, name) for name, u in config.upstreams.items()}
    if not config.is_quick or settings.upstream_key_env or settings.strict:
        _preflight(config, settings)  # quick mode: --strict checks the upstream as config mode does
    if any(u.insecure for u in config.upstreams.values()):
        settings.insecure = True
    for upstream in config.upstreams.values():
        if upstream.ca_file and settings.upstream_ca is None:
            from pathlib import Path

            settings.upstream_ca = Path(upstream.ca_file)
    return policy, targets


def _preflight(config: Config, settings: Settings) -> None:
    from tapfix.proxy.request.preflight import run_checks

    _, problems = run_checks(config, timeout=settings.connect_timeout)
    for problem in problems:
        log.warning("preflight: %s", problem)
    errors = [p for p in problems if p.severity == "error"]
    if errors and settings.strict:
        raise StartupError("--strict: preflight found problems:\n" + "\n".join(str(p) for p in errors))
