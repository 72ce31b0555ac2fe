"""`tapfix captures copy`: one store into another, byte-exact, between any two backends.

Why through the writers' own seam: the target stores rows the way its live writer does, so a copied
store is indistinguishable from one its writer filled. Each capture is read whole from the source
(bodies rebuilt by the source's decoder) and written through the target's `WriteBackend`: its body
writer (SQLite's zlib deltas, PostgreSQL's raw ones, a session's first body of a day stored whole
there), its `put_exchange` (PostgreSQL fills `search_text`/`search` in its one place), its day
columns. Body ids are the target's; everything else (capture ids, times, changes, choices, sessions)
is the source's. PostgreSQL's own columns (`commit_xid`, `commit_seq`, search) are never carried:
the target sets its own.

- Schema: both stores must be at this tapfix's schema. The two migration sets differ, so a version is
  named by the SQLite migration whose schema a store reaches (PostgreSQL's set maps each of its
  migrations to one: store/pg/schema.py `REACHES`). The target is migrated when it is opened (as its
  writer would); a source is never written, so an older one is refused, naming both versions.
- Clashes: a target sharing a capture id with the source is refused, naming the first, before anything
  is written; `--resume` skips the ids the target has instead. Captures are copied in id order, a
  batch per transaction (a capture, its changes, choices, bodies and sessions commit together), so an
  interrupted copy leaves whole captures only, and a resumed one starts where it stopped.
- Check: at the end every body of every source capture is read again from both stores and compared
  by sha256 (`CopyMismatch` names the first capture that differs).
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import orjson
from tapfix.proxy.content_encoding import DecodedTooLarge, DecodeError, decode_whole
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.errors import StoreError

if TYPE_CHECKING:
    from tapfix.proxy.store.parts import WriteBackend

BODY_COLUMNS = ("request_body_id", "forwarded_body_id", "response_body_id", "client_response_body_id")
CHANGE_COLUMNS = ("seq", "stage", "kind", "path", "before", "after", "reason")
CHOICE_COLUMNS = ('"index"', "content", "reasoning", "tool_calls", "finish_reason", "flags")
SESSION_COLUMNS = ("id", "first_at", "last_at", "user_agent", "model", "exchanges", "tip_hash", "wants")
# Both SQLite (3.24+) and PostgreSQL take this upsert: the source's session replaces the target's.
UPSERT_SESSION = (
    f"insert into sessions ({', '.join(SESSION_COLUMNS)}) values ({', '.join('?' * len(SESSION_COLUMNS))})"
    " on conflict (id) do update set " + ", ".join(f"{c} = excluded.{c}" for c in SESSION_COLUMNS[1:])
)
BATCH = 500
PROGRESS_EVERY_S = 1.0

Key = tuple[str, str]  # (capture id, started_at as the SQLite store's ISO text): where a backend finds it


class CopyRefused(StoreError):
    """The copy would mix or damage stores (a clash, a schema mismatch): nothing was written."""


class CopyMismatch(StoreError):
    """A body read back from the target is not the source's."""


class CopyStopped(StoreError):
    """A database failed half way: what was committed is whole, `--resume` continues."""


@dataclass
class Capture:
    """One exchange as the copy carries it: the row as SQLite names its columns (`started_at` ISO text,
    the source's body ids), its changes and choices (their columns above, in order), its bodies' bytes
    by body column (None where the row has no body)."""

    row: dict[str, Any]
    changes: list[tuple[Any, ...]] = field(default_factory=list)
    choices: list[tuple[Any, ...]] = field(default_factory=list)
    bodies: dict[str, bytes | None] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (str(self.row["id"]), str(self.row["started_at"]))


class CopySource(Protocol):
    """A store read for a copy (a source, or a target read back), in each backend's SQL."""

    def version(self) -> str | None:
        """The SQLite migration whose schema the store reaches (None: no tapfix store there)."""
        ...

    def count(self) -> int: ...
    def keys(self, after: str | None, limit: int) -> list[Key]:
        """Capture keys in id order, ids after `after`."""
        ...

    def captures(self, keys: list[Key]) -> list[Capture]:
        """Those captures whole, in `keys`' order (any the store lacks left out)."""
        ...

    def sessions(self, ids: list[str] | None = None) -> list[tuple[Any, ...]]:
        """Session rows (`SESSION_COLUMNS`, times as ISO text) with these ids, or all of them."""
        ...

    def close(self) -> None: ...


class CopyTarget(Protocol):
    """The target's write side: its writer's backend, plus what its backend needs before a batch."""

    @property
    def backend(self) -> WriteBackend: ...

    def existing_ids(self) -> set[str]: ...
    def prepare(self, captures: list[Capture]) -> None:
        """Before a batch's transaction (PostgreSQL: make the day partitions its captures go to)."""
        ...

    def pipelined(self) -> AbstractContextManager[object]:
        """Around a batch: statements whose results aren't read go out without waiting (PostgreSQL)."""
        ...

    def close(self) -> None: ...


class CopyEnd(Protocol):
    """A store as a copy's end: what `copy_stores` asks of a `StoreBackend` (store/backend.py)."""

    location: str
    errors: tuple[type[Exception], ...]

    def schema_version(self) -> str | None: ...
    def copy_source(self) -> CopySource: ...
    def copy_target(self) -> CopyTarget: ...
    def scrub(self, text: str) -> str: ...


@dataclass
class CopyReport:
    source: str
    target: str
    total: int = 0
    copied: int = 0
    skipped: int = 0  # --resume: already in the target
    bodies: int = 0
    checked: int = 0
    seconds: float = 0.0
    check_seconds: float = 0.0

    def __str__(self) -> str:
        rate = self.copied / self.seconds if self.seconds else 0.0
        skipped = f", {self.skipped} already there" if self.skipped else ""
        return (
            f"copied {self.copied} of {self.total} exchange(s){skipped} from {self.source} to {self.target}"
            f" in {self.seconds:.1f}s ({rate:.0f}/s); {self.bodies} body(ies); checked {self.checked} by sha256"
            f" in {self.check_seconds:.1f}s"
        )


class Progress:
    """`copied N/M exchanges (P%)` on stderr: after the first batch, then at most once per `every_s`."""

    def __init__(self, verb: str, total: int, out: TextIO | None = None, every_s: float = PROGRESS_EVERY_S) -> None:
        self.verb, self.total, self.out, self.every_s = verb, total, out or sys.stderr, every_s
        self._last: float | None = None
        self._shown = -1

    def __call__(self, done: int, *, last: bool = False) -> None:
        now = time.monotonic()
        if done == self._shown or (not last and self._last is not None and now - self._last < self.every_s):
            return
        self._last, self._shown = now, done
        share = f" ({100 * done // self.total}%)" if self.total else ""
        print(f"{self.verb} {done}/{self.total} exchanges{share}", file=self.out, flush=True)


def check_versions(source: str | None, target: str | None, latest: str, names: tuple[str, str]) -> None:
    """Both stores at `latest` (the target is migrated to it on open when it is older or new)."""
    if source == latest and target in (None, latest):
        return
    raise CopyRefused(
        f"refused: schema versions differ: the source {names[0]} is at {source or 'no tapfix schema'}, the target"
        f" {names[1]} at {target or f'(new: {latest} once migrated)'}; this tapfix copies stores at {latest}"
        " (open the older one with this tapfix's `tapfix run --db ...` to migrate it)"
    )


def first_clash(source: CopySource, existing: set[str], batch: int = BATCH) -> str | None:
    """The first source capture id (in id order) the target has too."""
    if not existing:
        return None
    for keys in _pages(source, batch):
        for capture_id, _ in keys:
            if capture_id in existing:
                return capture_id
    return None


def _pages(source: CopySource, batch: int) -> Iterator[list[Key]]:
    after = None
    while True:
        keys = source.keys(after, batch)
        if not keys:
            return
        yield keys
        after = keys[-1][0]


def copy_stores(
    source: CopyEnd, target: CopyEnd, *, resume: bool = False, batch: int = BATCH, out: TextIO | None = None
) -> CopyReport:
    """`captures copy --from source --to target`: both checked (their schema versions), then `copy_store`.
    Every error is a `StoreError` naming the stores with their passwords masked; one a database raised
    half way is `CopyStopped`."""
    names = (source.location, target.location)
    reader = source.copy_source()
    try:
        from tapfix.proxy.store.sqlite.database import latest_version  # versions are named by SQLite's migrations

        check_versions(reader.version(), target.schema_version(), latest_version(), names)
        writer = target.copy_target()
        try:
            return copy_store(reader, writer, target.copy_source, names=names, resume=resume, batch=batch, out=out)
        finally:
            writer.close()
    except StoreError as e:
        raise type(e)(_scrubbed(str(e), source, target)) from None
    except (*source.errors, *target.errors) as e:
        raise CopyStopped(
            f"copy from {names[0]} to {names[1]} stopped: {_scrubbed(str(e), source, target)}; what was committed"
            " is whole, run the same command with --resume to continue"
        ) from None
    finally:
        reader.close()


def _scrubbed(text: str, *stores: CopyEnd) -> str:
    for store in stores:
        text = store.scrub(text)
    return " ".join(text.split())


def copy_store(
    source: CopySource,
    target: CopyTarget,
    read_target: Callable[[], CopySource],
    *,
    names: tuple[str, str],
    resume: bool = False,
    batch: int = BATCH,
    out: TextIO | None = None,
) -> CopyReport:
    """Copy every capture and session of `source` into `target`, then check every body by sha256.
    `read_target` opens the target for reading back; `names`: both stores as shown (passwords masked)."""
    report = CopyReport(*names, total=source.count())
    existing = target.existing_ids()
    if not resume:
        clash = first_clash(source, existing, batch)
        if clash is not None:
            raise CopyRefused(
                f"refused: the target {names[1]} already has capture {clash}, which the source has too"
                " (the first clash); copy into an empty store or one sharing no capture id,"
                " or pass --resume to continue an interrupted copy"
            )
    started = time.monotonic()
    progress = Progress("copied", report.total, out)
    for keys in _pages(source, batch):
        todo = [key for key in keys if key[0] not in existing]
        report.skipped += len(keys) - len(todo)
        if todo:
            captures = source.captures(todo)
            target.prepare(captures)
            sessions = sorted({str(c.row["session_id"]) for c in captures if c.row.get("session_id")})
            with target.pipelined():
                write_batch(target.backend, captures, source.sessions(sessions) if sessions else [])
            report.copied += len(captures)
            report.bodies += sum(1 for c in captures for data in c.bodies.values() if data is not None)
        progress(report.copied + report.skipped)
    write_sessions(target.backend, source.sessions())  # sessions no capture names (none on a healthy store)
    progress(report.copied + report.skipped, last=True)
    report.seconds = round(time.monotonic() - started, 3)
    started = time.monotonic()
    report.checked = check_bodies(source, read_target, batch, out)
    report.check_seconds = round(time.monotonic() - started, 3)
    return report


def write_batch(backend: WriteBackend, captures: list[Capture], sessions: list[tuple[Any, ...]]) -> None:
    """One transaction: the captures with their bodies (through the target's body writer), changes,
    choices, and the sessions they are in."""
    backend.begin()
    try:
        for capture in captures:
            _write_one(backend, capture)
        _upsert_sessions(backend, sessions)
        backend.commit()
    except BaseException:
        backend.rollback()
        backend.bodies.forget()  # its remembered bases were rolled back with the batch
        raise


def write_sessions(backend: WriteBackend, sessions: list[tuple[Any, ...]]) -> None:
    backend.begin()
    try:
        _upsert_sessions(backend, sessions)
        backend.commit()
    except BaseException:
        backend.rollback()
        raise


def _upsert_sessions(backend: WriteBackend, sessions: list[tuple[Any, ...]]) -> None:
    if sessions:
        backend.executemany(UPSERT_SESSION, sessions)


def _write_one(backend: WriteBackend, capture: Capture) -> None:
    row = dict(capture.row)
    bodies = capture.bodies
    ex = Exchange(
        id=str(row["id"]),
        started_at=float(row["ts"]),
        request=bodies.get("request_body_id") or b"",
        store_bodies=row.get("request_body_id") is not None,
    )
    ex.decoded_request = _decoded_request(row.get("request_headers"), ex.request)
    family = row.get("session_id")  # as the writer: requests delta on their session's last one
    put = backend.bodies.put
    for column in BODY_COLUMNS:
        data = bodies.get(column)
        if data is None:
            row[column] = None
        elif column in ("request_body_id", "forwarded_body_id"):
            row[column] = put(data, family, when=ex.started_at)
        else:
            row[column] = put(data, level=1, when=ex.started_at)
    backend.put_exchange(row, ex)
    day = backend.day_columns(ex)
    extra = "".join(f", {k}" for k in day)
    if capture.changes:
        marks = ", ".join("?" * (len(CHANGE_COLUMNS) + 1 + len(day)))
        backend.executemany(
            f"insert into changes (exchange_id, {', '.join(CHANGE_COLUMNS)}{extra}) values ({marks})",
            [(ex.id, *change, *day.values()) for change in capture.changes],
        )
    if capture.choices:
        backend.execute("delete from choices where exchange_id = ?", (ex.id,))
        marks = ", ".join("?" * (len(CHOICE_COLUMNS) + 1 + len(day)))
        backend.executemany(
            f"insert into choices (exchange_id, {', '.join(CHOICE_COLUMNS)}{extra}) values ({marks})",
            [(ex.id, *choice, *day.values()) for choice in capture.choices],
        )


def _decoded_request(headers: str | None, body: bytes) -> bytes | None:
    """A compressed request decoded, as the router gave it to the writer (search text is made from it)."""
    if not headers or "content-encoding" not in headers.lower():
        return None
    encoding = next((v for k, v in orjson.loads(headers) if k.lower() == "content-encoding"), None)
    if not encoding:
        return None
    try:
        return decode_whole(body, encoding)
    except (DecodeError, DecodedTooLarge):
        return None


def _digests(capture: Capture) -> tuple[str | None, ...]:
    return tuple(
        None if capture.bodies.get(c) is None else hashlib.sha256(capture.bodies[c] or b"").hexdigest()
        for c in BODY_COLUMNS
    )


def check_bodies(
    source: CopySource, read_target: Callable[[], CopySource], batch: int = BATCH, out: TextIO | None = None
) -> int:
    """Every source capture's bodies against the target's, by sha256; the number of captures checked."""
    target = read_target()
    checked = 0
    progress = Progress("checked", source.count(), out)
    try:
        for keys in _pages(source, batch):
            theirs = {c.key[0]: c for c in target.captures(keys)}
            for mine in source.captures(keys):
                copied = theirs.get(mine.key[0])
                if copied is None:
                    raise CopyMismatch(f"capture {mine.key[0]} is missing from the target after the copy")
                if _digests(copied) != _digests(mine):
                    raise CopyMismatch(f"capture {mine.key[0]}: a body read back from the target differs (sha256)")
                checked += 1
            progress(checked)
    finally:
        target.close()
    progress(checked, last=True)
    return checked
