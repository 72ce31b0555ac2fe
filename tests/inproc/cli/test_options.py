"""The shared options: ranges, deprecated spellings, unusable databases, help examples (no server starts)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import pytest
from click.testing import CliRunner, Result
from tapfix.proxy.cli import main

from tests.support.capture_store import Store
from tests.support.inproc import cli, start_proxy

UPSTREAM = ["--upstream", "http://127.0.0.1:9"]


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield (*prefix, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


def test_every_command_help_ends_with_an_example() -> None:
    paths = [()] + [path for path, _ in _commands(main)]
    assert ("captures", "purge") in paths and ("probe",) in paths and len(paths) >= 13
    for path in paths:
        result = _invoke(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        example = result.stdout.split("Example:", 1)
        assert len(example) == 2, (path, result.stdout)
        lines = example[1].split("Options:")[0].strip().splitlines()
        assert lines and all(line.strip().startswith(("tapfix ", "TAPFIX_")) for line in lines), (path, lines)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["run", *UPSTREAM, "--connect-timeout", "0"], "--connect-timeout"),
        (["run", *UPSTREAM, "--connect-timeout", "-1"], "--connect-timeout"),
        (["run", *UPSTREAM, "--idle-timeout", "0"], "--idle-timeout"),
        (["run", *UPSTREAM, "--max-age", "soon"], "--max-age"),
        (["run", *UPSTREAM, "--max-size", "big"], "--max-size"),
        (["mock", "--chunk-delay-ms", "-1"], "--chunk-delay-ms"),
        (["check", "--config", "x.toml", "--timeout", "0"], "--timeout"),
        (["captures", "list", "--limit", "-1"], "--limit"),
        (["captures", "purge", "--max-age", "-3d"], "--max-age"),
        (["replay", "X", "--timeout", "0"], "--timeout"),
        (["replay", "X", "--times", "0"], "--times"),
        (["replay", "X", "--concurrency", "0"], "--concurrency"),
        (["probe", *UPSTREAM, "--timeout", "0"], "--timeout"),
        (["probe", *UPSTREAM, "--needle-tokens", "5"], "--needle-tokens"),
        (["probe", *UPSTREAM, "--needle-depth", "1.5"], "--needle-depth"),
    ],
)
def test_numeric_options_are_range_checked(args: list[str], option: str) -> None:
    result = _invoke(*args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.stderr and args[-1] in result.stderr


def test_old_purge_spelling_warns_and_still_works(store: Store) -> None:
    with sqlite3.connect(store.path) as conn:  # an hour old: --max-age refuses ages under a minute
        conn.execute("update exchanges set ts = ts - 3600")
    conn.close()
    result = _invoke("captures", "purge", "--db", str(store.path), "--older-than", "1m", "--json")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "tapfix: --older-than is deprecated, use --max-age (same meaning)"
    assert '"exchanges":4' in result.stdout
    both = _invoke("captures", "purge", "--db", str(store.path), "--older-than", "1d", "--max-age", "1d")
    assert both.exit_code == 2 and "give only --max-age" in both.stderr
    bad = _invoke("captures", "purge", "--db", str(store.path), "--older-than", "soon")
    assert bad.exit_code == 2 and "not a duration" in bad.stderr


def test_new_purge_spelling(store: Store) -> None:
    result = _invoke("captures", "purge", "--db", str(store.path), "--max-age", "1d")
    assert result.exit_code == 0 and not result.stderr and "purged 0 exchange(s)" in result.stdout
    nothing = _invoke("captures", "purge", "--db", str(store.path))
    assert nothing.exit_code == 2 and "--max-age AGE" in nothing.stderr


def test_old_spellings_are_hidden_from_help() -> None:
    for path, old, new in (
        (("run",), "--max-db-size", "--max-size"),
        (("run",), "--upstream-key-env", "--key-env"),
        (("captures", "purge"), "--older-than", "--max-age"),
    ):
        shown = _invoke(*path, "--help").stdout
        assert new in shown and old not in shown, path


def test_old_run_spelling_warns_before_anything_starts() -> None:
    result = _invoke("run", "--max-db-size", "nonsense")
    assert result.exit_code == 2 and "Invalid value for '--max-db-size'" in result.stderr
    result = _invoke("run", "--upstream-key-env", "K")  # no --upstream: a usage error once the alias is read
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "tapfix: --upstream-key-env is deprecated, use --key-env (same meaning)"


def test_old_run_spellings_still_set_the_same_thing(tmp_path: Path) -> None:
    proxy = start_proxy(
        tmp_path,
        "http://127.0.0.1:9",
        "--max-db-size",
        "3M",
        "--max-age",
        "2h",
        "--upstream-key-env",
        "TAPFIX_TEST_UPSTREAM_KEY",
        env={"TAPFIX_TEST_UPSTREAM_KEY": "k-123"},
    )
    try:
        retention = httpx.get(f"{proxy.url}/tapfix/health", timeout=10).json()["capture_writer"]["retention"]
        assert retention["max_bytes"] == 3 * 1024**2 and retention["max_age_s"] == 7200
    finally:
        proxy.stop()
    log = proxy.log()
    assert "--max-db-size is deprecated, use --max-size" in log and "--upstream-key-env is deprecated" in log


UNUSABLE = ["/sys/x.db", "/proc/nope/x.db", "FILE/x.db", "DIR"]


def _unusable(tmp_path: Path, name: str) -> str:
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir(exist_ok=True)
    return name.replace("FILE", str(tmp_path / "file")).replace("DIR", str(tmp_path / "dir"))


@pytest.mark.parametrize("db", UNUSABLE)
@pytest.mark.parametrize(
    "args",
    [
        ["captures", "list"],
        ["captures", "show", "X"],
        ["captures", "show", "X", "--json"],
        ["captures", "export", "X"],
        ["captures", "purge", "--max-age", "1d"],
        ["replay", "X"],
        ["probe", *UPSTREAM],
        ["mock", "--capture", "X"],
        ["browse"],
        ["run", *UPSTREAM],
    ],
)
def test_an_unusable_db_is_one_line(tmp_path: Path, db: str, args: list[str]) -> None:
    path = _unusable(tmp_path, db)
    result = _invoke(*args, "--db", path)
    assert result.exit_code in (1, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and path in lines[0], lines


@pytest.mark.parametrize("db", UNUSABLE)
def test_demo_with_an_unusable_db_is_one_line(tmp_path: Path, db: str) -> None:
    path = _unusable(tmp_path, db)
    result = cli("demo", "--listen", "127.0.0.1:0", "--mock-listen", "127.0.0.1:0", "--db", path)
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and path in lines[0], lines


def test_db_comes_from_the_environment(store: Store, tmp_path: Path) -> None:
    runner = CliRunner(env={"TAPFIX_DB": str(store.path)})
    result = runner.invoke(main, ["captures", "list", "--json", "--limit", "0"])
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 4
    given = runner.invoke(main, ["captures", "list", "--db", str(tmp_path / "other.db")])
    assert given.exit_code == 1 and "no capture database at" in given.stderr


def test_a_foreign_database_is_one_line(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("create table t (x)")
    conn.close()
    result = _invoke("captures", "list", "--db", str(foreign))
    assert result.exit_code == 1 and "not a tapfix capture database" in result.stderr
