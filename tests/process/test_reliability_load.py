"""Load, CI form: 64 concurrent paced streams for ~10 s through a real proxy in front of `tapfix mock`.

Zero errors; captures == requests (the same ids); every stream byte-identical to the direct one; RSS
flat. The 60 s form is tests/process/load/test_load_long.py (`TAPFIX_LONG=1 scripts/test tests/process/load`).
Numbers from real runs are in docs/reliability.md.
"""

from __future__ import annotations

import os

from tests.process.load.harness import under_load

STREAMS = int(os.environ.get("TAPFIX_LOAD_STREAMS", "64"))
SECONDS = float(os.environ.get("TAPFIX_LOAD_SECONDS", "10"))
CHUNK_DELAY_MS = os.environ.get("TAPFIX_LOAD_CHUNK_DELAY_MS", "20")


def test_64_concurrent_streams(tmp_path):
    with under_load(tmp_path, STREAMS, SECONDS, CHUNK_DELAY_MS) as result:
        assert result.requests >= STREAMS
        # RSS flat: warm-up is the first 2 s; compare the first and last thirds of the rest.
        span = (result.seconds - 2) / 3
        first, last = result.rss_window(2, 2 + span), result.rss_window(2 + 2 * span, result.seconds)
        print(f"rss: first {first / 1024:.1f} MB, last {last / 1024:.1f} MB")
        assert last <= first * 1.15 + 16 * 1024, (first, last)
