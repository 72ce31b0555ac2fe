"""The in-process tier's machinery (tests/support/inproc.py) keeps what a process gave for free: the
capture writer drained at stop, the log, the environment, one proxy at a time (a module's steps aside
and comes back where it was), the CLI's exit codes, the shutdown grace on terminate."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx
import pytest
from tapfix.proxy.store.sqlite.database import open_for_writing

from tests.support.inproc import InprocMock, InprocProxy, OneAtATime, WouldServe, cli, start_proxy
from tests.support.procs import wait_capture


def _chat(proxy: InprocProxy) -> str:
    body = {"model": "tapfix-mock", "messages": [{"role": "user", "content": "Say hello"}]}
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.headers["x-tapfix-capture-id"]


def test_stop_drains_the_writer_and_puts_back_the_log_and_the_environment(tmp_path: Path, mock: InprocMock) -> None:
    handlers = list(logging.getLogger().handlers)
    level = logging.getLogger("tapfix").level
    proxy = start_proxy(tmp_path, mock.url, "--token", "tok-123456789", env={"TAPFIX_INPROC_PROBE": "set"})
    try:
        assert os.environ["TAPFIX_INPROC_PROBE"] == "set"
        refused = httpx.post(f"{proxy.url}/v1/chat/completions", json={}, timeout=10)
        assert refused.status_code == 401
        headers = {"authorization": "Bearer tok-123456789"}
        body = {"model": "tapfix-mock", "messages": [{"role": "user", "content": "hi"}]}
        capture_id = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers).headers[
            "x-tapfix-capture-id"
        ]
    finally:
        assert proxy.stop() == 0
    assert not proxy.alive() and proxy.runtime.writer.health()["queue_depth"] == 0
    assert wait_capture(proxy.extra["db"], capture_id, timeout=0.5)["status"] == 200  # stored by the time stop returned
    assert "rejected a request without the tapfix token" in proxy.log()
    assert "TAPFIX_INPROC_PROBE" not in os.environ
    assert logging.getLogger().handlers == handlers and logging.getLogger("tapfix").level == level


def test_one_proxy_at_a_time_and_a_modules_proxy_steps_aside(
    tmp_path: Path, mock: InprocMock, proxy: InprocProxy
) -> None:
    before = _chat(proxy)
    port, db = proxy.port, proxy.extra["db"]
    own = start_proxy(tmp_path, mock.url)  # the module's proxy steps aside
    try:
        assert not proxy.alive() and own.alive()
        with pytest.raises(OneAtATime, match="already runs"):
            start_proxy(tmp_path, mock.url, db=tmp_path / "second.db")
        _chat(own)
    finally:
        own.stop()
    after = _chat(proxy)  # back on its port, with its store
    assert proxy.port == port and proxy.alive()
    assert wait_capture(db, before) and wait_capture(db, after)


def test_terminate_is_the_shutdown_grace(tmp_path: Path, mock: InprocMock) -> None:
    proxy = start_proxy(tmp_path, mock.url, "--shutdown-grace", "0")
    try:
        _chat(proxy)
        proxy.terminate()
        assert proxy.wait(10) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{proxy.url}/tapfix/health", timeout=2)
    finally:
        proxy.stop()


def test_cli_gives_exit_codes_and_output_as_the_process_does(tmp_path: Path) -> None:
    missing = cli("captures", "show", "01nope", "--db", str(tmp_path / "none.db"))
    assert missing.returncode == 1 and missing.stdout == b"" and missing.stderr
    usage = cli("captures", "list", "--limit", "many")
    assert usage.returncode == 2 and b"--limit" in usage.stderr
    assert cli("--help").stdout.startswith(b"Usage: tapfix")


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"],
        ["mock", "--listen", "127.0.0.1:0"],
        ["browse", "--listen", "127.0.0.1:0"],
        ["demo", "--listen", "127.0.0.1:0", "--mock-listen", "127.0.0.1:0"],
    ],
    ids=["run", "mock", "browse", "demo"],
)
def test_cli_fails_a_command_that_goes_on_to_serve_instead_of_hanging(args: list[str], tmp_path: Path) -> None:
    """A refusal test that stopped refusing would otherwise serve in the test process forever."""
    open_for_writing(tmp_path / "c.db").close()  # browse wants a store to show
    with pytest.raises(WouldServe, match=f"tapfix {args[0]} "):
        cli(*args, "--db", str(tmp_path / "c.db"), cwd=tmp_path)
    assert cli("--help").returncode == 0  # served nothing, and the guard is gone


def test_cli_runs_in_the_given_working_directory(tmp_path: Path) -> None:
    here = Path.cwd()
    open_for_writing(tmp_path / "relative.db").close()
    assert cli("captures", "list", "--db", "relative.db", cwd=tmp_path).returncode == 0
    assert Path.cwd() == here and cli("captures", "list", "--db", "relative.db").returncode == 1
