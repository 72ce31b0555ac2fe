"""A `--db` that looks like a URL but isn't a store URL is refused, never a SQLite file (issue 31 item 2).

`--db 'postgressql://tapfix:sekret@host/tapfix'` (one extra s) used to start, print the password in the
banner and create `./postgressql:/tapfix:sekret@host/tapfix`; `check --db 'postgresql:/tapfix'` said
"store ok". A value with an unknown scheme, or a known scheme written wrong, is now a usage error that
names the scheme, with the password masked, wherever a locator is taken: --db, $TAPFIX_DB, the config's
`db`; and nothing is created on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli.main import main
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator

from tests.support.inproc import cli

TYPO = "postgressql://tapfix:sekret@host/tapfix"
REFUSED = [
    (TYPO, "'postgressql'"),
    ("postgresql:/tapfix", "postgresql://"),  # one slash: a malformed PostgreSQL URL
    ("postgresql:tapfix", "postgresql://"),
    ("postgres:/u:sekret@h/db", "postgres://"),
    ("mysql://u:sekret@h/db", "'mysql'"),
    ("sqlite:///tmp/x.db", "'sqlite'"),
    ("file:///tmp/x.db", "'file'"),
    ("postgersql://u:sekret@h/db", "'postgersql'"),
]
ACCEPTED = ["captures/tapfix.db", "/tmp/a:b.db", "tapfix:2026.db", "postgresql.db", "./postgres/x.db", "C:/x.db"]


@pytest.mark.parametrize(("value", "named"), REFUSED)
def test_url_like_values_are_refused_naming_the_scheme(value: str, named: str) -> None:
    with pytest.raises(StoreError) as raised:
        StoreLocator.resolve(value, postgres=True)
    message = str(raised.value)
    assert named in message and "sekret" not in message, message


@pytest.mark.parametrize("value", ACCEPTED)
def test_file_paths_are_sqlite_stores(value: str) -> None:
    locator = StoreLocator.resolve(value, postgres=True)
    assert locator.postgres is None and locator.path == Path(value)


def test_a_typo_is_suggested_its_scheme() -> None:
    with pytest.raises(StoreError, match="did you mean postgresql://"):
        StoreLocator.resolve(TYPO, postgres=True)


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--db", "postgresql:/tapfix"],
        ["captures", "list", "--db", TYPO],
        ["captures", "show", "X", "--db", TYPO],
        ["captures", "purge", "--max-age", "7d", "--db", TYPO],
    ],
)
def test_every_command_refuses_it_before_doing_anything(args: list[str], tmp_path: Path) -> None:
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as where:
        result = runner.invoke(main, args)
        assert result.exit_code == 2, result.output
        assert "--db" in result.output and "sekret" not in result.output, result.output
        assert "store ok" not in result.output
        assert os.listdir(where) == []  # no SQLite file (or folder) named after the URL


def test_tapfix_db_is_refused_naming_the_variable(tmp_path: Path) -> None:
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as where:
        result = runner.invoke(main, ["captures", "list"], env={"TAPFIX_DB": TYPO})
        assert result.exit_code == 2 and "$TAPFIX_DB" in result.output and "'postgressql'" in result.output
        assert "sekret" not in result.output and os.listdir(where) == []


def test_config_db_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "tapfix.toml"
    config.write_text(f'db = "{TYPO}"\n[upstreams.u]\nbase_url = "http://127.0.0.1:9"\nengine = "vllm"\n[models.m]\n')
    ran = cli("run", "--config", str(config), "--listen", "127.0.0.1:0", cwd=tmp_path, timeout=20)
    err = ran.stderr.decode()
    assert ran.returncode != 0 and "'postgressql'" in err and "sekret" not in err, err
    assert sorted(os.listdir(tmp_path)) == ["tapfix.toml"]
    checked = CliRunner().invoke(main, ["check", "--config", str(config)])
    assert checked.exit_code != 0 and "'postgressql'" in checked.output and "sekret" not in checked.output
