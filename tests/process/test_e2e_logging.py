"""What `tapfix run` writes to its log: each tapfix line once (mitmproxy's own log handler also sits on
the root logger and used to print every tapfix warning a second time, in its own format)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.inproc import InprocMock, start_mock
from tests.support.procs import start_proxy


@pytest.fixture(scope="module")
def mock(module_tmp: Path) -> Iterator[InprocMock]:
    """The upstream runs in the test process: the log under test is the proxy process's."""
    handle = start_mock(module_tmp)
    yield handle
    handle.stop()


def test_a_tapfix_warning_is_logged_once(tmp_path, mock) -> None:
    proxy = start_proxy(tmp_path, mock.url, "--token", "s3cret-token-123")
    try:
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10)
        assert response.status_code == 401
        deadline = time.monotonic() + 5
        while "rejected a request" not in proxy.log() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        proxy.stop()
    lines = [line for line in proxy.log().splitlines() if "rejected a request without the tapfix token" in line]
    assert len(lines) == 1, lines
