"""Load harness: N concurrent streams through a real proxy in front of `tapfix mock`, for T seconds.

Checks what the issue asks of load: zero errors; one capture per request (the same ids); every
proxied stream byte-identical to the direct stream of the same body (the mock is deterministic per
body, so each worker's body is fetched directly once and every proxied answer must match it); the
proxy's RSS flat (median of the first window vs the last, after a warm-up).
Used by tests/process/test_reliability_load.py (CI form) and tests/process/load/test_load_long.py (the 60 s form).
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.procs import Proc, start_mock, start_proxy


@dataclass
class LoadResult:
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    mismatches: int = 0
    capture_ids: list[str] = field(default_factory=list)
    bytes_received: int = 0
    events: int = 0
    seconds: float = 0.0
    rss_kb: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, VmRSS kB)

    def rss_window(self, start: float, end: float) -> float:
        values = [kb for t, kb in self.rss_kb if start <= t < end]
        return statistics.median(values) if values else 0.0

    def summary(self) -> str:
        return (
            f"{self.requests} streams in {self.seconds:.1f}s ({self.requests / max(self.seconds, 1e-9):.1f}/s), "
            f"{self.events} events, {self.bytes_received / 1e6:.1f} MB, errors {len(self.errors)}, "
            f"mismatches {self.mismatches}"
        )


def body_for(worker: int) -> dict:
    """A realistic agent turn: system prompt, a user task, reasoning asked for (a longer stream)."""
    return {
        "model": "tapfix-mock",
        "stream": True,
        "stream_options": {"include_usage": True},
        "reasoning_effort": "medium",
        "messages": [
            {"role": "system", "content": "You are a coding agent. " * 20},
            {"role": "user", "content": f"worker {worker}: explain what a proxy does, briefly."},
        ],
    }


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _fetch(client: httpx.AsyncClient, url: str, body: dict) -> tuple[str | None, bytes]:
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        data = b"".join([chunk async for chunk in response.aiter_raw()])
        if response.status_code != 200:
            raise RuntimeError(f"status {response.status_code}: {data[:200]!r}")
        return response.headers.get("x-tapfix-capture-id"), data


async def _run(mock: Proc, proxy: Proc, streams: int, seconds: float, result: LoadResult) -> None:
    limits = httpx.Limits(max_connections=streams * 2, max_keepalive_connections=streams * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        direct = await asyncio.gather(*(_fetch(client, mock.url, body_for(w)) for w in range(streams)))
        reference = [data for _, data in direct]
        deadline = time.monotonic() + seconds

        async def worker(w: int) -> None:
            body = body_for(w)
            while time.monotonic() < deadline:
                try:
                    capture_id, data = await _fetch(client, proxy.url, body)
                except Exception as e:  # noqa: BLE001 - every error is a finding, counted
                    result.errors.append(f"{type(e).__name__}: {e}")
                    result.requests += 1
                    continue
                result.requests += 1
                result.bytes_received += len(data)
                result.events += data.count(b"\n\n")
                if capture_id:
                    result.capture_ids.append(capture_id)
                else:
                    result.errors.append("no x-tapfix-capture-id")
                if data != reference[w]:
                    result.mismatches += 1

        await asyncio.gather(*(worker(w) for w in range(streams)))


def run_load(mock: Proc, proxy: Proc, streams: int, seconds: float) -> LoadResult:
    result = LoadResult()
    stop = threading.Event()
    started = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            try:
                result.rss_kb.append((time.monotonic() - started, rss_kb(proxy.proc.pid)))
            except OSError:
                return
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        asyncio.run(_run(mock, proxy, streams, seconds, result))
    finally:
        stop.set()
        sampler.join(5)
    result.seconds = time.monotonic() - started
    return result


def wait_drained(proxy: Proc, expected: int, timeout: float = 60.0) -> dict:
    """Until the writer has stored (or counted as failed) every exchange; returns the writer's health."""
    deadline = time.monotonic() + timeout
    writer: dict = {}
    while time.monotonic() < deadline:
        writer = httpx.get(f"{proxy.url}/tapfix/health", timeout=10).json()["capture_writer"]
        if writer["queue_depth"] == 0 and writer["written"] + writer["failures"] >= expected:
            break
        time.sleep(0.2)
    return writer


def stored_ids(db: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("select id from exchanges")}
    finally:
        conn.close()


@contextmanager
def under_load(
    tmp: Path, streams: int, seconds: float, chunk_delay_ms: str, drain_timeout: float = 60.0
) -> Iterator[LoadResult]:
    """`streams` concurrent streams for `seconds` through `tapfix run` in front of the mock (its chunks
    `chunk_delay_ms` apart): every answer whole and byte for byte, and, once the writer drained, every exchange
    stored, none twice. Yields the result, for the memory checks, before both processes stop."""
    mock = start_mock(tmp, "--chunk-delay-ms", chunk_delay_ms)
    proxy = start_proxy(tmp, mock.url, db=tmp / "load.db")
    try:
        result = run_load(mock, proxy, streams, seconds)
        print("\nload:", result.summary())
        assert not result.errors, result.errors[:5]
        assert result.mismatches == 0
        writer = wait_drained(proxy, result.requests, timeout=drain_timeout)
        assert writer["failures"] == 0, writer
        assert stored_ids(proxy.extra["db"]) == set(result.capture_ids)
        assert len(result.capture_ids) == result.requests
        yield result
    finally:
        proxy.stop()
        mock.stop()
