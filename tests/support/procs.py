"""Start real tapfix processes on loopback for end-to-end tests, and stop them by PID."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TAPFIX = [sys.executable, "-m", "tapfix.proxy.cli"]
STARTED: list[Proc] = []  # every process `start` began, for the logs a failing test shows (tests/conftest.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def response_head(port: int, request: bytes, timeout: float = 10.0) -> bytes:
    """Send raw request bytes over one connection and read until the response head is complete
    (or the server closes): for requests no HTTP client would send."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                break
            head += data
    return head


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}:\n" + _output(proc))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def _output(proc: subprocess.Popen) -> str:
    log = getattr(proc, "log_path", None)
    return Path(log).read_text(errors="replace")[-4000:] if log and Path(log).exists() else ""


@dataclass
class Proc:
    proc: subprocess.Popen
    port: int
    log_path: Path
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    # The calls an in-process proxy answers too (tests/support/inproc.py), so a helper serves both tiers.
    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        """SIGTERM: the first starts the shutdown grace, another ends it."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code; TimeoutError if the process still runs after `timeout`."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.proc.args} still runs after {timeout}s") from None


def start(args: list[str], port: int, log_path: Path, env: dict | None = None) -> Proc:
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        TAPFIX + args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
    )
    proc.log_path = log_path  # type: ignore[attr-defined]
    return listening(Proc(proc, port, log_path))


def listening(handle: Proc) -> Proc:
    """The process once its port accepts connections (a process that can't get there is killed, and the
    error raised); every one is stopped at the session's end if a test didn't."""
    STARTED.append(handle)
    try:
        wait_port(handle.port, handle.proc)
    except Exception:
        handle.stop(signal.SIGKILL)
        raise
    return handle


def start_mock(tmp: Path, *args: str) -> Proc:
    port = free_port()
    return start(["mock", "--listen", f"127.0.0.1:{port}", *args], port, tmp / f"mock-{port}.log")


def start_proxy(tmp: Path, upstream: str, *args: str, db: Path | None = None, env: dict | None = None) -> Proc:
    port = free_port()
    db = db or tmp / "captures.db"
    handle = start(
        ["run", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", str(db), *args],
        port,
        tmp / f"proxy-{port}.log",
        env,
    )
    handle.extra["db"] = db
    return handle


def until[T](check: Callable[[], T], timeout: float, every: float = 0.1) -> T:
    """Polls `check` until it returns something truthy or `timeout` passes; its last result (the caller asserts
    on it, so a timeout fails with what was seen)."""
    deadline = time.monotonic() + timeout
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(every)
    return result


# How often a test looks for a capture: a read-only query is cheap, and the fuzz of the capture path waits
# for one capture per example (200 of them).
STORE_POLL_S = 0.01


def wait_capture(db: Path, capture_id: str, timeout: float = 10.0) -> dict:
    """Poll the store (read-only, as any reader does) until the writer has committed the capture."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            conn.row_factory = sqlite3.Row
            try:
                row = conn.execute("select * from exchanges where id = ?", (capture_id,)).fetchone()
            except sqlite3.OperationalError:
                row = None
            finally:
                conn.close()
            if row is not None:
                return dict(row)
        time.sleep(STORE_POLL_S)
    raise TimeoutError(f"capture {capture_id} not in {db} after {timeout}s")


def cli(
    *args: str, env: dict | None = None, input: bytes | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        TAPFIX + list(args),
        capture_output=True,
        env={**os.environ, **(env or {})},
        input=input,
        timeout=timeout,
        cwd=cwd,
    )


@contextmanager
def mock_then_proxy(
    mock_starter: Callable[..., Any],
    proxy_starter: Callable[..., Any],
    tmp: Path,
    scenario: str | dict,
    *args: str,
    **kw: Any,
) -> Iterator[tuple[Any, Any]]:
    """The mock with `--scenario` (a name, a file, or a dict written to one) and the proxy in front of it, both
    stopped at the end, each started by the tier's own function (processes here, tests/support/inproc.py's)."""
    if isinstance(scenario, dict):
        path = tmp / "scenario.json"
        path.write_text(json.dumps(scenario))
        scenario = str(path)
    mock = mock_starter(tmp, "--scenario", scenario)
    try:
        proxy = proxy_starter(tmp, mock.url, *args, **kw)
        try:
            yield mock, proxy
        finally:
            proxy.stop()
    finally:
        mock.stop()


def mock_and_proxy(tmp: Path, scenario: str | dict, *proxy_args: str) -> AbstractContextManager[tuple[Proc, Proc]]:
    """`tapfix mock --scenario` and `tapfix run` in front of it, both stopped at the end."""
    return mock_then_proxy(start_mock, start_proxy, tmp, scenario, *proxy_args)
