"""Issue 15, items 0-2: the store never loses an exchange, keeps every byte that arrived, knows its version.

Through the real proxy in front of the real mock (both in the test process) where the bug is in the proxy;
the writer's fallback (an exchange that still can't be stored whole) directly, against a real SQLite limit.
What takes processes (exported repros run for real, `tapfix run` and `browse` refusing a store):
tests/process/truth/test_store_truth.py.
"""

from __future__ import annotations

import concurrent.futures
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import orjson
from sqlite_utils import Database
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.sqlite.database import open_for_reading, open_for_writing
from tapfix.proxy.store.sqlite.reader import capture_body, list_captures, load_capture
from tapfix.proxy.store.sqlite.schema import migrations
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.inproc import cli, start_proxy
from tests.support.procs import response_head, wait_capture

CHAT = "/v1/chat/completions"


def _capture_id(response: httpx.Response) -> str:
    capture_id = response.headers.get("x-tapfix-capture-id")
    assert capture_id, response.headers
    return capture_id


def _health(proxy) -> dict:
    return httpx.get(f"{proxy.url}/tapfix/health", timeout=10).json()


# --- item 0: one bad body loses its neighbours ---------------------------------------------------


def _bad_or_good(i: int) -> bytes:
    content = b"turn %d" % i
    if i % 4 == 1:  # a non-UTF-8 byte in a key
        return b'{"model":"m\xc7","mess\xa8ages":[{"role":"user","content":"' + content + b'"}]}'
    if i % 4 == 3:  # a non-UTF-8 byte in the model name
        return b'{"model":"m\xc7","messages":[{"role":"user","content":"' + content + b'"}]}'
    return b'{"model":"tapfix-mock","messages":[{"role":"user","content":"' + content + b'"}]}'


def test_truth_0_bad_body_keeps_neighbours(proxy) -> None:
    db = proxy.extra["db"]
    before = _health(proxy)["capture_writer"]

    def send(i: int) -> tuple[str, bytes]:
        body = _bad_or_good(i)
        with httpx.Client(timeout=30) as client:
            response = client.post(f"{proxy.url}{CHAT}", content=body, headers={"content-type": "application/json"})
        return _capture_id(response), body

    def stream(i: int) -> str:
        body = {"model": "tapfix-mock", "stream": True, "messages": [{"role": "user", "content": f"stream {i}"}]}
        with httpx.Client(timeout=30) as client, client.stream("POST", f"{proxy.url}{CHAT}", json=body) as response:
            response.read()
            return _capture_id(response)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        sent = list(pool.map(send, range(60)))
        streams = list(pool.map(stream, range(16)))
    for capture_id, body in sent:
        wait_capture(db, capture_id, timeout=20)
        exported = cli("captures", "export", capture_id, "--db", str(db))
        assert exported.returncode == 0, exported.stderr.decode()
        assert exported.stdout == body  # the bad ones too, byte for byte
    for capture_id in streams:
        assert wait_capture(db, capture_id, timeout=20)["content"]
    after = _health(proxy)
    assert after["capture_writer"]["failures"] == before["failures"] == 0, after
    assert not after["capture_writer"].get("capture_failed"), after
    assert after["status"] != "degraded", after


def _json_answer(content: str) -> bytes:
    return orjson.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})


def test_truth_0_unstorable_exchange_kept_with_its_bytes(tmp_path: Path) -> None:
    """An exchange the writer can't store whole (here: an answer beyond SQLite's length limit, lowered
    so the test stays small; the default limit is 1 GB) is kept as a row with its raw bytes and the
    error, flagged `capture_failed`, and the exchanges around it are stored as usual."""
    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    writer.backend.conn.setlimit(  # type: ignore[attr-defined]  # SQLite's
        sqlite3.SQLITE_LIMIT_LENGTH, 100_000
    )
    huge = "a" * 200_000  # compresses to a small body blob, but the assembled text column is too long
    exchanges = [
        Exchange(
            method="POST",
            path=CHAT,
            request=b'{"model":"m","messages":[{"role":"user","content":"%d"}]}' % i,
            model="m",
            status=200,
            content_type="application/json",
            response=_json_answer(huge if i == 2 else f"answer {i}"),
        )
        for i in range(5)
    ]
    for ex in exchanges:
        writer.submit(ex)
    writer.close()
    conn = open_for_reading(db)
    rows = {row["id"]: row for row in list_captures(conn, limit=0)}
    assert set(rows) == {ex.id for ex in exchanges}
    for i, ex in enumerate(exchanges):
        capture = load_capture(conn, ex.id)
        assert capture_body(conn, capture, "request") == ex.request
        assert capture_body(conn, capture, "response") == ex.response
        if i == 2:
            assert "capture_failed" in capture["flags"]
            assert "too big" in capture["error"]
            assert capture["status"] == 200 and capture["path"] == CHAT and capture["model"] == "m"
        else:
            assert capture["content"] == f"answer {i}" and "capture_failed" not in capture["flags"]
    health = writer.health()
    assert health["capture_failed"] == {"DataError": 1} and health["failures"] == 0, health
    assert list_captures(conn, flag="capture_failed")[0]["id"] == exchanges[2].id


# --- item 1: a non-UTF-8 byte in a header value or in the path ------------------------------------


def _capture_id_of(head: bytes) -> str:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"x-tapfix-capture-id":
            return value.strip().decode()
    raise AssertionError(f"no capture id in {head[:300]!r}")


def _stored_header(row: dict, name: str) -> str:
    return next(v for k, v in orjson.loads(row["request_headers"]) if k.lower() == name)


def test_truth_1_non_utf8_header_and_path(proxy) -> None:
    head = response_head(
        proxy.port,
        b"GET /v1/models?x=\xff\\ HTTP/1.1\r\nHost: tapfix\r\nX-Foo: \xe9\xff and \\ a backslash\r\n"
        b"X-Note: sk-abcdefghijklmnopqrstu\xff\r\nAuthorization: Bearer sk-\xfe\xff0123456789abcdef\r\n\r\n",
    )
    row = wait_capture(proxy.extra["db"], _capture_id_of(head))
    assert head.startswith(b"HTTP/1.1 %d " % row["status"]), head  # the mock's own answer (its parser may refuse)
    assert row["path"] == "/v1/models?x=\\xff\\\\"
    assert _stored_header(row, "x-foo") == "\\xe9\\xff and \\\\ a backslash"
    assert _stored_header(row, "x-note") == "[redacted]\\xff"  # redaction still applies
    assert _stored_header(row, "authorization") == "[redacted]"
    health = _health(proxy)
    assert health["capture_writer"]["failures"] == 0 and health["status"] != "degraded", health


# --- item 2: databases that aren't what they seem ------------------------------------------------


def _refused(result: subprocess.CompletedProcess, *words: str, code: int = 1) -> None:
    err = result.stderr.decode(errors="replace")
    assert result.returncode == code, (result.returncode, err)
    assert "Traceback" not in err, err
    for word in words:
        assert word in err, err


def readers(db: Path) -> list[tuple[int, list[str]]]:
    """The commands that read a store and end (`browse` serves: its refusal is tests/process/truth's)."""
    return [
        (1, ["captures", "list", "--db", str(db)]),
        (1, ["captures", "show", "01", "--db", str(db)]),
        (1, ["captures", "export", "01", "--db", str(db)]),
        (2, ["replay", "01", "--db", str(db)]),  # replay's contract: bad input is exit 2
    ]


def newer_store(db: Path) -> Path:
    """A store a newer tapfix migrated (a migration this one doesn't know)."""
    open_for_writing(db).close()
    conn = sqlite3.connect(db)
    conn.execute(
        "insert into _sqlite_migrations (migration_set, name, applied_at) values ('tapfix', 'm999_from_the_future', ?)",
        (time.strftime("%Y-%m-%d %H:%M:%S"),),
    )
    conn.commit()
    conn.close()
    return db


def _sqlite_file(db: Path, *statements: str) -> Path:
    conn = sqlite3.connect(db)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return db


def foreign_file(db: Path) -> Path:
    """Somebody else's SQLite file."""
    return _sqlite_file(
        db, "create table notes (id integer primary key, text text)", "insert into notes (text) values ('mine')"
    )


def foreign_exchanges_table(db: Path) -> Path:
    """Somebody else's file with a table named like tapfix's."""
    return _sqlite_file(
        db, "create table exchanges (id text primary key, amount real)", "insert into exchanges values ('01abc', 12.5)"
    )


def tables(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        return {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
    finally:
        conn.close()


def test_truth_2_newer_store_refused(tmp_path: Path) -> None:
    db = newer_store(tmp_path / "newer.db")
    for code, args in readers(db):
        _refused(cli(*args), "m999_from_the_future", code=code)


def test_truth_2_foreign_file_refused(tmp_path: Path) -> None:
    db = foreign_file(tmp_path / "notes.db")
    for code, args in readers(db):
        _refused(cli(*args), "not a tapfix", code=code)
    assert tables(db) == {"notes"}  # nothing was added to it


def test_truth_2_foreign_exchanges_table(tmp_path: Path) -> None:
    db = foreign_exchanges_table(tmp_path / "exchanges.db")
    for code, args in readers(db):
        _refused(cli(*args), "not a tapfix", code=code)
    assert tables(db) == {"exchanges"}


def test_truth_2_missing_or_empty_file_is_a_new_store(tmp_path: Path, mock) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    for db in (empty, tmp_path / "sub" / "missing.db"):
        proc = start_proxy(tmp_path, mock.url, db=db)
        try:
            response = httpx.post(
                f"{proc.url}{CHAT}", json={"model": "tapfix-mock", "messages": [{"role": "user", "content": "hi"}]}
            )
            wait_capture(db, _capture_id(response))
        finally:
            proc.stop()
        assert {"exchanges", "_sqlite_migrations"} <= tables(db)


def test_truth_2_older_store_still_read(tmp_path: Path, mock) -> None:
    """A store from before m002 (no `choices` table): readers read it, and `run` migrates it."""
    current, db = tmp_path / "current.db", tmp_path / "older.db"
    writer = CaptureWriter(current)
    ex = Exchange(
        method="POST",
        path=CHAT,
        request=b'{"model":"m","messages":[{"role":"user","content":"old"}]}',
        model="m",
        status=200,
        content_type="application/json",
        response=_json_answer("from an older tapfix"),
    )
    writer.submit(ex)
    writer.close()
    conn = sqlite3.connect(db, isolation_level=None)
    migrations.apply(Database(conn), stop_before="m002_choices")  # what tapfix 0.2.0 created
    conn.execute("attach ? as current", (str(current),))
    for table in ("exchanges", "bodies"):
        columns = ", ".join(r[1] for r in conn.execute(f"pragma main.table_info({table})"))
        conn.execute(f"insert into main.{table} ({columns}) select {columns} from current.{table}")
    conn.execute("detach current")
    conn.close()
    assert "choices" not in tables(db)
    listed = cli("captures", "list", "--db", str(db))
    assert listed.returncode == 0 and ex.id.encode() in listed.stdout, listed.stderr.decode()
    shown = cli("captures", "show", ex.id, "--db", str(db))
    assert shown.returncode == 0 and b"from an older tapfix" in shown.stdout, shown.stderr.decode()
    exported = cli("captures", "export", ex.id, "--db", str(db))
    assert exported.returncode == 0 and exported.stdout == ex.request, exported.stderr.decode()
    proc = start_proxy(tmp_path, mock.url, db=db)
    proc.stop()
    assert "choices" in tables(db)


def test_truth_2_store_path_with_uri_characters(tmp_path: Path) -> None:
    """Readers open the store as a read-only `file:` URI: a `?`, `#` or `%` in a folder name is part of
    the path, not the URI's query or fragment."""
    db = tmp_path / "run?1 #2 %41" / "c.db"
    writer = CaptureWriter(db)
    ex = Exchange(method="POST", path=CHAT, request=b"{}", status=200, content_type="application/json")
    writer.submit(ex)
    writer.close()
    conn = open_for_reading(db)
    try:
        assert [r["id"] for r in list_captures(conn)] == [ex.id]
    finally:
        conn.close()
