"""Issue 15 item 6 with real signals: `tapfix run` gets SIGTERM with a stream open, lets it finish within the
grace and exits 0; a second SIGTERM (or Ctrl-C) ends the grace at once. The helpers and the rest of items
6 and 7 (the grace driven in-process): tests/inproc/truth/test_shutdown_truth.py.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inproc.truth.test_shutdown_truth import (
    CUT_FLAGS,
    SCENARIO,
    cut_by_shutdown,
    exit_code,
    start_stream,
    stored,
    wait_stopped_listening,
)
from tests.support.inproc import InprocMock, start_mock
from tests.support.procs import start_proxy


@pytest.fixture(scope="module")
def mock(module_tmp: Path) -> Iterator[InprocMock]:
    """The scripted upstream runs in the test process: the proxy is the process under test."""
    scenario = module_tmp / "shutdown.json"
    scenario.write_text(json.dumps(SCENARIO))
    handle = start_mock(module_tmp, "--scenario", str(scenario))
    yield handle
    handle.stop()


def test_truth_6_an_in_flight_stream_finishes_within_the_grace(mock: InprocMock, tmp_path: Path) -> None:
    proxy = start_proxy(tmp_path, mock.url)  # the default grace: 5 s
    client, capture_id = start_stream(proxy, "brief")
    proxy.proc.send_signal(signal.SIGTERM)
    body = client.read_all()
    client.close()
    assert body.rstrip().endswith(b"data: [DONE]") and b'"error"' not in body, body[-300:]
    assert exit_code(proxy) == 0
    row, client_response = stored(proxy.extra["db"], capture_id)
    assert client_response == body
    assert row["error"] is None and not set(json.loads(row["flags"])) & (CUT_FLAGS | {"proxy_shutdown"})


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_truth_6_a_second_signal_ends_the_grace_at_once(mock: InprocMock, tmp_path: Path, second: int) -> None:
    proxy = start_proxy(tmp_path, mock.url, "--shutdown-grace", "120")
    client, capture_id = start_stream(proxy, "slow")
    proxy.proc.send_signal(signal.SIGTERM)
    wait_stopped_listening(proxy)
    proxy.proc.send_signal(second)
    body = client.read_all()  # a 120 s grace outlives the 8 s stream: only the second signal cuts it
    client.close()
    cut_by_shutdown(proxy, capture_id, body)
