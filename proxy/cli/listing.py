"""What `captures list` and `captures tail` share: their filters, their `--json` line, and how an attempt
is marked under its client request. One home, so the two commands stay alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
import orjson
from tapfix.proxy.store.reader import CaptureFilter


def filter_options[F: Callable[..., Any]](f: F) -> F:
    """The filters `captures list` and `captures tail` share (`reader.CaptureFilter`), as one `filters` argument."""

    @functools.wraps(f)
    def command(*args: Any, **kw: Any) -> Any:
        kw["filters"] = CaptureFilter(*(kw.pop(key) for key in ("flag", "tag", "session", "trace", "route")))
        return f(*args, **kw)

    for option in reversed(
        (
            click.option(
                "--flag", metavar="F", help="only exchanges with this flag (e.g. runaway_length, regenerated)"
            ),
            click.option("--tag", metavar="T", help="only exchanges with this tag (probe, replay)"),
            click.option("--session", metavar="SID", help="only this agent session"),
            click.option(
                "--trace", metavar="TRACE_ID", help="only this W3C trace (32 hex digits, as tracing shows it)"
            ),
            click.option("--route", metavar="NAME", help="only exchanges that took this route (docs/routing.md)"),
        )
    ):
        command = option(command)
    return command  # type: ignore[return-value]  # functools.wraps keeps f's signature


def json_row(row: dict[str, Any]) -> bytes:
    """One `--json` line of `list` and `tail`."""
    return orjson.dumps(row) + b"\n"


def marked(row: dict[str, Any]) -> dict[str, Any]:
    """An attempt listed under its parent reads `  ↳2 ID`: the attempt number, then its own id."""
    if row.get("attempt_of") is None:
        return row
    return {**row, "id": f"  ↳{row['attempt']} {row['id']}"}
