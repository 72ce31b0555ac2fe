"""The `tapfix` command line. Each command's docstring is its help text, ending with an example.

This module never imports mitmproxy at the top: commands that only read captures start fast, and
the pure core stays importable without the proxy runtime. Shared options live in `options.py`,
the one path for user errors in `user_errors.py`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from tapfix.proxy.cli.captures import captures
from tapfix.proxy.cli.options import db_option, listen_option, timeout_option
from tapfix.proxy.cli.run import run
from tapfix.proxy.cli.user_errors import UserError, reported
from tapfix.proxy.config.settings import setting_named
from tapfix.proxy.net import url
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator

if TYPE_CHECKING:
    from tapfix.proxy.mock import MockOptions


class LazyGroup(click.Group):
    """Commands that live in their own modules load only when used, so `captures` starts fast, and
    `tapfix --help` lists them from their summaries (`summaries`, the first line of each one's help: a
    test keeps the two equal) without importing them (probe alone pulls httpx and jsonschema).

    It is also the last stop for a store error a command let through: one line, never a traceback.
    """

    lazy = {
        "browse": "tapfix.proxy.cli.browse:browse",
        "probe": "tapfix.proxy.cli.probe:probe",
        "replay": "tapfix.proxy.cli.replay:replay",
        "route": "tapfix.proxy.cli.route:route",
    }
    summaries = {
        "browse": "Browse captures in a web browser: filters, search, diffs, stream timelines, sessions, stats.",
        "probe": "Deep health probe: prove the model works (answers, streams, calls tools, reasons, sees, recalls).",
        "replay": "Resend a captured request (or a whole session) N times and compare the runs.",
        "route": "Explain the route a request takes through a model's routes (docs/routing.md).",
    }

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing, with the commands not loaded yet shown from their summaries."""
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy and name not in self.commands:
                stand_in = click.Command(name, help=self.summaries[name])  # click's own shortening
                rows.append((name, stand_in.get_short_help_str(limit)))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            module, attr = self.lazy[name].split(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            self.add_command(command, name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> Any:
        with reported(StoreError):
            return super().invoke(ctx)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tapfix")
def main() -> None:
    """tapfix: a logging and repairing proxy for self-hosted LLM inference.

    Point your agent's base URL at `tapfix run` (or try `tapfix demo`), then look at what really
    went over the wire with `tapfix captures list` and `tapfix captures show ID`.

    \b
    Example:
      tapfix run --upstream http://127.0.0.1:8000 --engine vllm
      tapfix captures list
    """


main.add_command(run)
main.add_command(captures)


@main.command()
@listen_option(setting_named("listen").shown_default() or "", "where the proxy listens")
@listen_option(
    "127.0.0.1:8000", "where the scripted upstream listens (another port if taken)", "--mock-listen", "mock_listen"
)
@db_option(file_only=True)
def demo(listen: tuple[str, int], mock_listen: tuple[str, int], db: StoreLocator) -> None:
    """Proxy + embedded scripted upstream + SQLite, ready for a client; prints how to use it.

    \b
    Example:
      tapfix demo --db /tmp/demo.db
    """
    from tapfix.proxy.cli.demo import run_demo
    from tapfix.proxy.cli.run import run_proxy

    sys.exit(run_demo(listen, mock_listen, db, run_proxy))


@main.command()
@listen_option("127.0.0.1:8000")
@click.option(
    "--case",
    "cases",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="serve this corpus case's stream (repeatable)",
)
@click.option(
    "--scenario",
    metavar="FILE|NAME",
    help="a scenario file, or a shipped one by name (e.g. probe_failures/forget_needle): "
    "per-request behaviours (degenerate answers, faults, ...); see docs/mock.md",
)
@click.option("--chunk-delay-ms", type=click.IntRange(min=0), default=0, show_default=True)
@db_option("with --capture: the capture database, a SQLite file or a postgresql:// URL")
@click.option("--capture", metavar="ID", help="server-side replay: serve this capture's recorded response")
@click.option("--fast", is_flag=True, help="with --capture: ignore the recorded chunk timing")
@click.option(
    "--context-window",
    type=click.IntRange(min=1),
    metavar="TOKENS",
    help="play a vLLM with this max_model_len: /tokenize counts, a prompt (or prompt plus max_tokens) that "
    "doesn't fit gets vLLM's 400",
)
def mock(listen: tuple[str, int], **options: Any) -> None:
    """The scripted upstream: an OpenAI-compatible server that plays a model, a corpus case or a capture.

    \b
    Example:
      tapfix mock --listen 127.0.0.1:8000 --chunk-delay-ms 20
      tapfix mock --capture 01J9Z3 --db captures/tapfix.db
    """
    from tapfix.proxy.mock import serve

    host, port = listen
    opts = mock_options(**options)  # typed and checked there (the in-process tests call it too)
    click.echo(f"tapfix mock: OpenAI-compatible scripted upstream on {url(host, port)}/v1", err=True)
    serve(opts, host=host, port=port)


def mock_options(
    cases: tuple[Path, ...],
    scenario: str | None,
    chunk_delay_ms: int,
    db: StoreLocator,
    capture: str | None,
    fast: bool,
    context_window: int | None = None,
) -> MockOptions:
    """`mock`'s options as MockOptions, checked (cases, scenario, the capture) before anything binds.
    The in-process test tier starts the mock through this too."""
    from tapfix.proxy.mock import MockOptions, ScenarioError, create_app

    recorded = None
    if capture:
        from tapfix.proxy.replay.server import recorded_response

        with reported(StoreError):
            reader = db.backend().reader()
            try:
                recorded = recorded_response(reader, capture)
            finally:
                reader.close()
    opts = MockOptions(
        cases=list(cases),
        scenario=Path(scenario) if scenario else None,
        chunk_delay_ms=chunk_delay_ms,
        context_window=context_window,
        recorded=recorded,
        fast=fast,
    )
    with reported(ScenarioError, ValueError, OSError):
        create_app(opts)  # validates cases and the scenario before binding
    return opts


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="the config to check")
@db_option("the capture store to check: a SQLite file or a postgresql:// URL (default: $TAPFIX_DB)")
@timeout_option(5.0, "seconds per upstream (and for the store)")
def check(config_path: Path | None, db: StoreLocator, timeout: float) -> None:
    """Preflight: the config is valid, every upstream answers, every model id is served, credentials are set;
    with --db (or $TAPFIX_DB and no --config), the store is reachable and its schema is this tapfix's.

    Exit 1 when a check finds a problem: an upstream or model that fails, a store that can't be reached,
    or one a newer tapfix migrated. A store behind this tapfix is fine: `tapfix run` migrates it.

    \b
    Example:
      tapfix check --config tapfix.toml
      tapfix check --db postgresql://tapfix@db.internal/tapfix
    """
    import os

    given = click.get_current_context().get_parameter_source("db") is click.core.ParameterSource.COMMANDLINE
    store = given or (config_path is None and bool(os.environ.get("TAPFIX_DB")))
    if config_path is None and not store:
        raise click.UsageError("give --config FILE, --db LOCATOR, or both")
    failed = False
    if config_path is not None:
        from tapfix.proxy.config.file import Config, ConfigError
        from tapfix.proxy.request.preflight import render, run_checks

        try:
            config = Config.load(config_path)
        except ConfigError as e:
            raise UserError(str(e)) from e
        statuses, problems = run_checks(config, timeout=timeout)
        click.echo(render(config, statuses, problems))
        failed = any(p.severity == "error" for p in problems)
    if store:
        report = db.backend().check(timeout)
        click.echo(report.render())
        failed = failed or report.failed
    sys.exit(1 if failed else 0)
