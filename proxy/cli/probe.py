"""`tapfix probe`: deep health — does the model behind a server really work, not just its port.

A separate module so the probe command can be developed and tested on its own; the main CLI
registers it with `main.add_command(probe)`. Exit codes are a contract (DESIGN.md): 0 every check
passed, 1 a check failed, 2 a usage error or a server that can't be reached at all.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson
from tapfix.proxy.cli.options import FiniteFloatRange, db_option, engine_option, json_option, key_env_option
from tapfix.proxy.cli.user_errors import InputError
from tapfix.proxy.probe.runner import ALL_CHECKS, ProbeOptions, run_config_probe, run_probe, select_checks
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator

if TYPE_CHECKING:
    from tapfix.proxy.probe.report import ProbeReport
    from tapfix.proxy.request.policy import RequestPolicy
    from tapfix.proxy.store.writer import CaptureWriter


@click.command("probe")
@click.option("--upstream", metavar="URL", help="the inference server's root URL (quick mode)")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="probe every model of this config (or --model) on its own upstream",
)
@click.option(
    "--model",
    metavar="M",
    help="the model to probe (default: quick mode the first listed, "
    "config mode every configured model); config mode: a name or alias",
)
@click.option("--only", metavar="CHECK,...", help=f"run only these checks: {', '.join(ALL_CHECKS)}")
@json_option("print the report as JSON")
@db_option(
    "capture database for the probe's requests, tagged 'probe': a SQLite file or a postgresql:// URL"
    " (default: $TAPFIX_DB or captures/tapfix.db)",
)
@click.option("--no-capture", is_flag=True, help="do not record the probe's requests")
@key_env_option("quick mode: send the key in this environment variable as Authorization: Bearer")
@engine_option("quick mode: the engine, as for `tapfix run` (reasoning dialect, accepted sampling params)")
@click.option(
    "--generation-config",
    type=click.Path(exists=True, path_type=Path),
    help="quick mode: sampling defaults tapfix would fill, as for `tapfix run`",
)
@click.option(
    "--needle-tokens",
    type=click.IntRange(min=100),
    default=2000,
    show_default=True,
    help="long_context: filler size in tokens (up to the model's context)",
)
@click.option(
    "--needle-depth",
    type=FiniteFloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="long_context: where the passphrase sits, 0 = start, 1 = end",
)
@click.option("--timeout", type=FiniteFloatRange(min=0.1), default=60.0, show_default=True, help="seconds per request")
def probe(
    upstream: str | None,
    config_path: Path | None,
    model: str | None,
    only: str | None,
    as_json: bool,
    db: StoreLocator,
    no_capture: bool,
    key_env: str | None,
    engine: str | None,
    generation_config: Path | None,
    needle_tokens: int,
    needle_depth: float,
    timeout: float,
) -> None:
    """Deep health probe: prove the model works (answers, streams, calls tools, reasons, sees, recalls).

    Exit code 0 when every check passes, 1 when one fails, 2 on a usage error or when the server
    can't be reached. The probe's requests are captured, tagged `probe`.

    \b
    Example:
      tapfix probe --upstream http://127.0.0.1:8000 --only tool_call,stream
      tapfix probe --config tapfix.toml --model qwen3 --json
    """
    if bool(upstream) == bool(config_path):
        raise click.UsageError("give either --upstream URL or --config FILE")
    try:
        checks = select_checks(only.split(",")) if only else None
    except ValueError as e:
        raise InputError(str(e)) from e
    options = ProbeOptions(needle_tokens=needle_tokens, needle_depth=needle_depth)
    writer = None if no_capture else _writer(db)
    capture = writer.submit if writer is not None else None
    try:
        if config_path is not None:
            report = _config_mode(config_path, model, checks, timeout, capture, options)
        else:
            assert upstream is not None  # one of the two, checked above
            if key_env and not os.environ.get(key_env):
                raise InputError(f"--key-env {key_env}: the environment variable is not set")
            headers = {"authorization": f"Bearer {os.environ[key_env]}"} if key_env else None
            policy = _quick_policy(upstream, engine, generation_config)
            try:
                report = asyncio.run(
                    run_probe(
                        upstream,
                        model,
                        checks=checks,
                        headers=headers,
                        timeout=timeout,
                        capture=capture,
                        policy=policy,
                        options=options,
                    )
                )
            except ValueError as e:
                raise InputError(str(e)) from e
    finally:
        if writer is not None:
            writer.close()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.buffer.flush()
        if report.unreachable:
            click.echo(f"tapfix probe: {report.unreachable}", err=True)
    else:
        from tapfix.proxy.probe.report import render

        click.echo(render(report), nl=False)
    sys.exit(report.exit_code)


def _writer(db: StoreLocator) -> CaptureWriter:
    try:
        return db.backend().writer(wait=False)  # a one-shot command: a server that is down is an error now
    except StoreError as e:
        raise InputError(f"--db: {e}") from e


def _quick_policy(upstream: str, engine: str | None, generation_config: Path | None) -> RequestPolicy:
    from tapfix.proxy.config.file import Config, ConfigError
    from tapfix.proxy.config.upstream import UpstreamURLError
    from tapfix.proxy.request.policy import RequestPolicy

    try:
        return RequestPolicy(Config.quick(upstream, engine=engine, generation_config=generation_config))
    except (ConfigError, UpstreamURLError, ValueError) as e:
        raise InputError(str(e)) from e


def _config_mode(
    path: Path,
    model: str | None,
    checks: list[str] | None,
    timeout: float,
    capture: Callable[..., Any] | None,
    options: ProbeOptions,
) -> ProbeReport:
    from tapfix.proxy.config.file import ConfigError, load

    try:
        config = load(path)
        return asyncio.run(
            run_config_probe(config, model, checks=checks, timeout=timeout, capture=capture, options=options)
        )
    except (ConfigError, ValueError) as e:
        raise InputError(str(e)) from e


if __name__ == "__main__":  # pragma: no cover - `python -m tapfix.proxy.cli.probe` until registered
    probe()
