"""How `tapfix mock` prints an IPv6 `--listen` (its banner, read from the process's output). The forms accepted
and refused, and the loopback rule: tests/unit/cli/test_listen.py."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.support.procs import TAPFIX


def test_mock_prints_an_ipv6_url_in_brackets(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "mock.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*TAPFIX, "mock", "--listen", f"[::1]:{port}"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                socket.create_connection(("::1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        assert f"http://[::1]:{port}/v1" in log.read_text()
    finally:
        proc.terminate()
        proc.wait(10)
