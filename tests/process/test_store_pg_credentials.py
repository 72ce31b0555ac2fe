"""The password need not be in the URL: libpq's own sources of it (`PGPASSWORD`, `~/.pgpass`, a service in
`PGSERVICE`) work for every command, because tapfix hands libpq the URL as it is. Each case writes a
store (`captures copy` into PostgreSQL migrates it and writes through the writer's backend) and reads it
back (`captures list`), both as real processes with only that source of the password; a wrong one fails
in one line that doesn't show it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.inproc import cli
from tests.support.postgres import SERVER_USER, PostgresServer
from tests.support.sql_store import store_cases, write_all

pytestmark = [pytest.mark.postgres]


def _credentials(kind: str, server: PostgresServer, database: str, home: Path) -> tuple[str, dict[str, str]]:
    """The `--db` URL (no password in it) and the environment that supplies the password."""
    bare = f"postgresql://{SERVER_USER}@127.0.0.1:{server.port}/{database}"
    if kind == "PGPASSWORD":
        return bare, {"PGPASSWORD": server.password}
    if kind == "pgpass":
        pgpass = home / ".pgpass"
        pgpass.write_text(f"127.0.0.1:{server.port}:{database}:{SERVER_USER}:{server.password}\n")
        pgpass.chmod(0o600)  # libpq ignores a .pgpass others can read
        return bare, {"HOME": str(home)}
    services = home / "pg_service.conf"
    services.write_text(
        f"[tapfix]\nhost=127.0.0.1\nport={server.port}\ndbname={database}\nuser={SERVER_USER}\n"
        f"password={server.password}\n"
    )
    return "postgresql://", {"PGSERVICEFILE": str(services), "PGSERVICE": "tapfix"}


@pytest.mark.parametrize("kind", ["PGPASSWORD", "pgpass", "PGSERVICE"])
def test_the_password_from_libpq_sources_writes_and_reads_a_store(
    kind: str, postgres: PostgresServer, tmp_path: Path
) -> None:
    source = tmp_path / "source.db"
    _, exchanges = store_cases(turns=3)
    write_all(CaptureWriter(source), exchanges)
    database = f"creds_{kind.lower()}"
    postgres.create_database(database)
    home = tmp_path / "home"
    home.mkdir()
    url, env = _credentials(kind, postgres, database, home)
    env |= {"PGPASSFILE": str(home / ".pgpass")} if kind == "pgpass" else {"PGPASSFILE": str(home / "none")}

    copied = cli("captures", "copy", "--from", str(source), "--to", url, env=env)
    assert copied.returncode == 0, copied.stderr.decode()
    listed = cli("captures", "list", "--db", url, "--json", env=env)
    assert listed.returncode == 0, listed.stderr.decode()
    ids = {orjson.loads(line)["id"] for line in listed.stdout.splitlines()}  # JSON lines
    assert ids == {ex.id for ex in exchanges}
    for out in (copied, listed):
        assert postgres.password not in (out.stdout + out.stderr).decode()


def test_a_wrong_password_fails_in_one_line_without_showing_it(postgres: PostgresServer, tmp_path: Path) -> None:
    database = "creds_wrong"
    postgres.create_database(database)
    wrong = "not-" + postgres.password
    url = f"postgresql://{SERVER_USER}:{wrong}@127.0.0.1:{postgres.port}/{database}"
    out = cli("captures", "list", "--db", url, env={"PGPASSFILE": str(tmp_path / "none")})
    said = out.stderr.decode()
    assert out.returncode != 0 and "Traceback" not in said and len(said.strip().splitlines()) == 1, said
    assert wrong not in said and postgres.password not in said and f"{SERVER_USER}:***@" in said
