"""Plain-text tables for the terminal."""

from __future__ import annotations

from typing import Any


def captures_table(rows: list[dict[str, Any]], empty: str = "no captures yet") -> str:
    """`empty` is what an empty list means: a new store, or filters that matched nothing."""
    if not rows:
        return empty
    header = ("ID", "TIME (UTC)", "METHOD", "PATH", "MODEL", "STATUS", "TTFT", "CHG", "FLAGS", "CLIENT")
    table = [header]
    for r in rows:
        ttft = "-" if r.get("first_token_ms") is None else f"{r['first_token_ms']:.0f}ms"
        table.append(
            (
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
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table
    )


def _when(started_at: str) -> str:
    """`2026-05-01 13:15:34` from the ISO 8601 UTC `started_at`: a store spans days, so the date shows."""
    return f"{started_at[:10]} {started_at[11:19]}".strip()
