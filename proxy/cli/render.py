"""Plain-text tables for the terminal: `captures list` (one table, fitted to its rows) and `captures tail`
(the same columns, one line at a time, in fixed widths since the rows to come are unknown)."""

from __future__ import annotations

from typing import Any

HEADER = ("ID", "TIME (UTC)", "METHOD", "PATH", "MODEL", "STATUS", "TTFT", "CHG", "FLAGS", "CLIENT")
# What `captures tail` pads each column to (a longer value pushes the rest of its line along); the ID
# column fits an attempt's `  ↳N ` before its id.
TAIL_WIDTHS = (21, 19, 6, 22, 18, 6, 7, 3, 18, 30)


def capture_cells(r: dict[str, Any]) -> tuple[str, ...]:
    """One row of `captures list` / `captures tail`, as the text of each column of HEADER."""
    ttft = "-" if r.get("first_token_ms") is None else f"{r['first_token_ms']:.0f}ms"
    return (
        r["id"],
        _when(r.get("started_at") or ""),
        r.get("method") or "",
        r.get("path") or "",
        r.get("model") or "-",
        str(r.get("status") or "-"),
        ttft,
        str(r.get("changes") or 0),
        ",".join(r.get("flags") or []) or "-",
        (r.get("user_agent") or "-")[:30],
    )


def captures_table(rows: list[dict[str, Any]], empty: str = "no captures yet") -> str:
    """`empty` is what an empty list means: a new store, or filters that matched nothing."""
    if not rows:
        return empty
    table = [HEADER, *(capture_cells(r) for r in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    return "\n".join(_line(row, widths) for row in table)


def tail_line(cells: tuple[str, ...]) -> str:
    """HEADER or a row's `capture_cells`, in the tail's fixed widths."""
    return _line(cells, TAIL_WIDTHS)


def _line(cells: tuple[str, ...], widths: tuple[int, ...] | list[int]) -> str:
    return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()


def _when(started_at: str) -> str:
    """`2026-05-01 13:15:34` from the ISO 8601 UTC `started_at`: a store spans days, so the date shows."""
    return f"{started_at[:10]} {started_at[11:19]}".strip()
