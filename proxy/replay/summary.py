"""Judge a batch of replays: timing, finish, tool-call validity, flags, and how alike the runs are.

The point of replaying N times is to see which runs differ, so every run is compared with the
other runs of the same turn (token-bigram Jaccard: linear, and fair to CJK text, whose characters
count as tokens) and the runs far below the batch's typical similarity are marked as outliers.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text
from tapfix.proxy.assemble.degeneration import tool_call_problems
from tapfix.proxy.replay.client import RunResult
from tapfix.proxy.sse import SSESplitter, event_data

_TOKEN = re.compile(r"[A-Za-z0-9_]+|\S")
OUTLIER_GAP = 0.15  # at least this far below the median similarity of the turn's runs


@dataclass
class RunSummary:
    run: int
    turn: int
    capture_id: str | None
    source_id: str
    status: int | None
    ttft_ms: float | None
    decode_tps: float | None
    completion_tokens: int | None
    finish_reason: str | None
    tools_valid: bool | None  # None: no tool calls
    tool_problems: list[str]
    flags: list[str]
    similarity: float | None = None
    outlier: bool = False
    error: str | None = None
    preview: str = ""
    text: str = field(default="", repr=False)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "text"}
        return out


def summarize(results: list[RunResult]) -> list[RunSummary]:
    rows = [_summarize_one(r) for r in results]
    by_turn: dict[int, list[RunSummary]] = defaultdict(list)
    for row in rows:
        if row.status is not None:
            by_turn[row.turn].append(row)
    for group in by_turn.values():
        _similarities(group)
    return rows


def _summarize_one(result: RunResult) -> RunSummary:
    a = result.assembled
    first, last, events = _token_times(result)
    usage = a.usage if isinstance(a.usage, dict) else {}
    tokens = usage.get("completion_tokens", usage.get("output_tokens"))
    if not isinstance(tokens, int):
        tokens = events or None
    tps = None
    if first is not None and last is not None and last > first and tokens and tokens > 1:
        tps = (tokens - 1) / (last - first)
    elif first is None and tokens and result.duration and result.first_byte is not None:
        tps = tokens / max(1e-6, result.duration)  # not streamed: the whole exchange, prefill included
    problems = tool_call_problems(a.tool_calls, result.request.tools) if a.tool_calls else []
    calls = " ".join(f"{c.get('name')}({c.get('arguments')})" for c in a.tool_calls)
    text = (a.content + ("\n" + calls if calls else "")).strip()
    return RunSummary(
        run=result.run,
        turn=result.turn,
        capture_id=result.capture_id,
        source_id=result.request.source_id,
        status=result.status,
        ttft_ms=None if first is None else round(first * 1000, 1),
        decode_tps=None if tps is None else round(tps, 1),
        completion_tokens=tokens,
        finish_reason=a.finish_reason,
        tools_valid=None if not a.tool_calls else not problems,
        tool_problems=problems,
        flags=sorted(result.flags),
        error=result.error,
        preview=problems[0] if problems else _preview(text, result.flags),
        text=text,
    )


def _preview(text: str, flags: set[str]) -> str:
    """The start of the answer, or its end when it degenerated: that is where it went wrong."""
    flat = " ".join(text.split())
    if flags & {"script_drift", "repetition_loop", "runaway_length"} and len(flat) > 60:
        return "…" + flat[-59:]
    return flat[:60]


def _token_times(result: RunResult) -> tuple[float | None, float | None, int]:
    """(first token, last token) in seconds after sending, and the number of token-carrying events."""
    if "event-stream" not in result.content_type:
        return None, None, 0
    splitter = SSESplitter()
    first = last = None
    count = 0
    for chunk, at in zip(result.chunks, result.chunk_times, strict=False):
        for event in splitter.feed(chunk):
            if _carries_token(event):
                count += 1
                first = at if first is None else first
                last = at
    return first, last, count


def _carries_token(event: bytes) -> bool:
    data = event_data(event)
    if not data or data.strip() == b"[DONE]":
        return False
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    for choice in obj.get("choices") or () if isinstance(obj, dict) else ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and any(
            delta.get(k) for k in ("content", "reasoning", "reasoning_content", "tool_calls")
        ):
            return True
        if isinstance(choice, dict) and choice.get("text"):
            return True
    return False


def bigrams(text: str) -> set[tuple[str, str]]:
    tokens = _TOKEN.findall(text)
    if len(tokens) < 2:
        return {(t, "") for t in tokens}
    return set(zip(tokens, tokens[1:], strict=False))


def jaccard(a: set[Any], b: set[Any]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def _similarities(group: list[RunSummary]) -> None:
    """Mean similarity of each run to the others; outliers are far below the turn's median."""
    if len(group) < 2:
        return
    grams = [bigrams(row.text) for row in group]
    for i, row in enumerate(group):
        others = [jaccard(grams[i], grams[j]) for j in range(len(group)) if j != i]
        row.similarity = round(sum(others) / len(others), 3)
    if len(group) < 3:
        return
    values = [row.similarity for row in group if row.similarity is not None]
    median = statistics.median(values)
    spread = statistics.median(abs(v - median) for v in values)
    for row in group:
        row.outlier = row.similarity is not None and row.similarity < median - max(OUTLIER_GAP, 3 * spread)


# --- output -----------------------------------------------------------------------------------


def render(
    rows: list[RunSummary],
    console: Console,
    *,
    source_flags: dict[str, list[str]] | None = None,
    interrupted: bool = False,
    total: int | None = None,
) -> None:
    """The summary table, then one line of totals (and the source's flags, to compare)."""
    table = Table(title="tapfix replay", title_justify="left", header_style="bold")
    sessions = len({row.turn for row in rows}) > 1
    for name in (
        "run",
        *(["turn"] if sessions else []),
        "capture",
        "status",
        "TTFT ms",
        "tok/s",
        "finish",
        "tools",
        "flags",
        "similar",
        "output",
    ):
        table.add_column(
            name,
            justify="right" if name in ("run", "turn", "TTFT ms", "tok/s", "similar") else "left",
            no_wrap=name != "flags",
            overflow="ellipsis",
            max_width=36 if name == "output" else None,
        )
    for row in rows:
        status = Text(
            str(row.status) if row.status is not None else "error",
            style="green" if row.status and row.status < 400 else "red",
        )
        tools = "-" if row.tools_valid is None else ("valid" if row.tools_valid else "INVALID")
        similar = Text(
            "-" if row.similarity is None else f"{row.similarity:.2f}",
            style="bold red" if row.outlier else "",
        )
        if row.outlier:
            similar.append(" outlier", style="bold red")
        table.add_row(
            str(row.run),
            *([str(row.turn + 1)] if sessions else []),
            row.capture_id or "-",
            status,
            _num(row.ttft_ms),
            _num(row.decode_tps),
            row.finish_reason or "-",
            Text(tools, style="red" if row.tools_valid is False else ""),
            Text(", ".join(row.flags) or "-", style="yellow" if row.flags else ""),
            similar,
            Text(row.error or row.preview, style="red" if row.error else "dim"),
        )
    console.print(table)
    console.print(totals_line(rows, source_flags=source_flags, interrupted=interrupted, total=total))


def totals_line(
    rows: list[RunSummary],
    *,
    source_flags: dict[str, list[str]] | None = None,
    interrupted: bool = False,
    total: int | None = None,
) -> str:
    done = len(rows)
    ok = sum(1 for r in rows if r.status is not None and r.status < 400 and not r.error)
    flagged: dict[str, int] = defaultdict(int)
    for row in rows:
        for flag in row.flags:
            flagged[flag] += 1
    parts = [
        f"{done} run{'s' if done != 1 else ''}" + (f" of {total}" if total and total != done else ""),
        f"{ok} ok",
    ]
    if flagged:
        parts.append("flagged: " + ", ".join(f"{name} ×{n}" for name, n in sorted(flagged.items())))
    invalid = sum(1 for r in rows if r.tools_valid is False)
    if invalid:
        parts.append(f"invalid tool calls: {invalid}")
    outliers = [f"#{r.run}" + (f".{r.turn + 1}" if r.turn else "") for r in rows if r.outlier]
    if outliers:
        parts.append("outliers: " + " ".join(outliers))
    if source_flags:
        shown = {", ".join(flags) or "none" for flags in source_flags.values()}
        parts.append("source flags: " + "; ".join(sorted(shown)))
    if interrupted:
        parts.append("interrupted (Ctrl-C): finished runs kept")
    return "; ".join(parts)


def _num(value: float | None) -> str:
    return "-" if value is None else (f"{value:.0f}" if value >= 100 else f"{value:.1f}")
