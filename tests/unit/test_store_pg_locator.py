"""PostgreSQL locators: `--db postgresql://…` is recognised, its password never shown, and refused (one
line) while the PostgreSQL backend is not wired in; without psycopg the error names the extra."""

from __future__ import annotations

import sys
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.cli.main import main
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.pg.locator import PostgresLocator, is_postgres_url, mask_password

SAFE = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("postgresql://u@h/db", True),
        ("postgres://h/db", True),
        ("PostgreSQL://h/db", True),
        ("  postgresql:///db?service=tapfix", True),
        ("captures/tapfix.db", False),
        ("postgresql.db", False),
        ("sqlite:///x.db", False),
    ],
)
def test_recognised(value: str, expected: bool) -> None:
    assert is_postgres_url(value) is expected


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://alice:s3cret@db.example:5432/tapfix", "postgresql://alice:***@db.example:5432/tapfix"),
        ("postgres://alice@db/tapfix", "postgres://alice@db/tapfix"),  # no password: nothing to hide
        ("postgresql://:pw@db/tapfix", "postgresql://:***@db/tapfix"),
        (
            "postgresql://db/tapfix?user=a&password=pw&sslmode=require",
            "postgresql://db/tapfix?user=a&password=***&sslmode=require",
        ),
        ("postgresql://a:p@ss:w/rd?x@db/tapfix", "postgresql://a:***@db/tapfix"),  # unescaped specials: hidden whole
        ("captures/tapfix.db", "captures/tapfix.db"),
    ],
)
def test_masked(url: str, shown: str) -> None:
    assert mask_password(url) == shown


@given(
    user=SAFE,
    passwords=st.lists(st.text(min_size=1, max_size=24).filter(lambda p: p.strip("*")), min_size=2, max_size=2),
    raw=st.booleans(),
    host=SAFE,
    port=st.integers(1, 65535),
    db=SAFE,
    in_query=st.booleans(),
)
def test_no_password_survives_masking(
    user: str, passwords: list[str], raw: bool, host: str, port: int, db: str, in_query: bool
) -> None:
    """Whatever the password (any text, percent-encoded or written as it is), the masked URL is the same:
    nothing of the password is left in it. The same for a `password=` query parameter (encoded)."""

    def url(password: str) -> str:
        if in_query:
            return f"postgresql://{user}@{host}:{port}/{db}?sslmode=prefer&password={quote(password, safe='')}"
        spelled = password if raw else quote(password, safe="")
        return f"postgresql://{user}:{spelled}@{host}:{port}/{db}"

    shown = [mask_password(url(p)) for p in passwords]
    assert shown[0] == shown[1]
    assert (f"{user}@" if in_query else f"{user}:***@") in shown[0]
    locator = PostgresLocator(url(passwords[0]))
    for text in (f"could not connect to {url(passwords[0])}", f"bad token {passwords[0]!s} here"):
        scrubbed = locator.scrub(text)
        assert passwords[0] not in scrubbed and quote(passwords[0], safe="") not in scrubbed


def test_refused_in_one_line_with_the_password_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAPFIX_DB", raising=False)
    for value in ("postgresql://alice:hunter2@127.0.0.1:5432/tapfix", "POSTGRES://alice:hunter2@127.0.0.1/tapfix"):
        with pytest.raises(StoreError) as caught:
            StoreLocator.resolve(value)
        message = str(caught.value)
        assert "hunter2" not in message and "alice:***@127.0.0.1" in message
        assert "can't use a PostgreSQL store" in message and "\n" not in message
    monkeypatch.setenv("TAPFIX_DB", "postgres://alice:hunter2@127.0.0.1/tapfix")
    with pytest.raises(StoreError, match=r"postgres://alice:\*\*\*@127.0.0.1/tapfix"):
        StoreLocator.resolve(None)
    assert StoreLocator.resolve("captures/x.db").path.name == "x.db"  # SQLite unchanged


def test_cli_says_it_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAPFIX_DB", "postgresql://alice:hunter2@127.0.0.1:9/tapfix")
    for argv in (["captures", "list"], ["captures", "list", "--db", "postgresql://alice:hunter2@127.0.0.1:9/x"]):
        result = CliRunner().invoke(main, argv)
        assert result.exit_code == 1, result.output
        assert "hunter2" not in result.output and "alice:***@" in result.output
        assert "Traceback" not in result.output and result.output.count("\n") == 1


def test_malformed_url_is_one_line_and_hides_the_password() -> None:
    for url in ("postgresql://u:p%zzsecret@h/db", "postgresql://u:secretpw@h/db?bogus=1"):
        with pytest.raises(StoreError, match="not a usable PostgreSQL URL") as caught:
            PostgresLocator.parse(url)
        assert "secret" not in str(caught.value)


def test_without_psycopg_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what `import psycopg` sees when it isn't installed
    with pytest.raises(StoreError) as caught:
        StoreLocator.resolve("postgresql://alice:hunter2@h/tapfix")
    message = str(caught.value)
    assert "tapfix[postgres]" in message and "psycopg is not installed" in message and "hunter2" not in message
    assert (
        repr(PostgresLocator("postgresql://alice:hunter2@h/tapfix"))
        == "PostgresLocator('postgresql://alice:***@h/tapfix')"
    )
