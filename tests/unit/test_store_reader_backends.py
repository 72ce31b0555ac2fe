"""The reader's contract on both backends (store/backend.py `CaptureReader`): the same exchanges, written by
each backend's real writer (`StoreBackend.writer()`), read back through its `reader()` as
the same rows, row for row, and the same bytes: `captures list` with every filter (attempts under their
parent, orphans on their own, `limit` counting client requests), `show`'s capture and change rows, id
prefixes, and `export`'s exact bodies of every kind (deltas, a changed request, a repaired answer, a
non-UTF-8 body, a capture stored without bodies)."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.bodies import BODY_KINDS
from tapfix.proxy.store.errors import CaptureNotFound, StoreError
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.reader import CaptureReader

from tests.support.builders import chat_chunk, sse_events
from tests.support.sql_store import Filled, store_cases, write_all
from tests.support.stores import BACKENDS, make_backend
from tests.unit.test_store_attempts import exchange, regenerated

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
BODY_IDS = ("request_body_id", "forwarded_body_id", "response_body_id", "client_response_body_id")


@functools.cache
def cases() -> tuple[Filled, list[Exchange], dict[str, str]]:
    """One set of exchanges (fixed ids) for every store: the body cases, attempts, an orphan, a trace, a tag."""
    filled, exchanges = store_cases(turns=30)
    *attempts, parent = regenerated(attempts=2)
    parent.trace_id = attempts[0].trace_id = TRACE
    orphan = exchange(attempt_of="01tmissingparent00", attempt=2)
    tagged = exchange(tags={"nightly"}, request_headers=[("x-session-id", "ses_tagged")])
    two = [chat_chunk({"content": "one"}, index=0), chat_chunk({"content": "two"}, index=1)]
    two += [chat_chunk(finish_reason="stop", index=0), chat_chunk(finish_reason="length", index=1)]
    tagged.response_chunks = sse_events(two)  # n=2: the `choices` table
    named = {"parent": parent.id, "attempt1": attempts[0].id, "attempt2": attempts[1].id}
    named |= {"orphan": orphan.id, "tagged": tagged.id}
    return filled, [*exchanges, *attempts, parent, orphan, tagged], named


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureReader]:
    """The reference: the same exchanges in a SQLite store, read by SQLite's reader."""
    path = tmp_path_factory.mktemp("twin") / "twin.db"
    twin = StoreLocator.of(path).backend()
    write_all(twin.writer(), cases()[1])
    reader = twin.reader()
    yield reader
    reader.close()


@pytest.fixture(scope="module", params=BACKENDS)
def reader(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CaptureReader]:
    store = make_backend(request, tmp_path_factory.mktemp(request.param))
    write_all(store.writer(), cases()[1])
    opened = store.store().reader()
    yield opened
    opened.close()


def _ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["id"] for row in rows]


@pytest.mark.parametrize(
    "filters",
    [
        {"limit": 0},
        {"limit": 5},
        {"limit": 2, "flag": "regenerated"},
        {"limit": 0, "session": "ses_sql_test"},
        {"limit": 0, "tag": "nightly"},
        {"limit": 0, "trace": TRACE.upper()},
        {"limit": 0, "flag": "no-such-flag"},
    ],
)
def test_list_is_the_same_row_for_row(reader: CaptureReader, twin: CaptureReader, filters: dict[str, Any]) -> None:
    assert reader.list_captures(**filters) == twin.list_captures(**filters)


def test_list_shape_and_filters(reader: CaptureReader) -> None:
    """What the rows are, not only that both agree: newest first, attempts under their parent."""
    filled, exchanges, named = cases()
    everything = _ids(reader.list_captures(limit=0))
    assert sorted(everything) == sorted(ex.id for ex in exchanges)
    parent = everything.index(named["parent"])
    assert everything[parent + 1 : parent + 3] == [named["attempt1"], named["attempt2"]]
    by_trace = reader.list_captures(limit=0, trace=TRACE.upper())  # matched on the client request, case-insensitively
    assert _ids(by_trace) == [named["parent"], named["attempt1"], named["attempt2"]]
    assert [(r["attempt_of"], r["attempt"]) for r in by_trace[1:]] == [(named["parent"], 2), (named["parent"], 3)]
    assert _ids(reader.list_captures(limit=0, session="ses_sql_test")) == sorted(filled.session, reverse=True)
    assert _ids(reader.list_captures(limit=0, tag="nightly")) == [named["tagged"]]
    assert named["orphan"] in everything
    latest = reader.list_captures(limit=1)
    assert latest[0]["started_at"].endswith("+00:00") and isinstance(latest[0]["flags"], list)
    assert "regenerated" in reader.known_flags()


def test_show_is_the_same_and_ids_resolve(reader: CaptureReader, twin: CaptureReader) -> None:
    filled, exchanges, named = cases()
    for ex in exchanges:
        mine, theirs = reader.load_capture(ex.id), twin.load_capture(ex.id)
        for key in BODY_IDS:  # each store numbers its own bodies
            assert (mine.pop(key) is None) == (theirs.pop(key) is None), (ex.id, key)
        assert mine == theirs
        assert reader.read_choices(ex.id) == twin.read_choices(ex.id)
    choices = reader.read_choices(named["tagged"])
    assert [(c["index"], c["content"], c["finish_reason"]) for c in choices] == [
        (0, "one", "stop"),
        (1, "two", "length"),
    ]
    changed = reader.load_capture(filled.ids["forwarded"])
    assert [(c["kind"], c["path"], c["after"]) for c in changed["change_rows"]] == [("inject", "$.top_p", 0.95)]
    assert reader.resolve_id(filled.ids["binary"][:-1].upper()) == filled.ids["binary"]
    with pytest.raises(CaptureNotFound, match="ambiguous"):
        reader.resolve_id("01t")
    with pytest.raises(CaptureNotFound, match="no capture"):
        reader.resolve_id("zzzz")


def test_export_gives_the_exact_bytes(reader: CaptureReader) -> None:
    filled, _, _ = cases()
    private = filled.ids["private"]
    for capture_id, kinds in filled.bodies.items():
        capture = reader.load_capture(capture_id)
        for kind in BODY_KINDS:
            if capture_id == private:
                with pytest.raises(StoreError, match="privacy mode"):
                    reader.capture_body(capture, kind)
            else:
                assert reader.capture_body(capture, kind) == kinds[kind], (capture_id, kind)


def _relations(plan: object) -> set[str]:
    if isinstance(plan, dict):
        found = {str(plan["Relation Name"])} if "Relation Name" in plan else set()
        return found.union(*(_relations(v) for v in plan.values()))
    if isinstance(plan, list):
        return set().union(*(_relations(v) for v in plan))
    return set()


@pytest.mark.parametrize("reader", [BACKENDS[1]], indirect=True)  # partitions are PostgreSQL's alone
def test_a_capture_is_read_from_its_days_partitions_alone(reader: CaptureReader) -> None:
    """Once an id is resolved, show and export read one day's partition of each table, not every day's."""
    from tapfix.proxy.store.pg import reader as pg

    assert isinstance(reader, pg.PostgresReader)
    capture = reader.load_capture(cases()[0].ids["forwarded"])
    day = capture["started_at"][:10].replace("-", "")
    started = reader._started[capture["id"]]
    for sql, key, table in (
        (pg.LOAD, started, "exchanges"),
        (pg.CHANGES, None, "changes"),
        (pg.CHOICES, None, "choices"),
    ):
        args = (capture["id"], key if key is not None else reader._day_of(capture["id"]))
        plan = reader.rows("explain (format json) " + sql, args)[0]["QUERY PLAN"]
        assert _relations(plan) == {f"{table}_{day}"}, plan
