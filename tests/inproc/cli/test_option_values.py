"""Option values users type (issue 31 item 22): ages as they type them (`1y`, `1h30m`, `90s`, `7d`) on every
age option, a negative age refused as such (never "no capture with id"), NaN and infinity refused on every
float option with a range, `--browse-url` only http(s). A running `captures tail` taking those ages, and
`captures tail | head` ending when `head` does: tests/process/cli/test_option_values.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli.main import main

from tests.support.capture_store import Store
from tests.support.inproc import cli

UPSTREAM = ["--upstream", "http://127.0.0.1:9"]


# -- ages ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("age", ["-5m", "-1h30m", "-90"])
def test_tail_since_a_negative_age_is_refused_as_such(store: Store, age: str) -> None:
    result = cli("captures", "tail", "--db", str(store.path), "--since", age, timeout=20)
    err = result.stderr.decode()
    assert result.returncode == 2 and "negative" in err and "--since" in err, err
    assert "no capture" not in err


@pytest.mark.parametrize("age", ["1y", "1h30m", "90m", "7d"])
def test_purge_max_age_reads_the_same_ages(store: Store, age: str) -> None:
    result = CliRunner().invoke(main, ["captures", "purge", "--db", str(store.path), "--max-age", age, "--dry-run"])
    assert result.exit_code == 0, result.output


def test_purge_max_age_negative_says_so(store: Store) -> None:
    result = CliRunner().invoke(main, ["captures", "purge", "--db", str(store.path), "--max-age", "-3d"])
    assert result.exit_code == 2 and "negative" in result.output, result.output


# -- a closed stdout ----------------------------------------------------------------------------------
# -- floats with a range ------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "+inf", "-inf", "infinity"])
@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["check", "--config", "x.toml", "--timeout"], "--timeout"),
        (["replay", "X", "--timeout"], "--timeout"),
        (["probe", *UPSTREAM, "--timeout"], "--timeout"),
        (["probe", *UPSTREAM, "--needle-depth"], "--needle-depth"),
    ],
)
def test_nan_and_infinity_are_refused(args: list[str], option: str, value: str) -> None:
    result = CliRunner().invoke(main, [*args, value])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output and "finite" in result.output, result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--connect-timeout", "nan"],
        ["--connect-timeout", "inf"],
        ["--shutdown-grace", "inf"],
        ["--shutdown-grace", "nan"],
        ["--regenerate-budget", "nan"],
    ],
)
def test_run_refuses_nan_and_infinity(args: list[str], tmp_path: Path) -> None:
    result = cli("run", *UPSTREAM, "--listen", "127.0.0.1:0", *args, cwd=tmp_path, timeout=20)
    err = result.stderr.decode()
    assert result.returncode == 2 and args[0] in err, err


# -- --browse-url -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "data:text/html,<script>x</script>", "ftp://host/x", "file:///etc/passwd", "host"]
)
def test_browse_url_is_only_http(url: str, tmp_path: Path) -> None:
    result = cli("run", *UPSTREAM, "--listen", "127.0.0.1:0", "--browse-url", url, cwd=tmp_path, timeout=20)
    err = result.stderr.decode()
    assert result.returncode == 2 and "--browse-url" in err and "http" in err, err
