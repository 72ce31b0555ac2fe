"""The sqlite-utils and Datasette plugins (store/sql_plugins.py), through the real tools: the
`sqlite-utils` command and a `datasette` server on loopback, both finding the plugin by its entry point."""

from __future__ import annotations

import base64
import html
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.procs import Proc, free_port, wait_port
from tests.support.sql_store import Filled, fill_store

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Filled:
    return fill_store(tmp_path_factory.mktemp("sql") / "tapfix.db", turns=12)


def _sqlite_utils(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "sqlite-utils"), *args], capture_output=True, text=True, timeout=60)


def test_sqlite_utils_query_reads_bodies(filled: Filled) -> None:
    last, binary = filled.session[-1], filled.ids["binary"]
    done = _sqlite_utils(
        "query",
        str(filled.path),
        "select id, tapfix_body(id, 'request') as request, tapfix_body(id, 'client_response') as answer,"
        " tapfix_body_bytes(id, 'request') as exact from exchanges where id in (:last, :binary) order by id = :binary",
        "-p",
        "last",
        last,
        "-p",
        "binary",
        binary,
    )
    assert done.returncode == 0, done.stderr
    text_row, binary_row = json.loads(done.stdout)
    assert text_row["request"] == filled.bodies[last]["request"].decode()
    assert text_row["answer"] == filled.bodies[last]["response"].decode()  # stored once: the fallback
    for row, exchange_id in ((text_row, last), (binary_row, binary)):
        assert base64.b64decode(row["exact"]["encoded"]) == filled.bodies[exchange_id]["request"]
    assert binary_row["request"]["$base64"]  # not UTF-8: a BLOB, which sqlite-utils prints as base64
    rows = _sqlite_utils("rows", str(filled.path), "exchange_bodies", "-c", "id", "-c", "response")
    assert rows.returncode == 0, rows.stderr
    assert {r["id"]: r["response"] for r in json.loads(rows.stdout)}[last] == filled.bodies[last]["response"].decode()


def test_sqlite_utils_unknown_kind_names_the_kinds(filled: Filled) -> None:
    done = _sqlite_utils("query", str(filled.path), "select tapfix_body(id, 'headers') from exchanges")
    assert done.returncode != 0
    assert "user-defined function raised exception" in done.stderr
    assert (
        "tapfix_body: unknown kind 'headers': use one of request, forwarded, response, client_response" in done.stderr
    )


@pytest.fixture(scope="module")
def datasette(filled: Filled, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """`datasette tapfix.db -i frozen.db`: the store opened read-only, and a copy opened immutable."""
    frozen = tmp_path_factory.mktemp("frozen") / "frozen.db"
    shutil.copy(filled.path, frozen)
    port = free_port()
    log_path = frozen.with_suffix(".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "datasette"), "serve", str(filled.path), "-i", str(frozen), "-h", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handle = Proc(proc, port, log_path)
    try:
        wait_port(port, proc, timeout=30)
        yield handle
    finally:
        handle.stop()


@pytest.mark.parametrize("database", ["tapfix", "frozen"])
def test_datasette_shows_request_and_response_text(filled: Filled, datasette: Proc, database: str) -> None:
    with httpx.Client(base_url=datasette.url, timeout=30) as client:
        page = client.get(f"/{database}/exchange_bodies.json", params={"_shape": "array", "_sort_desc": "id"})
        assert page.status_code == 200, page.text
        rows = {row["id"]: row for row in page.json()}
        assert set(rows) == set(filled.bodies)
        for exchange_id in filled.session:
            sent = filled.bodies[exchange_id]
            assert rows[exchange_id]["request"] == sent["request"].decode()
            assert rows[exchange_id]["response"] == sent["response"].decode()
        repaired = filled.ids["repaired"]
        assert rows[repaired]["client_response"] == filled.bodies[repaired]["client_response"].decode()
        # the HTML page a user opens: the newest turn's request (its start: cells are cut at 2,000
        # characters) and its whole answer, escaped
        shown = client.get(f"/{database}/exchange_bodies", params={"_sort_desc": "id"})
        assert shown.status_code == 200
        last = filled.bodies[filled.session[-1]]
        assert html.escape(last["request"].decode()[:300], quote=False) in _unescaped_quotes(shown.text)
        assert html.escape(last["response"].decode(), quote=False) in _unescaped_quotes(shown.text)
        size = len(filled.bodies[filled.ids["binary"]]["request"])
        assert f"&lt;binary body, {size} bytes: tapfix_body_bytes(id, &#39;request&#39;) has them&gt;" in shown.text
        query = client.get(
            f"/{database}.json",
            params={
                "sql": "select tapfix_body(:id, 'forwarded') as f",
                "id": filled.ids["forwarded"],
                "_shape": "array",
            },
        )
        assert query.json() == [{"f": filled.bodies[filled.ids["forwarded"]]["forwarded"].decode()}]


def _unescaped_quotes(page: str) -> str:
    """Datasette escapes `"` as `&#34;`; `html.escape(quote=False)` leaves it: compare alike."""
    return page.replace("&#34;", '"').replace("&#39;", "'")


def test_plugin_module_imports_neither_mitmproxy_nor_click() -> None:
    code = (
        "import sys, tapfix.proxy.store.sql_plugins;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mitmproxy', 'click')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"
