"""`tapfix replay` and `tapfix browse` on a PostgreSQL store, as real processes against the suite's real
server: replay resends a PostgreSQL capture (and a whole session) to a real `tapfix mock` and stores
every run there, linked to its source; the browser, fetched over loopback with httpx, lists, searches
and shows those captures, and downloads their bodies byte for byte, the password never shown."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tapfix.proxy.store.pg.reader import PostgresReader
from tapfix.proxy.store.pg.writer import postgres_writer

from tests.inproc.test_replay import BODY, store_source
from tests.support.inproc import cli, start_mock
from tests.support.postgres import PostgresServer
from tests.support.procs import free_port, start

pytestmark = [pytest.mark.postgres]


def test_replay_then_browse_a_postgresql_store(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.create_database("browse_replay")
    mock = start_mock(tmp_path, "--chunk-delay-ms", "1")
    try:
        source = store_source(tmp_path / "unused.db", mock.url, writer=postgres_writer(url))
        headers = [("content-type", "application/json"), ("x-session-id", "ses_pg_replay")]
        turns = [BODY[:-1] + f', "turn": {i}}}'.encode() for i in range(2)]
        session = [
            store_source(tmp_path / "unused.db", mock.url, t, headers=headers, writer=postgres_writer(url))
            for t in turns
        ]
        once = cli("replay", source, "--db", url, "--times", "2", "--json")
        whole = cli("replay", "--session", "ses_pg_replay", "--db", url, "--json")
    finally:
        mock.stop()
    assert once.returncode == 0, once.stderr.decode()
    assert whole.returncode == 0, whole.stderr.decode()
    runs = [json.loads(line) for line in once.stdout.splitlines()]
    assert len(runs) == 2 and all(r["status"] == 200 for r in runs)
    with PostgresReader(url) as reader:
        replays = reader.list_captures(limit=0, tag="replay")
        assert len(replays) == 4
        mine = [r for r in replays if r["source_id"] == source]
        assert sorted(r["id"] for r in mine) == sorted(r["capture_id"] for r in runs)
        again = reader.load_capture(mine[0]["id"])
        assert reader.capture_body(again, "request") == BODY  # the stored bytes went out unchanged
        assert sorted(r["source_id"] for r in replays if r["source_id"] != source) == sorted(session)

    port = free_port()
    browser = start(["browse", "--db", url, "--listen", f"127.0.0.1:{port}"], port, tmp_path / "browse.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            listed = http.get("/").text
            assert all(f'href="/exchange/{i}"' in listed for i in (source, *session, *(r["capture_id"] for r in runs)))
            assert postgres.password not in listed and ":***@" in listed
            found = http.get("/", params={"q": '"sky is blu"'}).text  # a substring, through pg_trgm
            assert f'href="/exchange/{source}"' in found and "<mark>sky is blu</mark>" in found
            page = http.get(f"/exchange/{source}").text
            assert "replays (2)" in page and postgres.password not in page
            assert http.get(f"/exchange/{source}/body/request").content == BODY
            assert http.get(f"/exchange/{source}/body/response").content == b"data: [DONE]\n\n"
            assert http.get(f"/exchange/{source[:12]}", follow_redirects=False).headers["location"].endswith(source)
            assert "ses_pg_replay" in http.get("/sessions").text
    finally:
        browser.stop()  # uvicorn re-raises SIGTERM once it has shut down
    log = browser.log()
    assert postgres.password not in log and "Traceback" not in log
