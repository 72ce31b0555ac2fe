"""Retention: how old or how big the capture store may grow, enforced by the writer, reported alike.

The capture writer calls `Retention.maybe_run` from its own thread between batches, so traffic
never waits on it: the event loop only enqueues. What a purge deletes, and how, is the backend's
(`WriteBackend.retain`; SQLite's in store/sqlite/retention.py, PostgreSQL's in
store/pg/retention.py); what it reports is one `PurgeReport`.

Limits that would delete captures as fast as they arrive are refused where the user gives them
(`check_max_age`, `check_max_size`): an age under a minute, or a size under what the empty store
alone uses (its floor: the schema's tables and indexes, measured on a fresh store, not assumed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tapfix.proxy.quantities import human_bytes, parse_duration, parse_size

log = logging.getLogger("tapfix.retention")

# A backend's purge, bound to its store: (older_than_s, max_bytes, now) -> what it deleted.
Purge = Callable[[float | None, int | None, float], "PurgeReport"]
MIN_AGE_S = 60.0  # a shorter --max-age purges each capture moments after it is written
HEALTH = ("max_age_s", "max_bytes", "runs", "purged", "days_dropped", "last_error")  # what health shows, in order


class LimitRefused(ValueError):
    """A retention limit that would delete captures as fast as they arrive (the message names the option)."""


def check_max_age(seconds: float | None, name: str = "--max-age") -> None:
    """Refuse an age under MIN_AGE_S (naming `name` and the minimum)."""
    if seconds is not None and seconds < MIN_AGE_S:
        raise LimitRefused(
            f"{name} {seconds:g}s is below the minimum, 1 minute ({MIN_AGE_S:g}s): "
            "a shorter age purges each capture moments after it is written"
        )


def check_max_size(max_bytes: int | None, floor: int | None = None, name: str = "--max-size") -> None:
    """Refuse a size cap under the empty store's floor: it would delete every capture and still be over.
    `floor`: the store's own; by default the smallest store tapfix makes, an empty SQLite file."""
    if floor is None:
        from tapfix.proxy.store.sqlite.database import empty_store_bytes

        floor = empty_store_bytes()
    if max_bytes is not None and max_bytes < floor:
        raise LimitRefused(
            f"{name} {max_bytes} bytes ({human_bytes(max_bytes)}) is below the store's floor: the empty store "
            f"alone uses {floor} bytes ({human_bytes(floor)}), so every capture would be deleted; "
            f"give at least {floor} bytes"
        )


@dataclass
class PurgeReport:
    dry_run: bool = False  # counted on a snapshot copy: the store itself is unchanged
    exchanges: int = 0
    changes: int = 0
    bodies: int = 0
    sessions: int = 0
    kept_bases: int = 0  # unreferenced bodies kept because a kept body is a delta on them
    bytes_before: int = 0  # bytes in use (pages minus free pages), not the file size
    bytes_after: int = 0
    seconds: float = 0.0
    cutoff: float | None = None  # unix time: exchanges older than this were deleted
    reasons: list[str] = field(default_factory=list)
    days_dropped: list[str] = field(default_factory=list)  # PostgreSQL: the UTC days whose partitions went whole
    index_rows: int | None = None  # SQLite: rows dropped from the browser's search index (None: no index)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.index_rows is None:
            del out["index_rows"]
        return out

    def __str__(self) -> str:
        text = (
            f"{'would purge' if self.dry_run else 'purged'} {self.exchanges} exchange(s), {self.changes} change(s), "
            f"{self.bodies} body(ies), {self.sessions} session(s); "
            f"{'would keep' if self.dry_run else 'kept'} {self.kept_bases} delta base(s) still needed; "
            f"in use {self.bytes_before} → {self.bytes_after} bytes in {self.seconds:.2f}s"
        )
        if self.days_dropped:
            text += f"; dropped the day partitions of {', '.join(self.days_dropped)}"
        return text + ("; dry run: nothing was deleted" if self.dry_run else "")


@dataclass
class Retention:
    """Limits the capture writer enforces from its own thread, at most once per `every_s` seconds."""

    max_age_s: float | None = None
    max_bytes: int | None = None
    every_s: float = 60.0
    last_run: float = 0.0
    runs: int = 0
    purged: int = 0
    last_error: str | None = None
    days_dropped: int = 0  # PostgreSQL: day partitions dropped whole (their exchanges count in `purged`)

    @classmethod
    def from_config(cls, table: dict[str, Any] | None) -> Retention | None:
        """`[retention] max_age = "7d"`, `max_size = "2G"`, `check_every = "60s"` (all optional)."""
        if not table:
            return None
        age, size = table.get("max_age"), table.get("max_size")
        every = table.get("check_every", 60)
        if age is None and size is None:
            return None
        retention = cls(
            max_age_s=parse_duration(str(age)) if age is not None else None,
            max_bytes=parse_size(str(size)) if size is not None else None,
            every_s=parse_duration(str(every)),
        )
        check_max_age(retention.max_age_s, "max_age")
        check_max_size(retention.max_bytes, name="max_size")
        return retention

    def due(self, now: float) -> bool:
        return now - self.last_run >= self.every_s

    def maybe_run(self, purge: Purge, now: float | None = None) -> PurgeReport | None:
        """Run `purge` (the backend's, bound to its store) when due; never raises (a failed purge is
        counted, logged, and tried again later)."""
        now = time.time() if now is None else now
        if not self.due(now):
            return None
        self.last_run = now
        try:
            report = purge(self.max_age_s, self.max_bytes, now)
        except Exception as e:  # noqa: BLE001 - retention must never stop the writer
            self.last_error = f"{type(e).__name__}: {e}"
            log.error("retention purge failed: %s", e)
            return None
        self.runs += 1
        self.purged += report.exchanges
        self.days_dropped += len(report.days_dropped)
        if report.exchanges:
            log.info("retention: %s", report)
        return report

    def health(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in HEALTH}
