"""The writer's observer seam (telemetry hangs on it): each exchange is told once, after its commit, with
the outcome it ended with: stored, kept (in part, `capture_failed`) or lost. A batch that rolled back
tells nothing of its first attempt; an observer that raises stops neither the store nor the others."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter, Written

from tests.support.stores import BACKENDS, Backend, make_backend


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request, tmp_path)


def _exchange(model: str) -> Exchange:
    return Exchange(
        method="POST",
        path="/v1/chat/completions",
        request=b'{"model":"' + model.encode() + b'","messages":[]}',
        model=model,
        status=200,
        content_type="application/json",
        response=b'{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}',
    )


def _disk_full(store: Backend) -> Exception:
    """What each database raises when its disk is full."""
    if store.name == "sqlite":
        return sqlite3.OperationalError("database or disk is full")
    import psycopg

    return psycopg.errors.DiskFull("could not extend file: No space left on device")


class Seen:
    """An observer that also checks, on the writer thread, that the row it is told of is committed."""

    def __init__(self, store: Backend) -> None:
        self.store = store
        self.told: list[tuple[str, str, bool, bool]] = []
        self.committed: dict[str, bool] = {}

    def __call__(self, written: Written) -> None:
        ex = written.exchange
        self.told.append((ex.id, written.outcome, written.row is not None, written.assembled is not None))
        # another connection sees only committed rows
        self.committed[ex.id] = bool(self.store.rows("select 1 from exchanges where id = ?", (ex.id,)))


def _writer_failing_on(store: Backend, bad: set[str], error: Exception) -> tuple[CaptureWriter, dict[str, int]]:
    """A writer whose `_write_one` raises `error` for the exchanges in `bad`; counts calls per exchange."""
    writer = store.writer()
    calls: dict[str, int] = {}
    write_one = writer._write_one

    def failing(ex: Exchange) -> None:
        calls[ex.id] = calls.get(ex.id, 0) + 1
        if ex.id in bad:
            raise error
        write_one(ex)

    writer._write_one = failing  # type: ignore[method-assign]
    return writer, calls


def test_stored_and_kept_are_told_once_after_commit_never_for_the_rolled_back_batch(store: Backend) -> None:
    good, bad, other = _exchange("a"), _exchange("b"), _exchange("c")
    writer, calls = _writer_failing_on(store, {bad.id}, ValueError("content the writer can't store"))
    seen = Seen(store)
    writer.observers.append(seen)
    for ex in (good, bad, other):  # queued before the writer's first batch window ends: one batch
        writer.submit(ex)
    writer.close()
    # `good` was written in the batch that rolled back at `bad`, then each went alone.
    assert calls == {good.id: 2, bad.id: 2, other.id: 1}
    assert sorted(seen.told) == sorted(
        [(good.id, "stored", True, True), (other.id, "stored", True, True), (bad.id, "kept", True, False)]
    )
    assert seen.committed == {good.id: True, bad.id: True, other.id: True}


def test_lost_exchanges_are_told_with_no_row(store: Backend) -> None:
    ex = _exchange("a")
    writer, _ = _writer_failing_on(store, {ex.id}, _disk_full(store))
    seen = Seen(store)
    writer.observers.append(seen)
    writer.submit(ex)
    writer.close()
    assert seen.told == [(ex.id, "lost", False, False)]
    assert seen.committed == {ex.id: False}
    assert writer.health()["failures_by_cause"] == {"disk_full": 1}


def test_an_observer_that_raises_stops_neither_the_store_nor_the_others(store: Backend) -> None:
    writer = store.writer()

    def broken(written: Written) -> None:
        raise RuntimeError("an observer's bug")

    seen = Seen(store)
    writer.observers.extend([broken, seen])
    exchanges = [_exchange(m) for m in ("a", "b")]
    for ex in exchanges:
        writer.submit(ex)
    writer.close()
    assert sorted(t[:2] for t in seen.told) == sorted((ex.id, "stored") for ex in exchanges)
    assert writer.health()["written"] == 2 and writer.health()["failures"] == 0
