"""Load generator: N concurrent keep-alive clients streaming chat completions; TTFT per request.

Why raw asyncio and not httpx/openai: the client shares two cores with the proxy and the upstream,
so it must be cheap and its cost the same for every target. Each worker keeps one connection open
(as agents' HTTP pools do), sends an opencode-like chat request, decodes the chunked SSE response
and records:
  ttft   time from sending the request to the first token (the first `{"content":"` delta),
  total  time to the end of the response,
and the run's wall time, events and bytes received (throughput).

The upstream (bench/upstream.py) shapes the response from the x-bench-* headers this sends.

    python bench/load.py --target 127.0.0.1:8080 --concurrency 8 --requests 200 --chunks 256
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import statistics
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Self

import orjson

FIRST_TOKEN = b'{"content":"'


# The tool list opencode 1.18.33 sends on every turn (10 tools, 21 KB of JSON), captured through tapfix from
# a real run (its temp folder's path shortened): what an agent's request costs to read, repair and store.
TOOLS = orjson.loads((Path(__file__).parent / "agent_tools.json").read_bytes())
AGENT_BODY = 32 * 1024  # opencode's first turn is ~31 KB: its system prompt, the tools, the user's words


def request_body(size: int = 2048, tools: bool = True, model: str = "bench-model") -> bytes:
    """A chat request of about `size` bytes (system prompt padded), streaming with usage; with `tools`, the
    agent's tool list (at least its 21 KB whatever `size` says)."""
    base = {
        "model": model,
        "messages": [{"role": "system", "content": ""}, {"role": "user", "content": "Write the handler file."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 32000,
    }
    if tools:
        base["tools"] = TOOLS
        base["tool_choice"] = "auto"
    pad = max(0, size - len(orjson.dumps(base)))
    filler = "You are a careful coding agent. Follow the repository's conventions.\n"
    base["messages"][0]["content"] = (filler * (pad // len(filler) + 1))[:pad]
    return orjson.dumps(base)


class Mergeable:
    """A dataclass of samples and counts that one worker's share can be added to."""

    def merge(self, other: Self) -> None:
        """Adds each field of `other` to the same of this one (samples join, counts add up)."""
        for f in fields(self):
            setattr(self, f.name, operator.iadd(getattr(self, f.name), getattr(other, f.name)))


@dataclass
class Result(Mergeable):
    ttft: list[float] = field(default_factory=list)  # seconds
    total: list[float] = field(default_factory=list)
    events: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0

    def summary(self) -> dict:
        return {
            "requests": len(self.total),
            "errors": len(self.errors),
            "wall_s": round(self.wall, 3),
            "ttft_p50_ms": round(pct(self.ttft, 50) * 1000, 3),
            "ttft_p99_ms": round(pct(self.ttft, 99) * 1000, 3),
            "events_per_s": round(self.events / self.wall, 1) if self.wall else 0.0,
            "requests_per_s": round(len(self.total) / self.wall, 2) if self.wall else 0.0,
        }


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p99 of 100 samples is the 99th value, not an interpolation)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))
    return s[int(k)]


def build_request(
    host: str, port: int, body: bytes, headers: dict[str, str], path: str = "/v1/chat/completions"
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"host: {host}:{port}",
        "content-type: application/json",
        "accept: text/event-stream",
        "user-agent: tapfix-bench/1",
        f"content-length: {len(body)}",
    ]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes, res: Result) -> bool:
    """Send one request, read the whole response; False if the connection can't be reused."""
    t0 = time.perf_counter()
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head[9:12]
    lower = head.lower()
    ttft = None
    tail = b""
    if b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            data = await reader.readexactly(size + 2)
            res.bytes += size
            res.events += data.count(b"\n\n")
            if ttft is None:
                if FIRST_TOKEN in tail + data[:size]:
                    ttft = time.perf_counter() - t0
                tail = data[max(0, size - 16) : size]
    else:
        i = lower.find(b"content-length:")
        n = int(lower[i + 15 : lower.index(b"\r\n", i)]) if i >= 0 else -1
        data = await reader.readexactly(n) if n >= 0 else await reader.read()
        res.bytes += len(data)
        res.events += data.count(b"\n\n")
        if FIRST_TOKEN in data:
            ttft = time.perf_counter() - t0
    end = time.perf_counter() - t0
    if status != b"200":
        res.errors.append(f"HTTP {status.decode()}: {head[:200]!r}")
        return b"connection: close" not in lower
    if ttft is None:
        res.errors.append("no first token in the response")
        return True
    res.ttft.append(ttft)
    res.total.append(end)
    return b"connection: close" not in lower


async def run_load(
    host: str,
    port: int,
    *,
    concurrency: int,
    requests: int,
    body: bytes,
    headers: dict[str, str],
    stagger_s: float = 0.0,
    timeout: float = 300.0,
) -> Result:
    """`requests` requests over `concurrency` keep-alive connections; returns when all are done.

    `stagger_s`: worker i starts i * stagger_s late, so long streams overlap in a steady state
    instead of all starting in one thundering herd (agents don't start in lockstep either)."""
    request = build_request(host, port, body, headers)
    res = Result()
    remaining = [requests]

    async def worker(i: int) -> None:
        if stagger_s:
            await asyncio.sleep(i * stagger_s)
        reader = writer = None
        while remaining[0] > 0:
            remaining[0] -= 1
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
            try:
                reuse = await _one(reader, writer, request, res)
            except (ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
                res.errors.append(f"{type(e).__name__}: {e}")
                reuse = False
            if not reuse:
                writer.close()
                reader = writer = None
        if writer is not None:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(concurrency))), timeout)
    res.wall = time.perf_counter() - t0
    return res


def bench_headers(kind: str = "content", chunks: int = 256, delay_ms: float = 0) -> dict[str, str]:
    return {"x-bench-kind": kind, "x-bench-chunks": str(chunks), "x-bench-delay-ms": str(delay_ms)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="127.0.0.1:8080", help="HOST:PORT (proxy or upstream)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--chunks", type=int, default=256)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="pacing between chunks (0: burst)")
    ap.add_argument("--kind", choices=["content", "tools"], default="content")
    ap.add_argument("--body-bytes", type=int, default=2048)
    ap.add_argument("--no-tools", action="store_true", help="send no `tools` (repair not armed)")
    a = ap.parse_args()
    host, _, port = a.target.rpartition(":")
    body = request_body(a.body_bytes, tools=not a.no_tools)
    res = asyncio.run(
        run_load(
            host,
            int(port),
            concurrency=a.concurrency,
            requests=a.requests,
            body=body,
            headers=bench_headers(a.kind, a.chunks, a.delay_ms),
        )
    )
    out = res.summary()
    if res.total:
        out["total_p50_ms"] = round(statistics.median(res.total) * 1000, 3)
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
    for e in res.errors[:5]:
        print("error:", e)


if __name__ == "__main__":
    main()
