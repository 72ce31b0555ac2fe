"""The `tapfix` command line. Each command's docstring is its help text.

This module never imports mitmproxy at the top: commands that only read captures start fast, and
the pure core stays importable without the proxy runtime.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click
import orjson
from tapfix.proxy.config.settings import Settings, parse_listen
from tapfix.proxy.store.writer import StoreError, default_db_path, open_for_reading

DB_HELP = "capture database (default: $TAPFIX_DB or captures/tapfix.db)"


def _db_option(f):
    return click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        help=DB_HELP)(f)


def _resolve_db(db: Path | None) -> Path:
    return db or default_db_path()


def _reader(db: Path | None):
    try:
        return open_for_reading(_resolve_db(db))
    except StoreError as e:
        raise click.ClickException(str(e)) from e


class LazyGroup(click.Group):
    """Commands that live in their own modules load only when used, so `captures` starts fast."""

    lazy = {"browse": "tapfix.proxy.cli.browse:browse", "probe": "tapfix.proxy.cli.probe:probe",
            "replay": "tapfix.proxy.cli.replay:replay"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy and name not in self.commands:
            import importlib

            module, attr = self.lazy[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tapfix")
def main() -> None:
    """tapfix: a logging and repairing proxy for self-hosted LLM inference.

    Point your agent's base URL at `tapfix run` (or try `tapfix demo`), then look at what really
    went over the wire with `tapfix captures list` and `tapfix captures show ID`.
    """


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("tapfix").setLevel(logging.INFO)


@main.command()
@click.option("--upstream", metavar="URL", help="the inference server's root URL (quick mode)")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="TOML config: several upstreams, models, aliases, per-model policy")
@click.option("--engine", type=click.Choice(["vllm", "sglang", "llamacpp", "ollama", "tabbyapi", "openai"]),
              help="the upstream engine (quick mode): reasoning dialect and accepted sampling parameters")
@click.option("--generation-config", type=click.Path(exists=True, path_type=Path),
              help="fill omitted sampling parameters from this generation_config.json (or model folder)")
@click.option("--reasoning-dialect", metavar="NAME", help="override the engine's reasoning-effort dialect")
@click.option("--upstream-key-env", metavar="NAME", help="send the key in this environment variable upstream")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT")
@_db_option
@click.option("--mode", type=click.Choice(["reverse", "regular"]), default="reverse", show_default=True)
@click.option("--intercept", multiple=True, metavar="HOST",
              help="regular mode: capture only these hosts (default: the configured upstreams)")
@click.option("--upstream-ca", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="CA bundle that signs a self-signed TLS upstream")
@click.option("--insecure", is_flag=True, help="do not verify the upstream's TLS certificate")
@click.option("--connect-timeout", type=float, default=5.0, show_default=True, help="seconds")
@click.option("--idle-timeout", type=int, default=600, show_default=True, help="seconds without traffic")
@click.option("--tool-repair", type=click.Choice(["error", "fail_fast", "passthrough", "off"]), default="error",
              show_default=True, help="what an unrecoverable streamed tool call becomes")
@click.option("--stream-valid-prefix", is_flag=True,
              help="forward tool-call fragments at once while they are a valid JSON prefix, instead of holding "
                   "each call until it is complete (lower latency; a defect found later can only fail the turn)")
@click.option("--no-bodies", is_flag=True, help="privacy: store metadata only, never bodies")
@click.option("--token", envvar="TAPFIX_TOKEN", metavar="SECRET", show_envvar=True,
              help="required to listen beyond loopback: clients send it as their API key (it is never forwarded)")
@click.option("--max-age", metavar="AGE", help="retention: purge captures older than this (7d, 12h)")
@click.option("--max-db-size", metavar="SIZE", help="retention: purge the oldest captures above this size (2G)")
@click.option("--strict", is_flag=True, help="refuse to start when the preflight checks find a problem")
@click.option("-v", "--verbose", is_flag=True)
def run(**kw) -> None:
    """Run the proxy in front of an inference server."""
    if not kw["upstream"] and not kw["config_path"] and kw["mode"] == "reverse":
        raise click.UsageError("give --upstream URL or --config FILE (or use --mode regular)")
    if kw["upstream"] and kw["config_path"]:
        raise click.UsageError("give either --upstream (quick mode) or --config, not both")
    if kw["config_path"]:
        _config_defaults(kw)
    settings = _settings(kw)
    sys.exit(_run_proxy(settings))


def _config_defaults(kw: dict) -> None:
    """listen, db and mode from the config file, unless given on the command line."""
    from tapfix.proxy.config.file import Config, ConfigError

    try:
        config = Config.load(kw["config_path"])
    except ConfigError as e:
        raise click.ClickException(str(e)) from e
    ctx = click.get_current_context()
    for key in ("listen", "db", "mode"):
        value = getattr(config, key, None)
        if value and ctx.get_parameter_source(key) is not click.core.ParameterSource.COMMANDLINE:
            kw[key] = Path(value) if key == "db" else value
    mode = (config.tool_repair or {}).get("mode")
    if mode and ctx.get_parameter_source("tool_repair") is not click.core.ParameterSource.COMMANDLINE:
        kw["tool_repair"] = mode
    if (config.tool_repair or {}).get("stream_valid_prefix"):
        kw["stream_valid_prefix"] = True


def _settings(kw: dict) -> Settings:
    from tapfix.proxy.store.retention import parse_duration, parse_size

    try:
        host, port = parse_listen(kw["listen"], 8080)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--listen") from e
    try:
        max_age = parse_duration(kw["max_age"]) if kw.get("max_age") else None
        max_size = parse_size(kw["max_db_size"]) if kw.get("max_db_size") else None
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    return Settings(
        upstream=kw.get("upstream"), config_path=kw.get("config_path"), listen_host=host, listen_port=port,
        db=_resolve_db(kw.get("db")), mode=kw.get("mode", "reverse"), intercept=list(kw.get("intercept") or ()),
        upstream_ca=kw.get("upstream_ca"), insecure=kw.get("insecure", False),
        connect_timeout=kw.get("connect_timeout", 5.0), idle_timeout=kw.get("idle_timeout", 600),
        strict=kw.get("strict", False), engine=kw.get("engine"), generation_config=kw.get("generation_config"),
        reasoning_dialect=kw.get("reasoning_dialect"), upstream_key_env=kw.get("upstream_key_env"),
        tool_repair=kw.get("tool_repair", "error"), store_bodies=not kw.get("no_bodies", False),
        stream_valid_prefix=kw.get("stream_valid_prefix", False),
        verbose=kw.get("verbose", False), token=kw.get("token") or None, max_age_s=max_age, max_db_bytes=max_size,
    )


def _run_proxy(settings: Settings, banner=None) -> int:
    from tapfix.proxy.config.upstream import UpstreamURLError

    _setup_logging(settings.verbose)
    try:
        from tapfix.addons.runner.master import prepare

        runtime = prepare(settings)
    except (UpstreamURLError, ValueError, StoreError) as e:  # StartupError is a ValueError
        raise click.ClickException(str(e)) from e
    from tapfix.addons.runner.master import run as run_master

    def ready() -> None:
        target = runtime.default_target
        where = f"http://{settings.listen_host}:{settings.listen_port}"
        if banner is not None:
            banner(where)
        else:
            upstream = f" → {target.url}" if target else ""
            click.echo(f"tapfix: {settings.mode} proxy on {where}{upstream}; captures in {settings.db}", err=True)

    return run_master(settings, runtime, ready=ready)


@main.command()
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT")
@click.option("--mock-listen", default="127.0.0.1:8000", show_default=True, metavar="HOST:PORT")
@_db_option
def demo(listen: str, mock_listen: str, db: Path | None) -> None:
    """Proxy + embedded scripted upstream + SQLite, ready for a client; prints how to use it."""
    from tapfix.proxy.cli.demo import run_demo

    sys.exit(run_demo(listen, mock_listen, _resolve_db(db), _run_proxy, _settings))


@main.command()
@click.option("--listen", default="127.0.0.1:8000", show_default=True, metavar="HOST:PORT")
@click.option("--case", "cases", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="serve this corpus case's stream (repeatable)")
@click.option("--scenario", metavar="FILE|NAME",
              help="a scenario file, or a shipped one by name (e.g. probe_failures/forget_needle): "
                   "per-request behaviours (degenerate answers, faults, ...); see docs/mock.md")
@click.option("--chunk-delay-ms", type=int, default=0, show_default=True)
@_db_option
@click.option("--capture", metavar="ID", help="server-side replay: serve this capture's recorded response")
@click.option("--fast", is_flag=True, help="with --capture: ignore the recorded chunk timing")
def mock(listen, cases, scenario, chunk_delay_ms, db, capture, fast) -> None:
    """The scripted upstream: an OpenAI-compatible server that plays a model, a corpus case or a capture."""
    from tapfix.proxy.mock import MockOptions, ScenarioError, serve

    host, port = parse_listen(listen, 8000)
    recorded = None
    if capture:
        from tapfix.proxy.replay.server import recorded_response

        conn = _reader(db)
        try:
            recorded = recorded_response(conn, capture)
        except StoreError as e:
            raise click.ClickException(str(e)) from e
    opts = MockOptions(cases=list(cases), scenario=scenario, chunk_delay_ms=chunk_delay_ms, recorded=recorded,
                       fast=fast)
    try:
        from tapfix.proxy.mock import create_app

        create_app(opts)  # validates cases and the scenario before binding
    except (ScenarioError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"tapfix mock: OpenAI-compatible scripted upstream on http://{host}:{port}/v1", err=True)
    serve(opts, host=host, port=port)


@main.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--timeout", type=float, default=5.0, show_default=True, help="seconds per upstream")
def check(config_path: Path, timeout: float) -> None:
    """Preflight: the config is valid, every upstream answers, every model id is served, credentials are set."""
    from tapfix.proxy.config.file import Config, ConfigError
    from tapfix.proxy.config.preflight import render, run_checks

    try:
        config = Config.load(config_path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from e
    statuses, problems = run_checks(config, timeout=timeout)
    click.echo(render(config, statuses, problems))
    sys.exit(1 if any(p.severity == "error" for p in problems) else 0)


@main.group()
def captures() -> None:
    """List, show and export captured exchanges."""


@captures.command("list")
@_db_option
@click.option("--limit", type=int, default=20, show_default=True, help="0 = all")
@click.option("--json", "as_json", is_flag=True, help="one JSON object a line")
@click.option("--flag", metavar="F", help="only exchanges with this flag (e.g. runaway_length)")
@click.option("--tag", metavar="T", help="only exchanges with this tag (probe, replay)")
@click.option("--session", metavar="SID", help="only this agent session")
def captures_list(db, limit, as_json, flag, tag, session) -> None:
    """Captured exchanges, newest first."""
    from tapfix.proxy.store.reader import list_captures

    rows = list_captures(_reader(db), limit=limit, flag=flag, tag=tag, session=session)
    if as_json:
        out = sys.stdout.buffer
        for row in rows:
            out.write(orjson.dumps(row) + b"\n")
        out.flush()
        return
    from tapfix.proxy.cli.render import captures_table

    click.echo(captures_table(rows))


@captures.command("show")
@click.argument("capture_id")
@_db_option
def captures_show(capture_id, db) -> None:
    """A readable view of one exchange: request as sent and as forwarded, response, changes, timings."""
    from tapfix.proxy.cli.show import render_capture
    from tapfix.proxy.store.reader import load_capture

    conn = _reader(db)
    try:
        click.echo(render_capture(conn, load_capture(conn, capture_id)))
    except StoreError as e:
        raise click.ClickException(str(e)) from e


@captures.command("export")
@click.argument("capture_id")
@_db_option
@click.option("--original", "which", flag_value="request", help="the client's request body (the default)")
@click.option("--forwarded", "which", flag_value="forwarded", help="the body sent upstream")
@click.option("--response", "which", flag_value="response", help="the raw upstream response")
@click.option("--client-response", "which", flag_value="client_response", help="the bytes the client received")
@click.option("--as", "as_format", type=click.Choice(["raw", "curl", "python", "bundle"]), default="raw",
              show_default=True)
@click.option("-o", "output", type=click.Path(path_type=Path), help="write here instead of stdout")
def captures_export(capture_id, db, which, as_format, output) -> None:
    """Write one body's exact bytes (default: the client's request body)."""
    from tapfix.proxy.store.reader import capture_body, load_capture

    conn = _reader(db)
    try:
        capture = load_capture(conn, capture_id)
        if as_format != "raw":
            from tapfix.proxy.replay.export import export_capture

            # A repro resends what the server got unless --original asks for the client's bytes.
            export_capture(conn, capture, as_format, output, which or "forwarded")
            return
        data = capture_body(conn, capture, which or "request")
    except StoreError as e:
        raise click.ClickException(str(e)) from e
    if output:
        _write_atomically(output, data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


from tapfix.proxy.cli.purge import purge as _purge  # noqa: E402 - its imports are light: click, orjson, the store

captures.add_command(_purge)
