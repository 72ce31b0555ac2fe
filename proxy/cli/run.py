"""`tapfix run`: the proxy in front of an inference server, and the start-up `tapfix demo` shares.

The options are the declared run settings (config/settings.py, cli/settings_options.py): each one is
converted and range-checked by click before anything starts (a bad `--listen` or `--connect-timeout 0`
is exit 2), and the capture database is opened once before the proxy binds, so an unusable `--db` is
one line, not a server that dies on its first request.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click
from tapfix.proxy.cli.settings_options import settings_command, with_config_file
from tapfix.proxy.cli.user_errors import UserError
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.net import url
from tapfix.proxy.store.errors import StoreError
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
@settings_command
def run(settings: Settings) -> None:
    """Run the proxy in front of an inference server.

    \b
    Example:
      tapfix run --upstream http://127.0.0.1:8000 --engine vllm --max-age 7d
      tapfix run --config tapfix.toml --listen 0.0.0.0:8080 --token "$SECRET"
    """
    sys.exit(run_proxy(checked(settings)))


def checked(settings: Settings) -> Settings:
    """The checks `run`'s options get together, and the config file under them (within the command's click
    context: a flag typed wins over the file). The in-process test tier starts the proxy through this too."""
    if not settings.upstream and not settings.config_path and settings.mode == "reverse":
        raise click.UsageError("give --upstream URL or --config FILE (or use --mode regular)")
    if settings.upstream and settings.config_path:
        raise click.UsageError("give either --upstream (quick mode) or --config, not both")
    if settings.config_path:
        settings = with_config_file(settings)
    return settings


def prepared(settings: Settings) -> tuple[StoreLocator, Any, Any]:
    """The store, the OTLP export (None: off) and the runtime (addons/runner/runtime.py: upstreams, policy,
    the capture writer; typed Any: the CLI imports no addon when it loads): what
    `tapfix run` makes before it listens; a problem is one `UserError` line."""
    from tapfix.addons.runner.master import prepare
    from tapfix.proxy.config.upstream import UpstreamURLError
    from tapfix.proxy.telemetry.config import export_config

    store = StoreLocator.resolve(settings.db, postgres=True)
    export = export_config(settings.otlp, os.environ, settings.browse_url)  # a bad URL or OTEL_* value: exit 2
    try:
        return store, export, prepare(settings, store, export)
    except (UpstreamURLError, ValueError, StoreError, OSError) as e:  # StartupError: a ValueError
        raise UserError(str(e)) from e


def run_proxy(settings: Settings, banner: Banner | None = None) -> int:
    """Prepare (store, upstreams, policy), then serve until interrupted; returns the exit code."""
    _setup_logging(settings.verbose)
    store, export, runtime = prepared(settings)
    from tapfix.addons.runner.master import run as run_master

    def ready() -> None:
        target = runtime.default_target
        where = url(settings.listen_host, settings.listen_port)
        if banner is not None:
            banner(where)
        else:
            upstream = f" → {target.url}" if target else ""
            click.echo(f"tapfix: {settings.mode} proxy on {where}{upstream}; captures in {store}", err=True)
            writer = runtime.writer
            if writer is not None and writer.backend.unreachable:
                click.echo(
                    f"tapfix: the capture database can't be reached yet ({writer.backend.unreachable}); exchanges"
                    f" are held in memory (up to {writer.held.max_exchanges}) until it is, see /tapfix/health",
                    err=True,
                )
        if export is not None:
            cfg = export
            click.echo(f"tapfix: spans to {cfg.traces_endpoint} ({cfg.protocol}, content {cfg.content})", err=True)
            metrics = cfg.signal("metrics")
            click.echo(
                f"tapfix: metrics to {metrics.endpoint} ({metrics.protocol}); /tapfix/metrics for Prometheus", err=True
            )

    return int(run_master(settings, runtime, ready=ready))
