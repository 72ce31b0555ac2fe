"""`tapfix captures stats`: the token-volume report (issue 38), to route by what is actually spent.

Registered under the `captures` group (`captures.add_command(stats)`). Read-only; the store groups and
sums (store/volume.py through `CaptureReader.token_volume`), so it answers over 10^6 captures in
seconds on either backend (bench/stats.py).
"""

from __future__ import annotations

import sys
from typing import Any

import click
import orjson
from tapfix.proxy.cli.options import db_option, json_option
from tapfix.proxy.cli.user_errors import reported
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.filters import FilterError, Filters, parse_time
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.volume import COUNTS, GROUP_FIELDS, TIMINGS, GroupError, parse_by

# Text columns after the group's fields: (header, key, how to show it)
COLUMNS = (
    ("REQUESTS", "requests", "n"),
    ("ATTEMPTS", "attempts", "n"),
    ("INPUT", "input_tokens", "n"),
    ("CACHED", "cached_input_tokens", "n"),
    ("OUTPUT", "output_tokens", "n"),
    ("REASONING", "reasoning_tokens", "n"),
    ("ERRORS", "errors", "n"),
    ("REPAIRS", "repairs", "n"),
    ("TTFT P50", "ttft_ms_p50", "ms"),
    ("TTFT P95", "ttft_ms_p95", "ms"),
    ("TOK/S P50", "decode_tps_p50", "rate"),
)


@click.command("stats")
@db_option()
@click.option(
    "--since", default="7d", show_default=True, help="from this long ago (15m, 2h, 7d) or an ISO time; '' = all"
)
@click.option("--until", default="", help="up to this long ago or ISO time (default: now)")
@click.option(
    "--by",
    default="model",
    show_default=True,
    metavar="FIELDS",
    help=f"group by these, comma-separated: {', '.join(GROUP_FIELDS)}",
)
@json_option("one JSON object a line per group: its fields by name, `requests` and the token sums")
def stats(db: StoreLocator, since: str, until: str, by: str, as_json: bool) -> None:
    """Token volume per group: requests, tokens, errors, repairs, speed.

    Per group: client requests and regeneration/fallback attempts; input, cached input, output and
    reasoning tokens as the upstream reported them (attempts' tokens count where they went); errors
    (no status, HTTP >= 400, or an engine error); repairs (exchanges with a tool call repaired);
    median and 95th percentile time to first token; median decode rate (output tokens per second
    after the first). `upstream` is the upstream's host:port, `client` the User-Agent's product
    (`opencode`, `claude-cli`, `OpenAI/Python`), `route` the route taken (empty without routes).

    \b
    Example:
      tapfix captures stats --since 24h --by route,upstream
      tapfix captures stats --by client --json
    """
    try:
        fields = parse_by(by)
        for value in (since, until):
            if value:
                parse_time(value)
    except (GroupError, FilterError) as e:
        raise click.UsageError(str(e)) from None
    f = Filters(since=since, until=until)
    with reported(StoreError):
        reader = db.backend().reader()
        with reader:
            groups = reader.token_volume(f, fields)
    if as_json:
        out = sys.stdout.buffer
        for group in groups:
            out.write(orjson.dumps({name: group[name] for name in (*fields, *COUNTS, *TIMINGS)}) + b"\n")
        out.flush()
        return
    click.echo(volume_table(groups, fields) if groups else f"no captures {_span(since, until)}")


def _span(since: str, until: str) -> str:
    if not since and not until:
        return "in this store"
    return " ".join(part for part in (f"since {since}" if since else "", f"until {until}" if until else "") if part)


def volume_table(groups: list[dict[str, Any]], fields: tuple[str, ...]) -> str:
    """The report as a plain-text table, numbers right-aligned, a total line under several groups."""
    header = [name.upper() for name in fields] + [h for h, _, _ in COLUMNS]
    rows = [[str(g[name]) if g[name] is not None else "-" for name in fields] + _cells(g) for g in groups]
    if len(groups) > 1:
        total = {key: sum(g[key] for g in groups) for _, key, kind in COLUMNS if kind == "n"}
        rows.append(["TOTAL"] + [""] * (len(fields) - 1) + _cells(total))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    keys = len(fields)

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < keys else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join(line(row).rstrip() for row in [header, *rows])


def _cells(g: dict[str, Any]) -> list[str]:
    out = []
    for _, key, kind in COLUMNS:
        value = g.get(key)
        if value is None:
            out.append("-")
        elif kind == "n":
            out.append(f"{value:,}")
        elif kind == "ms":
            out.append(f"{value / 1000:.2f}s" if value >= 1000 else f"{value:.0f}ms")
        else:
            out.append(f"{value:.1f}")
    return out
