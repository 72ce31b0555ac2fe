"""`tapfix browse`: the capture browser. Registered by the main CLI with `main.add_command(browse)`.

Kept out of `cli.py` so the command's imports (Starlette, uvicorn, Jinja2) load only when it runs.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import click
from tapfix.proxy.config.settings import parse_listen
from tapfix.proxy.store.writer import StoreError, default_db_path

TOKEN_ENV = "TAPFIX_BROWSE_TOKEN"


@click.command()
@click.option(
    "--db",
    "db",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="capture database (default: $TAPFIX_DB or captures/tapfix.db)",
)
@click.option("--listen", default="127.0.0.1:8081", show_default=True, metavar="HOST:PORT")
@click.option(
    "--token",
    default=None,
    metavar="SECRET",
    help=f"required to listen beyond loopback (or set ${TOKEN_ENV}); open the URL once with ?token=SECRET",
)
@click.option("--no-search", is_flag=True, help="no full-text index (it lives in <db>.fts.sqlite)")
@click.option(
    "--index",
    "index_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="where to keep the full-text index (default: next to the database)",
)
def browse(db: Path | None, listen: str, token: str | None, no_search: bool, index_path: Path | None) -> None:
    """Browse captures in a web browser: filters, search, diffs, stream timelines, sessions, stats.

    Read-only over the store, so it can run while the proxy writes. Binds to loopback unless told
    otherwise; any other address needs --token (or $TAPFIX_BROWSE_TOKEN).
    """
    import uvicorn
    from tapfix.proxy.browse import create_app
    from tapfix.proxy.browse.security import is_loopback

    try:
        host, port = parse_listen(listen, 8081)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--listen") from e
    token = token or os.environ.get(TOKEN_ENV) or None
    loopback = is_loopback(host)
    if not loopback and not token:
        raise click.ClickException(
            f"--listen {listen} is reachable beyond this machine: captures hold prompts and"
            f" code, so give a --token (or set {TOKEN_ENV}), or listen on 127.0.0.1"
        )
    path = db or default_db_path()
    try:
        app = create_app(
            path, token=token, loopback_only=loopback, search=not no_search, index_path=index_path
        )
    except StoreError as e:
        raise click.ClickException(str(e)) from e
    except (OSError, sqlite3.Error) as e:  # the search index's file, next to the db by default
        raise click.ClickException(
            f"can't keep the search index ({e}): pass --index PATH somewhere writable, or --no-search"
        ) from e
    shown = f"[{host}]" if ":" in host else host
    click.echo(
        f"tapfix browse: http://{shown}:{port}/ over {path}" + ("  (token required)" if token else ""),
        err=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


if __name__ == "__main__":  # pragma: no cover
    browse()
