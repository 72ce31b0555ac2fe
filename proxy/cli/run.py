"""`tapfix run`: the proxy in front of an inference server, and the start-up `tapfix demo` shares.

Every option is converted and range-checked by click before anything starts (a bad `--listen` or
`--connect-timeout 0` is exit 2), and the capture database is opened once before the proxy binds,
so an unusable `--db` is one line, not a server that dies on its first request.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from tapfix.proxy.cli.options import (
    FiniteFloatRange,
    Size,
    db_option,
    deprecated_alias,
    engine_option,
    key_env_option,
    listen_option,
    max_age_option,
    max_size_option,
)
from tapfix.proxy.cli.user_errors import UserError
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.net import parse_listen, url
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.held import MIN_HELD_BYTES
from tapfix.proxy.store.locator import StoreLocator

Banner = Callable[[str], None]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("tapfix").setLevel(logging.INFO)


@click.command()
@click.option("--upstream", metavar="URL", help="the inference server's root URL (quick mode)")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML config: several upstreams, models, aliases, per-model policy",
)
@engine_option("the upstream engine (quick mode): reasoning dialect and accepted sampling parameters")
@click.option(
    "--generation-config",
    type=click.Path(exists=True, path_type=Path),
    help="fill omitted sampling parameters from this generation_config.json (or model folder)",
)
@click.option("--reasoning-dialect", metavar="NAME", help="override the engine's reasoning-effort dialect")
@key_env_option("send the key in this environment variable upstream (quick mode)")
@listen_option("127.0.0.1:8080")
@db_option("capture database: a SQLite file or a postgresql:// URL (default: $TAPFIX_DB or captures/tapfix.db)")
@click.option("--mode", type=click.Choice(["reverse", "regular"]), default="reverse", show_default=True)
@click.option(
    "--intercept",
    multiple=True,
    metavar="HOST",
    help="regular mode: capture only these hosts (default: the configured upstreams)",
)
@click.option(
    "--upstream-ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CA bundle that signs a self-signed TLS upstream",
)
@click.option("--insecure", is_flag=True, help="do not verify the upstream's TLS certificate")
@click.option(
    "--connect-timeout", type=FiniteFloatRange(min=0, min_open=True), default=5.0, show_default=True, help="seconds"
)
@click.option(
    "--idle-timeout", type=click.IntRange(min=1), default=600, show_default=True, help="seconds without traffic"
)
@click.option(
    "--tool-repair",
    type=click.Choice(["error", "fail_fast", "passthrough", "off"]),
    default="error",
    show_default=True,
    help="what an unrecoverable streamed tool call becomes",
)
@click.option(
    "--stream-valid-prefix",
    is_flag=True,
    help="forward tool-call fragments at once while they are a valid JSON prefix, instead of holding "
    "each call until it is complete (lower latency; a defect found later can only fail the turn)",
)
@click.option(
    "--tool-format",
    metavar="NAME",
    help="pin the tool-call format leaked markup is read in (quick mode; a name from docs/formats.md, e.g. glm47)",
)
@click.option("--no-bodies", is_flag=True, help="privacy: store metadata only, never bodies")
@click.option(
    "--token",
    envvar="TAPFIX_TOKEN",
    metavar="SECRET",
    show_envvar=True,
    help="required to listen beyond loopback: clients send it as their API key (it is never forwarded)",
)
@max_age_option("retention: purge captures older than this (7d, 12h)")
@max_size_option("retention: purge the oldest captures above this size (2G)")
@click.option(
    "--shutdown-grace",
    type=FiniteFloatRange(min=0),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="on SIGTERM, let in-flight streams finish this long, then end them with a retryable error (0: at once)",
)
@click.option(
    "--regenerate",
    type=int,
    default=1,
    show_default=True,
    metavar="N",
    callback=lambda _ctx, _param, value: _checked("--regenerate", "check_attempts", value),
    help="when a tool call can't be saved, ask the upstream again up to N times before the client sees an "
    "error (0: off)",
)
@click.option(
    "--regenerate-budget",
    type=float,
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    callback=lambda _ctx, _param, value: _checked("--regenerate-budget", "check_budget", value),
    help="the time all regeneration attempts of one request may take together",
)
@click.option(
    "--regenerate-unknown-tool",
    is_flag=True,
    help="also regenerate when a call names a tool the request didn't offer (otherwise it passes, flagged)",
)
@click.option(
    "--otlp",
    metavar="URL",
    help="export one OpenTelemetry GenAI span per exchange (and metrics) to this OTLP base URL, like "
    "OTEL_EXPORTER_OTLP_ENDPOINT (needs tapfix[otel])",
)
@click.option(
    "--browse-url",
    metavar="URL",
    callback=lambda _ctx, _param, value: _browse_url(value),
    help="where `tapfix browse` is reachable: exported spans link to the exchange's page there",
)
@click.option(
    "--store-queue",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="while the capture database is out of reach, hold up to N exchanges in memory, then count the oldest "
    "as lost (default 10000)",
)
@click.option(
    "--store-queue-bytes",
    type=Size(MIN_HELD_BYTES, "the store queue must hold at least a few exchanges' bodies"),
    default=None,
    metavar="SIZE",
    help="...and up to SIZE of their bodies (default 256MiB; a unit: 512MiB, 1G; at least 1MiB)",
)
@click.option(
    "--strict",
    is_flag=True,
    help="refuse to start when the preflight checks find a problem, or the capture database can't be reached",
)
@click.option("-v", "--verbose", is_flag=True)
@deprecated_alias("--upstream-key-env", "--key-env", "key_env")
@deprecated_alias("--max-db-size", "--max-size", "max_size", type=Size())
def run(**kw: Any) -> None:
    """Run the proxy in front of an inference server.

    \b
    Example:
      tapfix run --upstream http://127.0.0.1:8000 --engine vllm --max-age 7d
      tapfix run --config tapfix.toml --listen 0.0.0.0:8080 --token "$SECRET"
    """
    if not kw["upstream"] and not kw["config_path"] and kw["mode"] == "reverse":
        raise click.UsageError("give --upstream URL or --config FILE (or use --mode regular)")
    if kw["upstream"] and kw["config_path"]:
        raise click.UsageError("give either --upstream (quick mode) or --config, not both")
    if kw["config_path"]:
        _config_defaults(kw)
    _check_retention(kw)
    _check_tool_format(kw.get("tool_format"))
    kw["export"] = _export(kw)
    sys.exit(run_proxy(make_settings(kw)))


def _check_retention(kw: dict[str, Any]) -> None:
    """An age under a minute, or a size under the empty store's floor, would purge captures as they arrive."""
    from tapfix.proxy.store.retention import check_max_age, check_max_size

    for key, check in (("max_age", check_max_age), ("max_size", check_max_size)):
        option = "--" + key.replace("_", "-")
        try:
            check(kw.get(key))
        except ValueError as e:
            raise click.BadParameter(str(e).removeprefix(f"{option} "), param_hint=f"'{option}'") from e


def _checked(option: str, check: str, value: Any) -> Any:
    """A regeneration setting range-checked by proxy/regenerate/eligibility (a bad one is exit 2)."""
    from tapfix.proxy.regenerate import eligibility

    try:
        return getattr(eligibility, check)(value, option)
    except eligibility.SettingError as e:
        raise click.BadParameter(str(e).removeprefix(f"{option} "), param_hint=f"'{option}'") from e


def _browse_url(value: str | None) -> str | None:
    """`--browse-url`: an http(s) URL with a host, nothing else. Spans carry it as a link a tracing UI
    renders, so `javascript:` or `data:` there would run in whoever clicks it."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value.strip())
        ok = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that isn't a number
    except ValueError:
        ok = False
    if not ok:
        raise click.BadParameter(
            f"{value!r}: give the browser's http:// or https:// URL with a host, e.g. http://127.0.0.1:8081",
            param_hint="'--browse-url'",
        )
    return value.strip()


def _check_tool_format(name: str | None) -> None:
    """An unknown `--tool-format` is a usage error that lists the registered names."""
    if name is None:
        return
    from tapfix.proxy.toolcalls.formats import UnknownFormat, armed

    try:
        armed(name)
    except UnknownFormat as e:
        raise click.BadParameter(str(e), param_hint="'--tool-format'") from e


def _export(kw: dict[str, Any]) -> Any:
    """The OTLP export settings (None: off); a URL or OTEL_* value that can't be right is exit 2."""
    import os

    from tapfix.proxy.telemetry.config import export_config

    return export_config(kw.get("otlp"), os.environ, kw.get("browse_url"))


def _config_defaults(kw: dict[str, Any]) -> None:
    """listen, db and mode from the config file, unless given on the command line."""
    from tapfix.proxy.config.file import Config, ConfigError

    try:
        config = Config.load(kw["config_path"])
    except ConfigError as e:
        raise UserError(str(e)) from e
    ctx = click.get_current_context()

    def from_file(key: str) -> bool:
        return ctx.get_parameter_source(key) is not click.core.ParameterSource.COMMANDLINE

    if config.listen and from_file("listen"):
        try:
            kw["listen"] = parse_listen(config.listen, 8080)
        except ValueError as e:
            raise UserError(f"{kw['config_path']}: listen {e}") from e
    if config.db and from_file("db"):
        kw["db"] = StoreLocator.resolve(config.db)
    if config.mode and from_file("mode"):
        kw["mode"] = config.mode
    mode = (config.tool_repair or {}).get("mode")
    if mode and from_file("tool_repair"):
        kw["tool_repair"] = mode
    if (config.tool_repair or {}).get("stream_valid_prefix"):
        kw["stream_valid_prefix"] = True
    for key, check in (("regenerate", "check_attempts"), ("regenerate_budget", "check_budget")):
        value = getattr(config, key)
        if value is not None and from_file(key):
            try:
                kw[key] = _checked(key, check, value)
            except click.BadParameter as e:
                raise UserError(f"{kw['config_path']}: {e.message}") from e
    if config.regenerate_unknown_tool is not None and from_file("regenerate_unknown_tool"):
        kw["regenerate_unknown_tool"] = config.regenerate_unknown_tool
    if config.shutdown_grace is not None and from_file("shutdown_grace"):
        kw["shutdown_grace"] = config.shutdown_grace


def make_settings(kw: dict[str, Any]) -> Settings:
    """Settings from converted option values: `listen` (host, port), `db` a StoreLocator."""
    host, port = kw["listen"]
    store: StoreLocator = kw.get("db") or StoreLocator.resolve()
    return Settings(
        upstream=kw.get("upstream"),
        config_path=kw.get("config_path"),
        listen_host=host,
        listen_port=port,
        db=store,
        mode=kw.get("mode", "reverse"),
        intercept=list(kw.get("intercept") or ()),
        upstream_ca=kw.get("upstream_ca"),
        insecure=kw.get("insecure", False),
        connect_timeout=kw.get("connect_timeout", 5.0),
        idle_timeout=kw.get("idle_timeout", 600),
        strict=kw.get("strict", False),
        engine=kw.get("engine"),
        generation_config=kw.get("generation_config"),
        reasoning_dialect=kw.get("reasoning_dialect"),
        upstream_key_env=kw.get("key_env"),
        tool_repair=kw.get("tool_repair", "error"),
        store_bodies=not kw.get("no_bodies", False),
        stream_valid_prefix=kw.get("stream_valid_prefix", False),
        tool_format=kw.get("tool_format"),
        verbose=kw.get("verbose", False),
        token=kw.get("token") or None,
        max_age_s=kw.get("max_age"),
        max_db_bytes=kw.get("max_size"),
        store_queue=kw.get("store_queue"),
        store_queue_bytes=kw.get("store_queue_bytes"),
        shutdown_grace=kw.get("shutdown_grace", 5.0),
        regenerate=kw.get("regenerate", 1),
        regenerate_budget=kw.get("regenerate_budget", 60.0),
        regenerate_unknown_tool=kw.get("regenerate_unknown_tool", False),
        export=kw.get("export"),
    )


def run_proxy(settings: Settings, banner: Banner | None = None) -> int:
    """Prepare (store, upstreams, policy), then serve until interrupted; returns the exit code."""
    from tapfix.proxy.config.upstream import UpstreamURLError

    _setup_logging(settings.verbose)
    try:
        from tapfix.addons.runner.master import prepare

        runtime = prepare(settings)
    except (UpstreamURLError, ValueError, StoreError, OSError) as e:  # StartupError: a ValueError
        raise UserError(str(e)) from e
    from tapfix.addons.runner.master import run as run_master

    def ready() -> None:
        target = runtime.default_target
        where = url(settings.listen_host, settings.listen_port)
        if banner is not None:
            banner(where)
        else:
            upstream = f" → {target.url}" if target else ""
            click.echo(f"tapfix: {settings.mode} proxy on {where}{upstream}; captures in {settings.db}", err=True)
            writer = runtime.writer
            if writer is not None and writer.backend.unreachable:
                click.echo(
                    f"tapfix: the capture database can't be reached yet ({writer.backend.unreachable}); exchanges"
                    f" are held in memory (up to {writer.held.max_exchanges}) until it is, see /tapfix/health",
                    err=True,
                )
        if settings.export is not None:
            cfg = settings.export
            click.echo(f"tapfix: spans to {cfg.traces_endpoint} ({cfg.protocol}, content {cfg.content})", err=True)
            metrics = cfg.signal("metrics")
            click.echo(
                f"tapfix: metrics to {metrics.endpoint} ({metrics.protocol}); /tapfix/metrics for Prometheus", err=True
            )

    return int(run_master(settings, runtime, ready=ready))
