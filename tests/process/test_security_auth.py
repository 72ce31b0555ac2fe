"""Who can get in: loopback by default; beyond loopback only with the tapfix token, given as the client's
API key, checked in constant time, stripped, and never forwarded (the upstream gets its own key).

A start-up refusal is the process's own answer (its message and exit code): `tapfix run` for real.
"""

from __future__ import annotations

import os

from tests.support.procs import cli, free_port


def test_non_loopback_without_token_refuses_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TAPFIX_TOKEN"}
    result = cli(
        "run",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        f"0.0.0.0:{free_port()}",
        "--db",
        str(tmp_path / "c.db"),
        env=env | {"TAPFIX_TOKEN": ""},
    )
    assert result.returncode != 0
    message = result.stderr.decode()
    assert "refusing to listen" in message and "--token" in message and "TAPFIX_TOKEN" in message
    short = cli(
        "run",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        f"0.0.0.0:{free_port()}",
        "--token",
        "abc",
        "--db",
        str(tmp_path / "c.db"),
    )
    assert short.returncode != 0 and "at least 8" in short.stderr.decode()
