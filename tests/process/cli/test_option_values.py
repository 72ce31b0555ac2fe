"""Option values users type (issue 31 item 22), where only a `captures tail` process shows it: the ages users
type taken by a tail that runs until Ctrl-C, and `captures tail | head` ending when `head` does. The other
values (negative ages, NaN and infinity, `--browse-url`): tests/inproc/cli/test_option_values.py."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.support.capture_store import Store
from tests.support.procs import TAPFIX


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
@pytest.mark.parametrize("age", ["1y", "1h30m", "90s", "7d", "2w", "1d12h"])
def test_tail_since_takes_the_ages_users_type(store: Store, age: str) -> None:
    proc = _tail(store.path, "--json", "--since", age)
    rows = [json.loads(line) for line in _lines(proc, 4)]  # the store's four exchanges, all minutes old
    assert {r["id"] for r in rows} == {store.streamed, store.binary, store.private, store.failed}
    assert _interrupt(proc) == 0


# -- a closed stdout ----------------------------------------------------------------------------------
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
