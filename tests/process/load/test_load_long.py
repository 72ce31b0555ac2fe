"""Load, long form (by hand): 64 concurrent paced streams, a 40 s warm-up, then 60 s measured; RSS of
the first and last 20 s of the measured minute.

    TAPFIX_LONG=1 scripts/test tests/process/load -s

Skipped unless TAPFIX_LONG=1 (CI runs tests/process/test_reliability_load.py, the 10 s form). Tune with
TAPFIX_LOAD_STREAMS, TAPFIX_LOAD_SECONDS, TAPFIX_LOAD_CHUNK_DELAY_MS.
"""

from __future__ import annotations

import os

import pytest

from tests.process.load.harness import under_load

pytestmark = pytest.mark.skipif(os.environ.get("TAPFIX_LONG") != "1", reason="long form: TAPFIX_LONG=1")
STREAMS = int(os.environ.get("TAPFIX_LOAD_STREAMS", "64"))
SECONDS = float(os.environ.get("TAPFIX_LOAD_SECONDS", "60"))
# The proxy's RSS climbs for ~40 s under 64 streams (allocator arenas, SQLite's page cache, mitmproxy's
# per-connection state) and is flat after: measured runs in docs/reliability.md. The minute is measured after it.
WARMUP = float(os.environ.get("TAPFIX_LOAD_WARMUP", "40"))
CHUNK_DELAY_MS = os.environ.get("TAPFIX_LOAD_CHUNK_DELAY_MS", "20")


def test_64_streams_for_a_minute(tmp_path):
    with under_load(tmp_path, STREAMS, WARMUP + SECONDS, CHUNK_DELAY_MS, drain_timeout=120) as result:
        window = min(20.0, SECONDS / 3)
        first = result.rss_window(WARMUP, WARMUP + window)
        last = result.rss_window(result.seconds - window, result.seconds)
        print(
            f"rss: first {window:.0f}s {first / 1024:.1f} MB, last {window:.0f}s {last / 1024:.1f} MB, "
            f"peak {max(kb for _, kb in result.rss_kb) / 1024:.1f} MB"
        )
        print(
            "rss every 10 s (MB):",
            [round(result.rss_window(t, t + 10) / 1024, 1) for t in range(0, int(result.seconds), 10)],
        )
        assert last <= first * 1.10 + 8 * 1024, (first, last)
