"""Byte sizes: one parser for every size option, a unit expected (issue 31 item 3).

`--store-queue-bytes 10` was taken as 10 bytes: during an outage 3 of 4 captures were lost. A size takes a
unit (`256MiB`, `1GB`, `500M`, `2G`); a bare number is bytes only from 1 MiB up (below that it is surely a
missing unit, and is refused naming it); what already parsed still does (`--max-size 2G`)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli.main import main
from tapfix.proxy.quantities import parse_size

from tests.support.inproc import cli

KI, MI, GI = 1024, 1024**2, 1024**3


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("256MiB", 256 * MI),
        ("256MB", 256 * MI),
        ("256M", 256 * MI),
        ("256 mib", 256 * MI),
        ("1GB", GI),
        ("1GiB", GI),
        ("2G", 2 * GI),
        ("1.5GB", int(1.5 * GI)),
        ("100k", 100 * KI),
        ("64KiB", 64 * KI),
        ("1T", 1024 * GI),
        ("10B", 10),
        ("4096 bytes", 4096),
        ("1048576", MI),  # a bare number of bytes, from 1 MiB up
        ("2000000000", 2_000_000_000),
    ],
)
def test_sizes_with_their_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("10", "has no unit"),
        ("1000", "has no unit"),
        ("-5M", "negative"),
        ("-5", "negative"),
        ("big", "not a size"),
        ("nan", "not a size"),
        ("inf", "not a size"),
        ("5X", "not a size"),
        ("", "not a size"),
    ],
)
def test_what_is_refused_and_why(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_size(text)


def test_a_bare_number_is_told_its_unit() -> None:
    with pytest.raises(ValueError) as raised:
        parse_size("10")
    assert "10M" in str(raised.value) and "10G" in str(raised.value) and "10B" in str(raised.value)


def test_purge_max_size_takes_the_same_parser() -> None:
    result = CliRunner().invoke(main, ["captures", "purge", "--max-size", "10", "--db", "none.db"])
    assert result.exit_code == 2 and "has no unit" in result.output, result.output


@pytest.mark.parametrize(
    ("value", "says"),
    [("10", "has no unit"), ("10B", "below the minimum"), ("512k", "below the minimum"), ("-1G", "negative")],
)
def test_run_refuses_a_store_queue_that_cant_hold_an_exchange(value: str, says: str, tmp_path) -> None:
    result = cli(
        "run", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--store-queue-bytes", value,
        cwd=tmp_path, timeout=20,
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 2 and "--store-queue-bytes" in err and says in err, err
