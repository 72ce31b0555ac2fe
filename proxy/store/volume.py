"""The token-volume report (issue 38: `tapfix captures stats`, the browser's stats page): per group of
exchanges, how many requests and tokens, how many failed or were repaired, and how fast they answered.

Why SQL and one logic: the report runs over a whole store (10^6 captures), so the database groups and
sums over columns (the writer stores the token counts as columns: store/exchange_row.py); the
statements are built here once from a backend's `Dialect` (its spelling of a group's field, of its
filters, of a repair, of an hour) and each backend answers them (`CaptureReader.token_volume`).

What is counted: every exchange row, regeneration attempts and fallbacks included (each went upstream
and spent its tokens on its own route); `requests` counts client requests, `attempts` the rest.
Percentiles are nearest-rank (the value at rank ceil(p*n) of the group's sorted values), exact on both
backends: PostgreSQL's `percentile_disc`; SQLite has no percentile aggregate, so the two numbers per
answer are read (from the report's covering index, unsorted) and sorted per group here.
"""

from __future__ import annotations

import array
import ipaddress
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tapfix.proxy.store.filters import ERRORS, Filters

GROUP_FIELDS = ("model", "route", "upstream", "client", "session")
SUMS = ("input_tokens", "cached_input_tokens", "output_tokens", "reasoning_tokens")
COUNTS = ("requests", "attempts", *SUMS, "errors", "repairs")
TIMINGS = ("ttft_ms_p50", "ttft_ms_p95", "decode_tps_p50")
# Tokens per second of the answer after its first token; only where it took more than a millisecond.
DECODE_RATE = (
    "case when e.completion_tokens > 0 and e.duration_ms - e.first_token_ms > 1"
    " then e.completion_tokens * 1000.0 / (e.duration_ms - e.first_token_ms) end"
)
# Columns a store written before this report (or before regeneration) lacks, by type: read as null there.
LATE_COLUMNS = {"route": "text", "cached_tokens": "integer", "reasoning_tokens": "integer", "attempt_of": "text"}

Rows = Callable[[str, Sequence[Any]], list[dict[str, Any]]]
Values = Callable[[str, Sequence[Any]], Iterable[Sequence[Any]]]  # a statement's rows as tuples, one at a time


class GroupError(ValueError):
    """A `--by` the report can't group by; the message lists what it can."""


def parse_by(text: str) -> tuple[str, ...]:
    """`model,route` → ("model", "route"); unknown or repeated fields are a `GroupError`."""
    fields = tuple(part.strip().lower() for part in text.split(",") if part.strip())
    unknown = [name for name in fields if name not in GROUP_FIELDS]
    if unknown or not fields:
        raise GroupError(f"can't group by {', '.join(unknown) or repr(text)}: use any of {', '.join(GROUP_FIELDS)}")
    if len(set(fields)) < len(fields):
        raise GroupError(f"--by {text}: a field is named twice")
    return fields


def client_product(user_agent: str | None) -> str | None:
    """The client a User-Agent names: its first word without a version (`opencode/0.4.1 ai-sdk/...` →
    `opencode`, `claude-cli/2.0.1 (external, cli)` → `claude-cli`), but a product path is kept
    (`OpenAI/Python 1.99` → `OpenAI/Python`). Each backend's SQL says the same (`Dialect.fields`)."""
    if not user_agent:
        return None
    word = user_agent.split(" ", 1)[0]
    slash = word.find("/")
    if slash >= 0 and word[slash + 1 : slash + 2].isdigit() and word[slash + 1 : slash + 2].isascii():
        return word[:slash]
    return word


def upstream_host(upstream_url: str | None) -> str | None:
    """The upstream an exchange went to, as `host:port` of its URL (None: tapfix answered it itself)."""
    if not upstream_url or "://" not in upstream_url:
        return None
    return upstream_url.split("://", 1)[1].split("/", 1)[0] or None


def is_local(host: str | None) -> bool:
    """An upstream on this machine or its network: loopback, a private or link-local address, `localhost`,
    a `.local`/`.internal`/`.lan` name, or a one-label name (a container's service name such as `vllm`)."""
    if not host:
        return False
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]").lower()
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return name == "localhost" or "." not in name or name.endswith((".localhost", ".local", ".internal", ".lan"))
    return address.is_loopback or address.is_private or address.is_link_local


@dataclass(frozen=True)
class Dialect:
    """How one backend spells what the report's statements need, on `exchanges e`."""

    fields: Mapping[str, str]  # each of GROUP_FIELDS as an SQL expression
    where: Callable[[Filters], tuple[list[str], list[Any]]]  # the browser's filters (store/*/filters.py)
    repaired: str  # a condition: the exchange had a tool call repaired (a `toolcalls` change)
    hour: str  # the start of the exchange's hour, unix seconds (an integer)
    columns: frozenset[str]  # the columns the store's exchanges have (one of LATE_COLUMNS it lacks reads as null)
    source: str = "exchanges e"  # what the report reads (SQLite: its covering index)
    percentile: Callable[[float, str], str] | None = None  # an aggregate of (fraction, value); None: fetched
    # Fields whose SQL (`fields`) gives the stored column, turned into the field here and the groups merged:
    # SQLite spends more on the string functions than on the whole sum. Only with fetched percentiles.
    derive: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)

    def column(self, name: str) -> str:
        return f"e.{name}" if name in self.columns else f"cast(null as {LATE_COLUMNS[name]})"

    def field(self, name: str) -> str:
        """A group field's SQL (`fields`); one kept in a column a store may lack (`route`) is null there."""
        return self.column(name) if name in LATE_COLUMNS else self.fields[name]


def token_volume(rows: Rows, values: Values, d: Dialect, f: Filters, by: Sequence[str]) -> list[dict[str, Any]]:
    """One dict per group: its fields by name (None where the exchanges have none), COUNTS and TIMINGS
    (None without data); the groups with the most tokens first."""
    cond, args = d.where(f)
    keys = [f"{d.field(name)} as {name}" for name in by]
    client_request = f"{d.column('attempt_of')} is null"
    sums = [
        f"sum(case when {client_request} then 1 else 0 end) as requests",
        f"sum(case when {client_request} then 0 else 1 end) as attempts",
        "coalesce(sum(e.prompt_tokens), 0) as input_tokens",
        f"coalesce(sum({d.column('cached_tokens')}), 0) as cached_input_tokens",
        "coalesce(sum(e.completion_tokens), 0) as output_tokens",
        f"coalesce(sum({d.column('reasoning_tokens')}), 0) as reasoning_tokens",
        f"sum(case when {ERRORS} then 1 else 0 end) as errors",
        f"sum(case when e.changes_count > 0 then case when {d.repaired} then 1 else 0 end else 0 end) as repairs",
    ]
    if d.percentile is not None:
        sums += [
            f"{d.percentile(0.5, 'e.first_token_ms')} as ttft_ms_p50",
            f"{d.percentile(0.95, 'e.first_token_ms')} as ttft_ms_p95",
            f"{d.percentile(0.5, DECODE_RATE)} as decode_tps_p50",
        ]
    where = f" where {' and '.join(cond)}" if cond else ""
    grouping = f" group by {', '.join(str(i + 1) for i in range(len(by)))}" if by else ""
    sql = f"select {', '.join([*keys, *sums])} from {d.source}{where}{grouping}"
    assert d.percentile is None or not d.derive, "a derived field's groups can't merge percentile aggregates"
    keyed = _keyed(d, by)
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows(sql, args):
        group = _counts(row)
        key = keyed(tuple(group[name] for name in by))
        group.update(zip(by, key, strict=True))
        if key in merged:
            for name in COUNTS:
                merged[key][name] += group[name]
        else:
            merged[key] = group
    groups = list(merged.values())
    if d.percentile is None:
        _fetched_percentiles(values, d, cond, args, by, keyed, merged)
    groups = [g for g in groups if g["requests"] or g["attempts"]]  # no exchange: no group (a total over none)
    return sorted(groups, key=lambda g: (-(g["input_tokens"] + g["output_tokens"]), -g["requests"], _order(g, by)))


def _keyed(d: Dialect, by: Sequence[str]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """A group's key as read (stored columns for derived fields) → its key by field, each derived once."""
    derive = [d.derive.get(name) for name in by]
    if not any(derive):
        return lambda key: key
    seen: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def keyed(key: tuple[Any, ...]) -> tuple[Any, ...]:
        done = seen.get(key)
        if done is None:
            done = seen[key] = tuple(v if fn is None else fn(v) for fn, v in zip(derive, key, strict=True))
        return done

    return keyed


def _counts(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for name in COUNTS:
        out[name] = int(out[name] or 0)
    for name in TIMINGS:
        out[name] = None if out.get(name) is None else float(out[name])
    return out


def _order(group: Mapping[str, Any], by: Sequence[str]) -> tuple[tuple[bool, str], ...]:
    return tuple((group[name] is None, str(group[name])) for name in by)


def _fetched_percentiles(
    values: Values,
    d: Dialect,
    cond: list[str],
    args: list[Any],
    by: Sequence[str],
    keyed: Callable[[tuple[Any, ...]], tuple[Any, ...]],
    by_key: dict[tuple[Any, ...], dict[str, Any]],
) -> None:
    """TTFT p50/p95 and decode rate p50 of each group where the database has no percentile aggregate
    (SQLite): its keys and two numbers per answer, unsorted (the cheapest read: measured against window
    ranks, which cost SQLite 3x as much), kept per group as doubles and sorted here."""
    found: dict[tuple[Any, ...], tuple[array.array[float], array.array[float]]] = {}
    keys = [d.field(name) for name in by]
    where = " and ".join([*cond, "e.first_token_ms is not null"])
    sql = f"select {', '.join([*keys, 'e.first_token_ms', DECODE_RATE])} from {d.source} where {where}"
    width = len(by)
    for row in values(sql, args):
        key = keyed(tuple(row[:width]))
        lists = found.get(key)
        if lists is None:
            lists = found[key] = (array.array("d"), array.array("d"))
        lists[0].append(row[width])
        if row[width + 1] is not None:
            lists[1].append(row[width + 1])
    for key, (ttfts, rates) in found.items():
        group = by_key.get(key)
        if group is not None:
            ordered, ordered_rates = sorted(ttfts), sorted(rates)
            group["ttft_ms_p50"], group["ttft_ms_p95"] = nearest_rank(ordered, 0.5), nearest_rank(ordered, 0.95)
            group["decode_tps_p50"] = nearest_rank(ordered_rates, 0.5)


def nearest_rank(ordered: Sequence[float], p: float) -> float | None:
    """The value at rank ceil(p * n) of sorted values, in floating point as PostgreSQL's `percentile_disc`
    computes it (0.95 * 20 is a hair above 19: rank 20); None for none."""
    if not ordered:
        return None
    return float(ordered[max(1, math.ceil(p * len(ordered))) - 1])


def volume_by_hour(rows: Rows, d: Dialect, f: Filters) -> list[dict[str, Any]]:
    """Per hour (unix seconds of its start), route and upstream host: requests and tokens (input + output),
    oldest first: what the stats page draws over time."""
    cond, args = d.where(f)
    where = f" where {' and '.join(cond)}" if cond else ""
    sql = (
        f"select {d.hour} as hour, {d.column('route')} as route, {d.field('upstream')} as upstream,"
        f" sum(case when {d.column('attempt_of')} is null then 1 else 0 end) as requests,"
        " coalesce(sum(e.prompt_tokens), 0) + coalesce(sum(e.completion_tokens), 0) as tokens"
        f" from {d.source}{where} group by 1, 2, 3 order by 1, 2, 3"
    )
    keyed = _keyed(d, ("upstream",))
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows(sql, args):
        (upstream,) = keyed((r["upstream"],))
        key = (int(r["hour"]), r["route"], upstream)
        found = merged.setdefault(
            key, {"hour": key[0], "route": key[1], "upstream": upstream, "requests": 0, "tokens": 0}
        )
        found["requests"] += int(r["requests"] or 0)
        found["tokens"] += int(r["tokens"] or 0)
    return sorted(merged.values(), key=lambda r: (r["hour"], r["route"] or "", r["upstream"] or ""))
