"""`tapfix browse`: the capture browser. Registered lazily by the main CLI (`LazyGroup.lazy`).

Kept apart so the command's imports (Starlette, uvicorn, Jinja2) load only when it runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from tapfix.proxy.cli.options import db_option, listen_option
from tapfix.proxy.cli.user_errors import UserError, reported
from tapfix.proxy.net import is_loopback, url
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator

TOKEN_ENV = "TAPFIX_BROWSE_TOKEN"


@click.command()
@db_option()
@listen_option("127.0.0.1:8081")
@click.option(
    "--token",
    default=None,
    metavar="SECRET",
    help=f"required to listen beyond loopback (or set ${TOKEN_ENV}); open the URL once with ?token=SECRET",
)
@click.option(
    "--no-search", is_flag=True, help="no full-text index (it lives in <db>.fts.sqlite; PostgreSQL: always on)"
)
@click.option(
    "--index",
    "index_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="where to keep the full-text index (default: next to the database; PostgreSQL needs none)",
)
def browse(
    db: StoreLocator, listen: tuple[str, int], token: str | None, no_search: bool, index_path: Path | None
) -> None:
    """Browse captures in a web browser: filters, search, diffs, stream timelines, sessions, stats.

    Read-only over the store, so it can run while the proxy writes. Binds to loopback unless told
    otherwise; any other address needs --token (or $TAPFIX_BROWSE_TOKEN). On a PostgreSQL store
    (--db postgresql://...) search uses the columns the writer keeps: no index file.

    \b
    Example:
      tapfix browse --db captures/tapfix.db
      tapfix browse --db postgresql://tapfix@db.internal/tapfix
      TAPFIX_BROWSE_TOKEN=s3cret-token tapfix browse --listen 0.0.0.0:8081
    """
    import uvicorn
    from tapfix.proxy.browse import create_app

    host, port = listen
    token = token or os.environ.get(TOKEN_ENV) or None
    loopback = is_loopback(host)
    if not loopback and not token:
        raise UserError(
            f"--listen {url(host, port).removeprefix('http://')} is reachable beyond this machine: captures hold"
            f" prompts and code, so give a --token (or set {TOKEN_ENV}), or listen on 127.0.0.1"
        )
    with reported(StoreError):  # a missing store, or a search index that can't be kept (next to it by default)
        app = create_app(db, token=token, loopback_only=loopback, search=not no_search, index_path=index_path)
    click.echo(f"tapfix browse: {url(host, port)}/ over {db}" + ("  (token required)" if token else ""), err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


if __name__ == "__main__":  # pragma: no cover
    browse()
