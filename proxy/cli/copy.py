"""`tapfix captures copy --from LOCATOR --to LOCATOR`: move a store between SQLite and PostgreSQL (store/copy.py).

Registered under the `captures` group. Progress goes to stderr, the summary to stdout (`--json`: one
object). Every refusal (a clash, a schema mismatch, the same store twice) happens before anything is
written; a copy that fails half way keeps what it committed, whole captures only, for `--resume`.
"""

from __future__ import annotations

import sys

import click
import orjson
from tapfix.proxy.cli.options import json_option
from tapfix.proxy.cli.user_errors import UserError
from tapfix.proxy.store.copy import BATCH, copy_stores
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator


@click.command("copy")
@click.option(
    "--from", "source", metavar="LOCATOR", required=True, help="the store to copy: a SQLite path or postgresql://..."
)
@click.option("--to", "target", metavar="LOCATOR", required=True, help="the store to copy into (made when new)")
@click.option("--resume", is_flag=True, help="continue an interrupted copy: skip the captures the target has")
@click.option("--batch", type=click.IntRange(min=1), default=BATCH, show_default=True, help="captures per transaction")
@json_option("print the summary as one JSON object")
def copy(source: str, target: str, resume: bool, batch: int, as_json: bool) -> None:
    """Copy every capture, its bodies (byte-exact), changes, choices and sessions into another store.

    Capture ids, times, changes and sessions are kept; body ids are the target's, and the target
    stores bodies in its own encoding. The target must be empty or share no capture id with the
    source (a clash is refused, naming the first), and both must be at this tapfix's schema. At the
    end every body is read back from the target and checked by sha256 against the source.

    \b
    Example:
      tapfix captures copy --from captures/tapfix.db --to postgresql://tapfix@db/tapfix
      tapfix captures copy --from postgresql://tapfix@db/tapfix --to team.db --resume
    """
    try:
        src = StoreLocator.resolve(source, postgres=True).backend()
        dst = StoreLocator.resolve(target, postgres=True).backend()
    except StoreError as e:
        raise UserError(str(e)) from e
    if src.same_store(dst):
        raise UserError(f"--from and --to are the same store ({src.location})")
    try:
        report = copy_stores(src, dst, resume=resume, batch=batch)
    except StoreError as e:
        raise UserError(str(e)) from None
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(vars(report)) + b"\n")
    else:
        click.echo(str(report))
