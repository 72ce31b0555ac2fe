"""`tapfix route explain`: the route decision a request would get (issue 38), without sending anything.

The same decision the proxy makes (request/routes.py), from the config, the environment's credentials and the
request alone: what the upstreams serve and the windows their engines report are not asked (`tapfix check`
asks them), so only the config's `context_window`s bound the window checks here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import orjson
from tapfix.proxy.cli.options import db_option, json_option
from tapfix.proxy.cli.user_errors import UserError, reported
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator


@click.group("route")
def route() -> None:
    """Explain the route a request takes through a model's routes (docs/routing.md).

    \b
    Example:
      tapfix route explain --config tapfix.toml --request body.json
    """


@route.command("explain")
@click.option(
    "--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path), help="the config"
)
@click.option(
    "--request", "request_path", type=click.Path(dir_okay=False, path_type=Path), help="a request body (JSON)"
)
@click.option("--capture", metavar="ID", help="the request of this capture (its body, path and headers)")
@db_option("with --capture: the capture database, a SQLite file or a postgresql:// URL")
@click.option("--path", default="/v1/chat/completions", show_default=True, help="with --request: the API path")
@click.option("--header", "headers", multiple=True, metavar="K:V", help="a request header (repeatable)")
@click.option("--user-agent", metavar="UA", help="the client's User-Agent")
@json_option("the decision as one JSON object (as the capture's route_decision holds it)")
def explain(
    config_path: Path,
    request_path: Path | None,
    capture: str | None,
    db: StoreLocator,
    path: str,
    headers: tuple[str, ...],
    user_agent: str | None,
    as_json: bool,
) -> None:
    """Print which route a request would take and why the others would not; nothing is sent.

    Exit 1 when the model isn't served or no route can take the request.

    \b
    Example:
      tapfix route explain --config tapfix.toml --request body.json --user-agent claude-cli/2.1
      tapfix route explain --config tapfix.toml --capture 01J9Z3
    """
    from tapfix.proxy.cli.show import route_lines
    from tapfix.proxy.config.file import Config, ConfigError
    from tapfix.proxy.request.routes import Knowledge, decide, facts_of
    from tapfix.proxy.request.routing import RouteError, resolve
    from tapfix.proxy.surfaces import surface_for

    if (request_path is None) == (capture is None):
        raise click.UsageError("give --request FILE or --capture ID")
    try:
        config = Config.load(config_path)
    except ConfigError as e:
        raise UserError(str(e)) from e
    given: dict[str, str] = {}
    if capture is not None:
        body, path, given = _captured(db, capture)
    else:
        assert request_path is not None
        try:
            body = request_path.read_bytes()
        except OSError as e:
            raise UserError(f"{request_path}: cannot read it ({e.strerror or e})") from e
    for header in headers:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{header!r}: expected NAME:VALUE", param_hint="--header")
        given[name.strip().lower()] = value.strip()
    if user_agent is not None:
        given["user-agent"] = user_agent
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise UserError(f"the request is not JSON: {e}") from e
    if not isinstance(parsed, dict):
        raise UserError("the request is not a JSON object")
    found = resolve(config, parsed.get("model"))
    if isinstance(found, RouteError):
        raise UserError(found.message)
    settings, model = found.settings, found.model
    if settings is None or model is None or not settings.routes:
        upstream = found.upstream.name if found.upstream else "-"
        click.echo(f"model {model!r}: no routes; it goes to {upstream}/{found.served_model}")
        return
    facts = facts_of(surface_for(path), parsed, given, model)
    decision = decide(config, settings, found.served_model or model, facts, Knowledge(environ=os.environ))
    record = decision.record()
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(record) + b"\n")
    else:
        click.echo(f"model {model!r} ({settings.name}); upstream model lists and engine windows not asked")
        click.echo("\n".join(route_lines(record)))
        if decision.taken is None:
            click.echo(f"  the client would get: {decision.message()}")
    if decision.taken is None:
        sys.exit(1)


def _captured(db: StoreLocator, capture: str) -> tuple[bytes, str, dict[str, str]]:
    """The capture's request body (decoded as the proxy read it), path and headers."""
    with reported(StoreError):
        reader = db.backend().reader()
        row = reader.load_capture(capture)
        body = reader.capture_body(row, "request")
    headers = {str(k).lower(): str(v) for k, v in row.get("request_headers") or []}
    return body, str(row.get("path") or "/v1/chat/completions"), headers
