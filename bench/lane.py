"""The stream lane: how many concurrent streams a path holds at the upstream's pace (issue 34).

The public way gateways that parse streams are compared (onthebench's stream lane): N concurrent
streams of 64 deltas 20 ms apart, N stepped up. Here each of N workers keeps one connection (as agents'
HTTP pools do) and runs `streams` requests on it back to back, the workers' starts spread over one
stream's duration, so N streams are open at any moment. The upstream (bench/upstream.py, `x-bench-stamp`)
writes each delta with its number and the time it wrote it (CLOCK_MONOTONIC, the same clock in every
process of the machine), so for each delta the client knows how late it came:

  ttft       request sent → first delta received (what the client waits for its first token),
  delay      delta written by the upstream → received (each token's own delay),
  lost       deltas that never came (a stream cut, out of order or missing, an error, a timeout).

A level is sustained when nothing is lost and the path keeps the upstream's pace: its per-token delay
p99 at most one gap (20 ms) above the direct path's at the same N. Cheap on purpose (asyncio protocols,
no coroutine per read): at 512 streams the load generator and the upstream share one core.

    python bench/lane.py --target 127.0.0.1:8080 --streams 64
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from load import Mergeable, build_request, pct, request_body

DELTAS = 64
GAP_MS = 20.0
LEVELS = (1, 8, 32, 64, 128, 256, 512)
STAMP = re.compile(rb'"content":" w(\d+)@(\d+\.\d+)"')


def lane_headers(deltas: int = DELTAS, gap_ms: float = GAP_MS) -> dict[str, str]:
    return {"x-bench-stamp": str(deltas), "x-bench-delay-ms": str(gap_ms)}


@dataclass
class LaneResult(Mergeable):
    ttft: list[float] = field(default_factory=list)  # seconds
    delay: list[float] = field(default_factory=list)  # seconds, one per delta received
    streams: int = 0  # streams asked for
    sent: int = 0  # requests written: fewer than `streams` when a connection failed (its later streams never went)
    complete: int = 0  # streams that got every delta in order and ended cleanly
    lost: int = 0  # deltas that never came
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0

    def summary(self) -> dict:
        return {
            "streams": self.streams,
            "sent": self.sent,
            "complete": self.complete,
            "lost": self.lost,
            "errors": len(self.errors),
            "ttft_p50_ms": round(pct(self.ttft, 50) * 1000, 3),
            "ttft_p99_ms": round(pct(self.ttft, 99) * 1000, 3),
            "delay_p50_ms": round(pct(self.delay, 50) * 1000, 3),
            "delay_p99_ms": round(pct(self.delay, 99) * 1000, 3),
        }


class _Stream(asyncio.Protocol):
    """One connection: `count` streamed requests back to back, each response de-chunked as it comes."""

    def __init__(self, request: bytes, count: int, deltas: int, res: LaneResult, done: asyncio.Future[None]) -> None:
        self.request, self.left, self.deltas, self.res, self.done = request, count, deltas, res, done
        self.transport: asyncio.Transport | None = None
        self._reset()

    def _reset(self) -> None:
        self.head: bytes | None = None
        self.buf = b""  # bytes not yet read as framing or event text
        self.need = 0  # body bytes of the current chunk still to come (+2 for its CRLF)
        self.text = b""  # de-chunked body not yet split into events
        self.next_seq = 0
        self.sent_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self._reset()
        self.left -= 1
        self.sent_at = time.monotonic()
        self.transport.write(self.request)
        self.res.sent += 1

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        buf = self.buf + data
        if self.head is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            self.head, buf = buf[: end + 4], buf[end + 4 :]
            if self.head[9:12] != b"200" or b"chunked" not in self.head.lower():
                self._fail(f"HTTP {self.head[:60]!r}")
                return
        pos, text, ended = 0, [], False
        while True:
            if self.need == 0:  # at a chunk's size line
                line = buf.find(b"\r\n", pos)
                if line < 0:
                    break
                size = int(buf[pos:line].split(b";", 1)[0], 16)
                if size == 0:  # the last chunk, and the blank line after it (no trailers)
                    if len(buf) < line + 4:
                        break
                    pos, ended = line + 4, True
                    break
                pos, self.need = line + 2, size + 2  # its data, then CRLF
            take = min(self.need, len(buf) - pos)
            if take <= 0:
                break
            data = min(take, self.need - 2)  # what of it is data (the rest: the CRLF)
            if data > 0:
                text.append(buf[pos : pos + data])
            pos += take
            self.need -= take
        self.buf = buf[pos:]
        self._events(b"".join(text), now)
        if ended:
            self._end()

    def _events(self, data: bytes, now: float) -> None:
        text = self.text + data
        cut = text.rfind(b"\n\n")
        if cut < 0:
            self.text = text
            return
        self.text = text[cut + 2 :]
        res = self.res
        for m in STAMP.finditer(text, 0, cut + 2):
            seq = int(m[1])
            if seq != self.next_seq:
                self._fail(f"delta {seq} came when {self.next_seq} was due")
                return
            if seq == 0:
                res.ttft.append(now - self.sent_at)
            res.delay.append(now - float(m[2]))
            self.next_seq += 1

    def _end(self) -> None:
        res = self.res
        if self.next_seq == self.deltas:
            res.complete += 1
        else:
            res.lost += self.deltas - self.next_seq
            res.errors.append(f"the stream ended after {self.next_seq} of {self.deltas} deltas")
        if self.left > 0:
            self._send()
        else:
            self._finish()

    def _fail(self, why: str) -> None:
        self.res.errors.append(why)
        self.res.lost += self.deltas - self.next_seq + self.left * self.deltas
        self.left = 0
        self.next_seq = self.deltas  # counted
        self._finish()

    def _finish(self) -> None:
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self._fail(f"connection lost after {self.next_seq} deltas ({exc})")


async def run_level(
    host: str,
    port: int,
    concurrency: int,
    *,
    streams: int,
    body: bytes,
    deltas: int = DELTAS,
    gap_ms: float = GAP_MS,
    timeout: float | None = None,
) -> LaneResult:
    """`concurrency` workers, each `streams` streams on its own connection, starts spread over one stream."""
    request = build_request(host, port, body, lane_headers(deltas, gap_ms))
    loop = asyncio.get_running_loop()
    res = LaneResult(streams=concurrency * streams)
    stream_s = deltas * gap_ms / 1000
    stagger = stream_s / concurrency
    budget = timeout if timeout is not None else 3 * (stream_s * (streams + 1)) + 20

    async def worker(i: int) -> None:
        await asyncio.sleep(i * stagger)
        done: asyncio.Future[None] = loop.create_future()
        try:
            await loop.create_connection(lambda: _Stream(request, streams, deltas, res, done), host, port)
        except OSError as e:
            res.errors.append(f"connect: {e}")
            res.lost += streams * deltas
            return
        await done

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=budget)
    for task in pending:
        task.cancel()
    if pending:
        res.errors.append(f"{len(pending)} workers still streaming after {budget:.0f}s")
        res.lost += len(pending) * streams * deltas  # an upper bound: they are counted as lost
    res.wall = time.perf_counter() - t0
    return res


@dataclass
class Cell:
    """One row at one level, over the rounds: what the clients saw and the proxy's CPU meanwhile."""

    res: LaneResult = field(default_factory=LaneResult)
    cpu_ns: int = 0


Idle = Callable[[], None]


def step_up(
    rows: dict[str, tuple[int, int | None]],
    direct: str,
    *,
    levels: tuple[int, ...] = LEVELS,
    streams: int = 3,
    rounds: int = 1,
    body: bytes,
    idle: Idle,
    cpu_ns: Callable[[int], int],
    sent: Callable[[str, int], None],
    log: Callable[[str], None] = lambda _: None,
) -> dict[str, dict[int, Cell]]:
    """Every row (name → (port, the proxy's PID or None)) at every level, in rotated order each round. A
    row that missed two levels in a row is not run at higher ones (it holds fewer streams than that)."""
    out: dict[str, dict[int, Cell]] = {name: {} for name in rows}
    misses = {name: 0 for name in rows}
    names = list(rows)
    for level in levels:
        live = [n for n in names if misses[n] < 2]
        if not live:
            break
        for r in range(rounds):
            order = live[r % len(live) :] + live[: r % len(live)]
            for name in order:
                port, pid = rows[name]
                idle()
                before = cpu_ns(pid) if pid else 0
                res = asyncio.run(run_level("127.0.0.1", port, level, streams=streams, body=body))
                idle()
                cell = out[name].setdefault(level, Cell())
                cell.res.merge(res)
                cell.cpu_ns += (cpu_ns(pid) - before) if pid else 0
                sent(name, res.sent)  # what went, not what was asked for: a failed stream's later ones never do
        base = out[direct].get(level)
        for name in live:
            ok = sustained(out[name][level], None if name == direct else base)
            misses[name] = 0 if ok else misses[name] + 1
        log(f"  lane {level}: " + ", ".join(f"{n} {'ok' if misses[n] == 0 else 'MISS'}" for n in live))
    return out


def sustained(cell: Cell, direct: Cell | None) -> bool:
    """Nothing lost, and each token at most one gap later than on the direct path (p99)."""
    res = cell.res
    if res.lost or res.errors or not res.delay:
        return False
    added = pct(res.delay, 99) - (pct(direct.res.delay, 99) if direct is not None else 0.0)
    return added * 1000 <= GAP_MS


def report(
    out: dict[str, dict[int, Cell]], direct: str, levels: tuple[int, ...] = LEVELS
) -> tuple[list[list[str]], dict[str, int]]:
    """The lane's table (a row per level, a column per path) and each path's streams sustained."""
    names = list(out)
    header = ["N streams", f"{direct}: TTFT p50/p99, token p99 ms"] + [
        f"{n}: +TTFT p50/p99, +token p99 ms (core)" for n in names if n != direct
    ]
    rows = [header]
    best = {n: 0 for n in names}
    for level in levels:
        base = out[direct].get(level)
        if all(level not in out[n] for n in names):
            continue
        line = [str(level)]
        for n in names:
            cell = out[n].get(level)
            if cell is None:
                line.append("-")
                continue
            res = cell.res
            ok = sustained(cell, None if n == direct else base)
            if ok:
                best[n] = level
            mark = "" if ok else f" MISS{f' (lost {res.lost})' if res.lost else ''}"
            if n == direct or base is None:
                line.append(
                    f"{pct(res.ttft, 50) * 1000:.1f}/{pct(res.ttft, 99) * 1000:.1f}, {pct(res.delay, 99) * 1000:.1f}"
                    + mark
                )
                continue
            d = base.res
            core = cell.cpu_ns / 1e9 / res.wall if res.wall else 0.0
            ttft50, ttft99 = (pct(res.ttft, q) - pct(d.ttft, q) for q in (50, 99))
            token99 = pct(res.delay, 99) - pct(d.delay, 99)
            line.append(f"{ttft50 * 1000:+.1f}/{ttft99 * 1000:+.1f}, {token99 * 1000:+.1f} ({core:.2f}){mark}")
        rows.append(line)
    return rows, best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="127.0.0.1:8080", help="HOST:PORT (proxy or upstream)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--streams", type=int, default=3, help="streams per worker, back to back")
    ap.add_argument("--body-bytes", type=int, default=2048)
    ap.add_argument("--no-tools", action="store_true")
    a = ap.parse_args()
    host, _, port = a.target.rpartition(":")
    body = request_body(a.body_bytes, tools=not a.no_tools)
    res = asyncio.run(run_level(host, int(port), a.concurrency, streams=a.streams, body=body))
    print(orjson.dumps(res.summary(), option=orjson.OPT_INDENT_2).decode())
    for e in res.errors[:5]:
        print("error:", e)


if __name__ == "__main__":
    main()
