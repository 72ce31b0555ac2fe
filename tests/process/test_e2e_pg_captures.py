"""`tapfix captures list | show | export | tail` on a PostgreSQL store, through the real CLI (subprocesses)
against the suite's real server: the same output as on a SQLite store of the same exchanges, the exact
bytes exported, a tail that prints what a writer commits; and the commands not built for PostgreSQL yet
(`demo`, which keeps a SQLite file of its own) refusing with one line that names what is missing, the password
masked."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tapfix.proxy.store.pg.writer import postgres_writer
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.inproc import cli
from tests.support.postgres import PostgresServer
from tests.support.procs import TAPFIX
from tests.support.sql_store import write_all
from tests.unit.test_store_attempts import exchange
from tests.unit.test_store_reader_backends import cases

pytestmark = [pytest.mark.postgres]


@pytest.fixture(scope="module")
def stores(postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The same exchanges in a PostgreSQL database and a SQLite file."""
    url = postgres.create_database("cli_captures")
    write_all(postgres_writer(url), cases()[1])
    path = tmp_path_factory.mktemp("cli") / "twin.db"
    write_all(CaptureWriter(path), cases()[1])
    return url, path


def ok(*args: str) -> bytes:
    done = cli(*args)
    assert done.returncode == 0, done.stderr.decode()
    return bytes(done.stdout)


def test_list_show_and_export_match_sqlite(stores: tuple[str, Path], tmp_path: Path) -> None:
    url, path = stores
    filled, exchanges, named = cases()
    for filters in ([], ["--trace", "4BF92F3577B34DA6A3CE929D0E0E4736"], ["--flag", "regenerated"]):
        on_pg = ok("captures", "list", "--db", url, "--limit", "0", "--json", *filters)
        assert on_pg == ok("captures", "list", "--db", str(path), "--limit", "0", "--json", *filters)
    assert len(ok("captures", "list", "--db", url, "--limit", "0", "--json").splitlines()) == len(exchanges)
    table = ok("captures", "list", "--db", url, "--flag", "no-such")
    assert b"regenerated" in table and table == ok("captures", "list", "--db", str(path), "--flag", "no-such")
    for capture_id in (filled.session[-1], filled.ids["forwarded"], named["tagged"], named["attempt1"]):
        shown = json.loads(ok("captures", "show", capture_id, "--db", url, "--json"))
        assert shown == json.loads(ok("captures", "show", capture_id, "--db", str(path), "--json"))
        assert ok("captures", "show", capture_id, "--db", url) == ok("captures", "show", capture_id, "--db", str(path))
    for capture_id in (
        filled.session[0],
        filled.session[-1],
        *(filled.ids[k] for k in ("forwarded", "repaired", "binary")),
    ):
        kinds = filled.bodies[capture_id]  # a root body, a delta, a changed request, a repaired answer, not UTF-8
        out = tmp_path / f"{capture_id}.bin"
        ok("captures", "export", capture_id, "--db", url, "--response", "-o", str(out))
        assert out.read_bytes() == kinds["response"]
        assert ok("captures", "export", capture_id, "--db", url, "--forwarded") == kinds["forwarded"]
        assert ok("captures", "export", capture_id, "--db", url, "--client-response") == kinds["client_response"]
    private = cli("captures", "export", filled.ids["private"], "--db", url)
    assert private.returncode != 0 and b"privacy mode" in private.stderr


def _lines(proc: subprocess.Popen[bytes], n: int, timeout: float = 20) -> list[dict[str, object]]:
    assert proc.stdout is not None
    got: list[dict[str, object]] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            buffer += chunk
            *whole, buffer = buffer.split(b"\n")
            got += [json.loads(line) for line in whole if line]
    return got


def test_tail_prints_what_is_committed(stores: tuple[str, Path]) -> None:
    url, _ = stores
    _, exchanges, _ = cases()
    proc = subprocess.Popen(
        [*TAPFIX, "captures", "tail", "--db", url, "--since", "1h", "--json"], stdout=subprocess.PIPE
    )
    try:
        first = _lines(proc, len(exchanges))
        assert sorted(str(r["id"]) for r in first) == sorted(ex.id for ex in exchanges)
        new = exchange()
        write_all(postgres_writer(url), [new])
        assert [r["id"] for r in _lines(proc, 1)] == [new.id]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize("command", [["demo"]])
def test_commands_not_built_for_postgresql_refuse_naming_it(postgres: PostgresServer, command: list[str]) -> None:
    url = postgres.dsn("cli_captures")
    done = cli(*command, "--db", url)
    message = done.stderr.decode()
    assert done.returncode != 0 and "can't use a PostgreSQL store" in message, message
    assert postgres.password not in message and ":***@" in message
    assert "Traceback" not in message
