"""Fill a capture store through its writer API with synthetic agent sessions, and measure the fill.

Why a filler of its own (not bench/storage.py's single session): at 10^5 and 10^6 captures the
store must look like a fleet's: many interleaved agent sessions (multi-turn, the conversation
growing each turn, streamed answers with a tool call), distinct bytes per session (so the sha256
dedupe can't fold sessions together) and a delta per turn against the session's last body. The
turns are built once (storage.session) and stamped per session with a 16-byte token, so building a
capture is a bytes copy, never a JSON dump: the filler stays far cheaper than the writer it feeds.

The writer is the real `CaptureWriter` (queue, batches, the same code as `tapfix run`); the filler
waits while more than `INFLIGHT` exchanges are queued, so memory stays bounded.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import processes  # noqa: E402
from storage import agent_turn, session  # noqa: E402

MODELS = ("qwen3-coder-30b", "qwen3-235b", "gpt-oss-120b", "llama-3.1-8b", "glm-4.5-air")
FLAG = "bench_rare"  # on 1 capture in FLAG_EVERY: what a filter by flag finds
FLAG_EVERY = 500
WORD, CJK = "zanzibar", "東京都の天気予報"  # each in 1 answer of 1000: what search finds
MARK_EVERY = 1000
_TOKEN = b"@" * 16  # where a session's token goes, at the start of the system prompt
_STREAM_ID = b"bench0123456789abcdef"  # the stream's id in bench/upstream.py's events (21 bytes)
INFLIGHT = 2048
TICK_S = os.sysconf("SC_CLK_TCK")


@dataclass
class Shape:
    turns: int = 30  # per session
    final_kb: int = 64  # the last turn's request body (the first is ~31 KB: system prompt + tools)
    active: int = 32  # sessions running side by side, their turns interleaved


class Sessions:
    """Captures of interleaved agent sessions, in order: `active` sessions at a time, one turn each
    round-robin; a session that has done its turns is followed by a new one."""

    def __init__(self, shape: Shape, seed: int = 7) -> None:
        self.shape = shape
        self.turns = []
        for raw, events, _args in session(shape.turns, shape.final_kb, seed):
            stamped = raw.replace(b'"role":"system","content":"', b'"role":"system","content":"' + _TOKEN + b" ", 1)
            self.turns.append((stamped, list(events)))
        self.made = 0

    def exchanges(self, n: int, *, which: Callable[[int, int], int] | None = None) -> Iterator[tuple[int, Exchange]]:
        """`n` captures as (the instance it goes to, by `which(session, turn)`, 0 without one; the exchange)."""
        slots = [(s, 0) for s in range(self.shape.active)]
        next_session = self.shape.active
        for i in range(n):
            k = i % len(slots)
            s, turn = slots[k]
            yield (which(s, turn) if which else 0), self._capture(s, turn, self.made)
            self.made += 1
            if turn + 1 < self.shape.turns:
                slots[k] = (s, turn + 1)
            else:
                slots[k] = (next_session, 0)
                next_session += 1

    def _capture(self, s: int, turn: int, serial: int) -> Exchange:
        token = b"%016x" % s
        body, events = self.turns[turn]
        events = list(events)
        events[0] = events[0].replace(_STREAM_ID, b"%016x%05d" % (s, turn), 1)
        mark = WORD if serial % MARK_EVERY == 7 else CJK if serial % MARK_EVERY == 17 else ""
        if mark:
            events[1] = events[1].replace(b'"Sure"', f'"Sure, {mark}"'.encode(), 1)
        ex = agent_turn(body.replace(_TOKEN, token, 1), events, f"ses_{token.decode()}")
        ex.model = MODELS[s % len(MODELS)]
        ex.client_addr = f"10.0.{s % 200}.{s % 250 + 1}"
        ex.response_started_at, ex.ended_at = ex.mark + 0.001, ex.mark + 0.001 * (len(events) + 1)
        if serial % FLAG_EVERY == 3:
            ex.flags.add(FLAG)
        return ex


@dataclass
class Fill:
    store: str
    n: int
    seconds: float = 0.0
    process_cpu_s: float = 0.0  # the whole bench process: filler and writer threads
    writer_cpu_s: float = 0.0  # the writer threads alone
    server_cpu_s: float = 0.0  # PostgreSQL's processes (0 for SQLite: in-process)
    failures: int = 0
    ids: list[str] = field(default_factory=list)  # a sample: every 997th capture's id

    def per_s(self) -> float:
        return self.n / self.seconds if self.seconds else 0.0

    def us(self, cpu_s: float) -> float:
        return cpu_s / self.n * 1e6 if self.n else 0.0


def fill(
    writers: list[CaptureWriter],
    sessions: Sessions,
    n: int,
    store: str,
    *,
    which: Callable[[int, int], int] | None = None,
    server_cpu: Callable[[], float] = lambda: 0.0,
    progress: Callable[[int], None] | None = None,
) -> Fill:
    """Submit `n` captures (to `writers[which(session, turn)]`), wait until every writer has stored
    (or lost) all it got, and close the writers; the fill's time and CPU."""
    result = Fill(store, n)
    tids = [w._thread.native_id for w in writers]
    writer0 = sum(_thread_cpu_ns(t) for t in tids)
    cpu0, server0, t0 = time.process_time(), server_cpu(), time.perf_counter()
    for i, (k, ex) in enumerate(sessions.exchanges(n, which=which)):
        writer = writers[k]
        writer.submit(ex)
        if i % 997 == 0:
            result.ids.append(ex.id)
        while writer.stats.queued - writer.stats.written - writer.stats.failures > INFLIGHT:
            time.sleep(0.002)
        if progress and i % 10_000 == 0:
            progress(i)
    for w in writers:
        while w.stats.written + w.stats.failures < w.stats.queued:
            time.sleep(0.005)
    result.seconds = time.perf_counter() - t0
    result.writer_cpu_s = (sum(_thread_cpu_ns(t) for t in tids) - writer0) / 1e9
    result.process_cpu_s = time.process_time() - cpu0
    # Before the writers close: a backend that exits on its connection's close takes its ticks with it (the
    # meter reads live processes), which under load made the server's CPU read as 0.
    result.server_cpu_s = server_cpu() - server0
    for w in writers:
        w.close()
        result.failures += w.stats.failures
    return result


def _thread_cpu_ns(tid: int) -> int:
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[0])
    except OSError:  # the thread ended
        return 0


class TreeCpu:
    """CPU seconds a server's process tree has used since this meter first looked: the root and its
    live children (the backends), each counted by its own growth. A backend that exits between two
    looks loses only its last slice; summing snapshots instead (or the root's reaped-children total)
    can go backwards when another client's backend exits mid-fill."""

    def __init__(self, root_pid: int) -> None:
        self.root_pid, self._total = root_pid, 0
        self._last = self._ticks()

    def _ticks(self) -> dict[int, int]:
        return {
            pid: int(fields[11]) + int(fields[12])  # utime stime
            for pid, fields in processes()
            if pid == self.root_pid or int(fields[1]) == self.root_pid
        }

    def __call__(self) -> float:
        now = self._ticks()
        self._total += sum(max(0, t - self._last.get(pid, 0)) for pid, t in now.items())
        self._last = now
        return self._total / TICK_S


__all__ = ["FLAG", "MODELS", "Fill", "Sessions", "Shape", "TreeCpu", "fill"]
