"""Load, CI form: 64 concurrent paced streams for ~10 s through a real proxy in front of `tapfix mock`.

Zero errors; captures == requests (the same ids); every stream byte-identical to the direct one; RSS
flat. The 60 s form is tests/process/load/test_load_long.py (`TAPFIX_LONG=1 scripts/test tests/process/load`).
Numbers from real runs are in docs/reliability.md.
"""

from __future__ import annotations

import os

from tests.process.load.harness import run_load, stored_ids, wait_drained
from tests.support.procs import start_mock, start_proxy

STREAMS = int(os.environ.get("TAPFIX_LOAD_STREAMS", "64"))
SECONDS = float(os.environ.get("TAPFIX_LOAD_SECONDS", "10"))
CHUNK_DELAY_MS = os.environ.get("TAPFIX_LOAD_CHUNK_DELAY_MS", "20")


def test_64_concurrent_streams(tmp_path):
    mock = start_mock(tmp_path, "--chunk-delay-ms", CHUNK_DELAY_MS)
    proxy = start_proxy(tmp_path, mock.url, db=tmp_path / "load.db")
    try:
        result = run_load(mock, proxy, STREAMS, SECONDS)
        print("\nload:", result.summary())
        assert not result.errors, result.errors[:5]
        assert result.mismatches == 0
        assert result.requests >= STREAMS
        writer = wait_drained(proxy, result.requests)
        assert writer["failures"] == 0, writer
        assert stored_ids(proxy.extra["db"]) == set(result.capture_ids)
        assert len(result.capture_ids) == result.requests
        # RSS flat: warm-up is the first 2 s; compare the first and last thirds of the rest.
        span = (result.seconds - 2) / 3
        first, last = result.rss_window(2, 2 + span), result.rss_window(2 + 2 * span, result.seconds)
        print(f"rss: first {first / 1024:.1f} MB, last {last / 1024:.1f} MB")
        assert last <= first * 1.15 + 16 * 1024, (first, last)
    finally:
        proxy.stop()
        mock.stop()
