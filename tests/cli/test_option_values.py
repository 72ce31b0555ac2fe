"""Option values users type (issue 31 item 22): ages as they type them (`1y`, `1h30m`, `90s`, `7d`) on every
age option, a negative age refused as such (never "no capture with id"), NaN and infinity refused on every
float option with a range, `--browse-url` only http(s), and `captures tail | head` ending when `head` does."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli.main import main

from tests.cli.conftest import Store
from tests.support.procs import TAPFIX, cli

UPSTREAM = ["--upstream", "http://127.0.0.1:9"]


def _tail(db: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*TAPFIX, "captures", "tail", "--db", str(db), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _lines(proc: subprocess.Popen[bytes], count: int, timeout: float = 20.0) -> list[str]:
    got: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            got.put(line.decode())

    threading.Thread(target=read, daemon=True).start()
    lines = []
    try:
        for _ in range(count):
            lines.append(got.get(timeout=timeout))
    except queue.Empty:
        proc.kill()
        raise AssertionError(f"{len(lines)} of {count} lines: {lines}; stderr: {proc.communicate()[1]!r}") from None
    return lines


def _interrupt(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(10)
    finally:
        proc.kill()


# -- ages ---------------------------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.parametrize("age", ["1y", "1h30m", "90s", "7d", "2w", "1d12h"])
def test_tail_since_takes_the_ages_users_type(store: Store, age: str) -> None:
    proc = _tail(store.path, "--json", "--since", age)
    rows = [json.loads(line) for line in _lines(proc, 4)]  # the store's four exchanges, all minutes old
    assert {r["id"] for r in rows} == {store.streamed, store.binary, store.private, store.failed}
    assert _interrupt(proc) == 0


@pytest.mark.e2e
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
@pytest.mark.e2e
def test_tail_into_head_returns_without_waiting_for_a_capture(store: Store) -> None:
    """`tapfix captures tail | head -1`: head reads the header and leaves; no capture comes after. The tail
    notices its reader is gone (the pipe's write end reports an error) and ends, quietly, with 0."""
    proc = _tail(store.path)
    assert proc.stdout is not None and proc.stdout.readline().startswith(b"ID ")
    proc.stdout.close()
    try:
        code = proc.wait(10)  # a poll interval or two; before, it waited for the next capture, forever
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the tail kept running after its reader left") from None
    assert code == 0 and proc.stderr is not None and proc.stderr.read() == b""


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


@pytest.mark.e2e
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
@pytest.mark.e2e
@pytest.mark.parametrize(
    "url", ["javascript:alert(1)", "data:text/html,<script>x</script>", "ftp://host/x", "file:///etc/passwd", "host"]
)
def test_browse_url_is_only_http(url: str, tmp_path: Path) -> None:
    result = cli("run", *UPSTREAM, "--listen", "127.0.0.1:0", "--browse-url", url, cwd=tmp_path, timeout=20)
    err = result.stderr.decode()
    assert result.returncode == 2 and "--browse-url" in err and "http" in err, err
