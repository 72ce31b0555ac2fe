"""`tapfix replay`: the command line of client-side replay (registered by `cli.py`).

Everything that can be wrong with the input (database, id, --set, key, upstream) is checked
before the first byte is written, so a bad invocation leaves the database as it was. Exit codes:
0 every run got a 2xx answer, 1 some run failed (HTTP error, broken connection, store failure),
2 bad input or an unreachable upstream, 130 interrupted (the finished runs are kept).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tapfix.proxy.cli.options import db_option, json_option, key_env_option, timeout_option
from tapfix.proxy.cli.user_errors import InputError
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator


@click.command()
@click.argument("capture_id", required=False)
@db_option()
@click.option("--upstream", metavar="URL", help="send here (default: the capture's upstream origin)")
@click.option("--times", "-n", type=click.IntRange(min=1), default=1, show_default=True, help="runs")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="runs in flight at once",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="change a body key (JSON value if it parses, else text; dotted keys nest); repeatable",
)
@click.option("--unset", "unsets", multiple=True, metavar="KEY", help="remove a body key; repeatable")
@click.option("--original", "which", flag_value="request", help="resend the client's original body")
@click.option(
    "--forwarded",
    "which",
    flag_value="forwarded",
    default=True,
    help="resend the body as tapfix forwarded it (default)",
)
@key_env_option("send the API key in this environment variable")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="take the key variable and TLS settings of the matching upstream from this config",
)
@click.option("--session", "session_id", metavar="SID", help="replay a whole agent session, turn by turn")
@timeout_option(600.0, "seconds without a byte")
@json_option("one JSON object per run on stdout instead of a table")
def replay(
    capture_id: str | None,
    db: StoreLocator,
    upstream: str | None,
    times: int,
    concurrency: int,
    sets: tuple[str, ...],
    unsets: tuple[str, ...],
    which: str,
    key_env: str | None,
    config_path: Path | None,
    session_id: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Resend a captured request (or a whole session) N times and compare the runs.

    Each run is stored as a capture tagged `replay`, linked to its source. A summary table shows,
    per run: status, time to first token, decode speed, finish reason, tool-call validity, flags,
    and similarity to the other runs (outliers highlighted). Ctrl-C keeps the finished runs.

    \b
    Example:
      tapfix replay 01J9Z3 --times 5 --concurrency 5
      tapfix replay 01J9Z3 --set temperature=0 --upstream http://127.0.0.1:8001
    """
    from tapfix.proxy.replay.client import build_request, check_reachable, session_capture_ids
    from tapfix.proxy.replay.edits import ReplayError, parse_edits
    from tapfix.proxy.store.errors import CaptureNotFound

    if bool(capture_id) == bool(session_id):
        raise click.UsageError("give a capture ID or --session SID (one of them)")
    try:
        reader = db.backend().reader()
        try:
            ids = session_capture_ids(reader, session_id) if session_id else [capture_id or ""]
            edits = parse_edits(sets, unsets)
            credential, verify = _credentials(key_env, config_path, reader, ids[0], upstream)
            turns = [
                build_request(reader, cid, which=which, edits=edits, upstream=upstream, credential=credential)
                for cid in ids
            ]
        finally:
            reader.close()
        asyncio.run(check_reachable(turns[0].url))
    except (StoreError, CaptureNotFound, ReplayError) as e:
        raise InputError(str(e)) from e
    sys.exit(_run(db, turns, times, concurrency, timeout, verify, as_json))


def _credentials(
    key_env: str | None, config_path: Path | None, reader: Any, first_id: str, upstream: str | None
) -> tuple[tuple[str, str] | None, bool | str]:
    """From --key-env, else from the config's upstream serving that origin: (credential, verify)."""
    from tapfix.proxy.replay.client import credential_from_env
    from tapfix.proxy.replay.edits import ReplayError

    verify: bool | str = True
    if config_path is not None:
        from urllib.parse import urlsplit

        from tapfix.proxy.config.file import ConfigError, load

        try:
            config = load(config_path)
        except ConfigError as e:
            raise ReplayError(str(e)) from e
        stored = upstream or reader.load_capture(first_id).get("upstream_url") or ""
        origin = urlsplit(stored)
        for item in config.upstreams.values():
            base = urlsplit(item.base_url)
            if (base.scheme, base.netloc) == (origin.scheme, origin.netloc):
                key_env = key_env or item.api_key_env
                verify = False if item.insecure else (item.ca_file or True)
                break
    return credential_from_env(key_env), verify


def _run(
    db: StoreLocator,
    turns: list[Any],
    times: int,
    concurrency: int,
    timeout: float,
    verify: bool | str,
    as_json: bool,
) -> int:
    from tapfix.proxy.replay.client import run_replays
    from tapfix.proxy.replay.summary import render, summarize

    try:
        writer = db.backend().writer()
    except StoreError as e:
        raise InputError(str(e)) from e
    err = Console(stderr=True)
    progress = Progress(
        TextColumn("replay"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=err,
        transient=True,
    )
    task = progress.add_task("", total=times * len(turns))

    def on_result(result: Any) -> None:
        state = f"run {result.run}: {result.status or 'error'}" + (
            f" {','.join(sorted(result.flags))}" if result.flags else ""
        )
        progress.update(task, advance=1, description=state)

    try:
        with progress:
            outcome = asyncio.run(
                run_replays(
                    turns,
                    times,
                    concurrency,
                    submit=writer.submit,
                    on_result=on_result,
                    timeout=timeout,
                    verify=verify,
                )
            )
    finally:
        writer.close()
    rows = summarize(outcome.results)
    if as_json:
        out = sys.stdout.buffer
        for row in rows:
            out.write(orjson.dumps(row.as_dict()) + b"\n")
        out.flush()
    else:
        sources = {t.source_id: t.source.get("flags") or [] for t in turns}
        render(
            rows,
            Console(width=None if sys.stdout.isatty() else 160),
            source_flags=sources,
            interrupted=outcome.interrupted,
            total=times * len(turns),
        )
    if writer.stats.failures:
        err.print(
            f"[red]tapfix replay: {writer.stats.failures} run(s) could not be stored: {writer.stats.last_error}[/red]"
        )
        return 1
    if outcome.interrupted:
        return 130
    if not rows or any(r.status is None or r.status >= 400 or r.error for r in rows):
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - `python -m tapfix.proxy.cli.replay` before registration
    replay()
