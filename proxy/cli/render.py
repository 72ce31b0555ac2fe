"""Plain-text tables for the terminal."""

from __future__ import annotations

from typing import Any


def captures_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no captures yet"
    header = ("ID", "TIME", "METHOD", "PATH", "MODEL", "STATUS", "TTFT", "CHG", "FLAGS", "CLIENT")
    table = [header]
    for r in rows:
        ttft = "-" if r.get("first_token_ms") is None else f"{r['first_token_ms']:.0f}ms"
        table.append(
            (
                r["id"],
                (r.get("started_at") or "")[11:23],
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
