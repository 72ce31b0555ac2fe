"""Why the capture database refused a write, told apart: its own trouble (locked, full, read-only, I/O),
which one exchange at a time would meet the same way, from an exchange's content, which it wouldn't.
The writer decides by it whether to retry, store a batch one by one, or count the batch as lost."""

from __future__ import annotations

import sqlite3


def locked(e: Exception) -> bool:
    return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))


def environmental(e: Exception) -> bool:
    """The database's trouble (locked, full, read-only, I/O), not the content's."""
    text = str(e).lower()
    return isinstance(e, sqlite3.OperationalError) and any(
        word in text for word in ("locked", "busy", "full", "disk i/o", "readonly", "read-only")
    )


def cause_of(e: Exception) -> str:
    """A short name for why the database refused a write, for health's per-cause counts."""
    text = str(e).lower()
    if isinstance(e, sqlite3.OperationalError):
        for cause, words in _CAUSES:
            if any(word in text for word in words):
                return cause
    return type(e).__name__


_CAUSES = (
    ("disk_full", ("full", "too large")),
    ("locked", ("locked", "busy")),
    ("read_only", ("readonly", "read-only")),
    ("io", ("disk i/o",)),
)


def describe(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"
