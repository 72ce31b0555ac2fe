"""The benchmark: direct vs plain mitmproxy vs tapfix, side by side in one run, one table.

Why this shape: the machine is shared and noisy, so absolute numbers drift between runs; ratios
measured in the same run do not. Every phase is split into rounds and each round runs every row's
block in a rotated order, so a noisy moment hits all rows alike. CPU is read from /proc for each
proxy process (all threads) before a block and after it once the process is idle again (tapfix's
writer thread stores captures after the load), never from wall time.

Rows, the agents' path first (issue 34): direct (client → upstream), plain mitmproxy (`mitmdump --mode
reverse` + bench/mitm_stream.py), tapfix on the agents' path (an agent-sized request offering opencode's
tool list, `--regenerate 1`: repair armed, regeneration on, what every coding agent's turn gets) without
and with a streamed tool call, the same two at `--regenerate 0` (a second tapfix: regeneration's cost as a
ratio of the same run, with its spread over the rounds), tapfix without tools (capture only), and a third
tapfix exporting OTLP spans and metrics (`--otlp`) to a loopback receiver (bench/otlp_sink.py) serving the
capture-only row's requests in the CPU phases. All processes run for the whole run.

CPU per chunk and fixed CPU per request come from a two-point fit over paced (1 ms) streams of 256
and 16 events: per_chunk = (cpu256 - cpu16) / 240, fixed = cpu16 - 16 * per_chunk. Paced so that
each event is its own read, as with a real model (the stored captures' chunk_count checks that).
Then the stream lane (bench/lane.py): N concurrent streams of 64 deltas 20 ms apart, N stepped up,
for direct, plain mitmproxy and both tapfix processes, each proxy pinned to one CPU.

    bench/run            # full, a few minutes
    bench/run --quick    # about two minutes
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import lane
import load
import procstat
from load import Result, pct

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MB = 1 << 20


@dataclass(frozen=True)
class Row:
    name: str
    target: str  # upstream | mitm | tapfix (--regenerate 1) | tapfix0 (--regenerate 0) | tapfixotel (--otlp)
    tools: bool
    kind: str  # content | tools
    phases: tuple[str, ...] = ()  # () = every phase


# The --regenerate 0 twins run where regeneration's cost would show: CPU (the fit), one stream's TTFT, 32
# paced streams' TTFT, RSS with 1 MB bodies; not the 8-stream bursts and throughput, to keep the run short.
TWIN_PHASES = ("ttft1", "paced32", "cpu256", "cpu16", "mem32x1MB")
OTEL_PHASES = ("ttft1", "cpu256", "cpu16")  # issue 20: the export's cost is CPU (the fit) and one stream's TTFT
# The agents' path first: what a coding agent's requests get (every turn offers tools; regeneration is on
# by default). Every row sends the same agent-sized request (load.AGENT_BODY, opencode's tool list), the
# no-tools row the same size without tools.
ROWS = [
    Row("direct", "upstream", True, "content"),
    Row("plain mitmproxy", "mitm", True, "content"),
    Row("tapfix, agents' path (tools offered, regeneration on)", "tapfix", True, "content"),
    Row("tapfix --regenerate 0, tools offered", "tapfix0", True, "content", TWIN_PHASES),
    Row("tapfix, agents' path, tool call in stream", "tapfix", True, "tools"),
    Row("tapfix --regenerate 0, tool call in stream", "tapfix0", True, "tools", TWIN_PHASES),
    Row("tapfix, no tools (capture only)", "tapfix", False, "content"),
    Row("tapfix --otlp, no tools (export on)", "tapfixotel", False, "content", OTEL_PHASES),
]
MITM, AGENTS, AGENTS0, CALLS, CALLS0, CAPTURE, EXPORT = (ROWS[i].name for i in range(1, 8))
# (label, the --regenerate 1 row, the --regenerate 0 row): regeneration's cost, same requests, same rounds
PAIRS = (("agents' path, no calls", AGENTS, AGENTS0), ("tool call", CALLS, CALLS0))
PROCESSES = ("upstream", "mitm", "tapfix", "tapfix0", "otlpsink", "tapfixotel")
# What each twin adds to tapfix's own command line (click keeps an option's last value).
TWINS = {"tapfix0": ["--regenerate", "0"], "tapfixotel": ["--otlp", "{otlp}"]}
# The stream lane (bench/lane.py): these rows side by side, the proxy on one core.
LANE_ROWS = ("direct", MITM, AGENTS, AGENTS0)


@dataclass(frozen=True)
class Phase:
    name: str
    concurrency: int
    chunks: int
    delay_ms: float
    requests: int  # per row, full mode
    quick: int  # per row, --quick
    body: int = load.AGENT_BODY
    rows: tuple[str, ...] = ()  # () = all rows
    rounds: int = 0  # 0: the run's default
    steady: bool = False  # stagger the workers' starts over one stream's duration
    pinned: bool = False  # the proxies on one CPU, the load generator and upstream on the other (`on_one_cpu`)


PHASES = [
    Phase("ttft1", 1, 16, 0, 1000, 150),
    Phase("ttft8", 8, 16, 0, 1200, 320),
    Phase("paced32", 32, 256, 5, 256, 64, rounds=2, steady=True),
    Phase("cpu256", 8, 256, 1, 128, 24, pinned=True),
    Phase("cpu16", 8, 16, 1, 512, 96, pinned=True),
    Phase("burst", 8, 256, 0, 160, 32),
    Phase("mem32x1MB", 32, 256, 5, 96, 32, body=MB, rows=(MITM, AGENTS, AGENTS0), rounds=1, steady=True),
]


@dataclass
class Cell:
    res: Result = field(default_factory=Result)
    cpu_ns: int = 0
    upstream_ns: int = 0
    requests: int = 0
    rounds: list[tuple[int, int]] = field(default_factory=list)  # (proxy CPU ns, requests) of each round


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode} before listening (see its log)")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {timeout}s")


class Fleet:
    """The upstream and both proxies as child processes; stopped (by PID) on exit."""

    def __init__(self, work: Path, tapfix_args: list[str]) -> None:
        self.work = work
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.db = work / "bench.db"
        self.tapfix_args = tapfix_args
        self.sent: dict[str, int] = {}  # requests per row, warm-up included (first_attempt_check counts them)

    def start(self, which: tuple[str, ...] = ("mitm", "tapfix", "tapfix0", "tapfixotel")) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CONFIG_HOME": str(self.work / "config")}
        up = free_port()
        self._spawn(
            "upstream", [sys.executable, str(ROOT / "bench/upstream.py"), "--listen", f"127.0.0.1:{up}"], up, env
        )
        origin = f"http://127.0.0.1:{up}"
        if "mitm" in which:
            self._spawn_mitm(origin, env)
        if "tapfixotel" in which:
            sink = free_port()
            self._spawn(
                "otlpsink",
                [sys.executable, str(ROOT / "bench/otlp_sink.py"), "--listen", f"127.0.0.1:{sink}"],
                sink,
                env,
            )
            self.otlp = f"http://127.0.0.1:{sink}"
        for name in ("tapfix", "tapfix0", "tapfixotel"):
            if name in which:
                port = free_port()
                self._spawn(name, self.tapfix_argv(name, origin, port), port, env)

    def tapfix_argv(self, name: str, origin: str, port: int) -> list[str]:
        """`tapfix run` for a row's process: a twin is the same command with its own options last
        (`TWINS`), so tapfix0 differs from tapfix only in regeneration, tapfixotel only in the export."""
        argv = [str(BIN / "tapfix"), "run", "--upstream", origin, "--listen", f"127.0.0.1:{port}"]
        argv += ["--db", str(self.db_of(name)), *self.tapfix_args]
        return argv + [a.format(otlp=getattr(self, "otlp", "")) for a in TWINS.get(name, [])]

    def db_of(self, name: str) -> Path:
        return self.db if name == "tapfix" else self.work / f"{name}.db"

    def later_attempts(self, name: str) -> int:
        """Upstream requests tapfix process `name` made for later attempts (`/tapfix/health`)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name]}/tapfix/health", timeout=10) as r:
            return int(json.loads(r.read()).get("later_attempts", 0))

    def upstream_stats(self) -> dict:
        return self.stats_of("upstream")

    def stats_of(self, name: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[name]}/stats", timeout=10) as r:
            return json.loads(r.read())

    def _spawn_mitm(self, origin: str, env: dict) -> None:
        port = free_port()
        self._spawn(
            "mitm",
            [
                str(BIN / "mitmdump"),
                "-q",
                "--mode",
                f"reverse:{origin}@127.0.0.1:{port}",
                "-s",
                str(ROOT / "bench/mitm_stream.py"),
                "--set",
                "connection_strategy=lazy",
                "--set",
                f"confdir={self.work / 'mitm-conf'}",
            ],
            port,
            env,
        )

    def _spawn(self, name: str, argv: list[str], port: int, env: dict) -> None:
        log = open(self.work / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work)
        self.ports[name] = port
        wait_port(port, self.procs[name], name)

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items()}

    def stop(self) -> None:
        for name, p in reversed(self.procs.items()):
            if p.poll() is None:
                p.send_signal(signal.SIGINT if name.startswith("tapfix") or name == "baseline" else signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


async def run_block(fleet: Fleet, row: Row, phase: Phase, n: int, body: bytes) -> Result:
    stream_s = phase.chunks * (phase.delay_ms + 0.3) / 1000  # 0.3 ms: the sleep's own overshoot
    stagger = stream_s / phase.concurrency if phase.steady else 0.0
    fleet.sent[row.name] = fleet.sent.get(row.name, 0) + n
    return await load.run_load(
        "127.0.0.1",
        fleet.ports[row.target],
        concurrency=min(phase.concurrency, n),
        requests=n,
        body=body,
        headers=load.bench_headers(row.kind, phase.chunks, phase.delay_ms),
        stagger_s=stagger,
    )


def rows_of(phase: Phase) -> list[Row]:
    return [r for r in ROWS if (not phase.rows or r.name in phase.rows) and (not r.phases or phase.name in r.phases)]


def run_phase(fleet: Fleet, phase: Phase, quick: bool, rounds: int) -> dict[str, Cell]:
    rounds = max(1, phase.rounds // 2) if quick and phase.rounds else (phase.rounds or rounds)
    rows = rows_of(phase)
    total = phase.quick if quick else phase.requests
    per_round = [total // rounds + (1 if i < total % rounds else 0) for i in range(rounds)]
    bodies = {t: load.request_body(phase.body, tools=t) for t in (True, False)}
    cells = {r.name: Cell() for r in rows}
    pids = fleet.pids
    for i, n in enumerate(per_round):
        order = rows[i % len(rows) :] + rows[: i % len(rows)]
        for row in order:
            procstat.wait_idle(pids)
            before = procstat.snapshot(pids)
            res = asyncio.run(run_block(fleet, row, phase, n, bodies[row.tools]))
            procstat.wait_idle(pids)
            after = procstat.snapshot(pids)
            cell = cells[row.name]
            cell.res.merge(res)
            cell.requests += n
            cell.upstream_ns += after["upstream"] - before["upstream"]
            if row.target != "upstream":
                cell.cpu_ns += after[row.target] - before[row.target]
                cell.rounds.append((after[row.target] - before[row.target], n))
            if res.errors:
                print(f"  {phase.name}/{row.name}: {len(res.errors)} errors, first: {res.errors[0]}", file=sys.stderr)
    return cells


def warm_up(fleet: Fleet) -> None:
    """Import lazily loaded modules, open upstream connections, let the CA and db settle."""
    for row in ROWS:
        body = load.request_body(load.AGENT_BODY, row.tools)
        for chunks in (16, 256):
            asyncio.run(run_block(fleet, row, Phase("warm", 4, chunks, 0, 0, 0), 16, body))


def ms(x: float) -> str:
    return f"{x * 1000:.2f}"


def table(results: dict[str, dict[str, Cell]], hwm: dict[str, int]) -> tuple[list[list[str]], dict]:
    """Rows of the printed table and the numbers the targets are checked against."""
    direct = ROWS[0].name
    # RSS peak only for the processes that served the 1 MB phase (the others never saw such bodies)
    memory_targets = {r.target for r in ROWS for p in PHASES if p.body == MB and r.name in p.rows}
    nums: dict[str, dict] = {}
    out = [
        [
            "",
            "+TTFT 1 stream p50/p99 ms",
            "+TTFT 8 streams p50/p99 ms",
            "+TTFT 32 paced p50/p99 ms",
            "throughput ratio",
            "CPU µs/chunk",
            "CPU ms/request",
            "RSS peak MB",
        ]
    ]
    for row in ROWS:
        n: dict = {}
        cells = []
        for ph in ("ttft1", "ttft8", "paced32"):
            if row.name not in results[ph]:
                cells.append("-")
                continue
            c, d = results[ph][row.name].res, results[ph][direct].res
            if row.name == direct:
                cells.append(f"({ms(pct(d.ttft, 50))}/{ms(pct(d.ttft, 99))} abs)")
                continue
            p50, p99 = pct(c.ttft, 50) - pct(d.ttft, 50), pct(c.ttft, 99) - pct(d.ttft, 99)
            n[ph] = (p50 * 1000, p99 * 1000)
            cells.append(f"{ms(p50)}/{ms(p99)}")
        if row.name in results["burst"]:
            b, bd = results["burst"][row.name].res, results["burst"][direct].res
            bm = results["burst"][MITM].res
            ratio = (b.events / b.wall) / (bd.events / bd.wall)
            vs_mitm = (b.events / b.wall) / (bm.events / bm.wall)
            cells.append(f"{ratio:.2f} ({vs_mitm:.2f}× mitm)" if row.target.startswith("tapfix") else f"{ratio:.2f}")
        else:
            cells.append("-")
        long, short = results["cpu256"][row.name], results["cpu16"][row.name]
        key = "upstream_ns" if row.target == "upstream" else "cpu_ns"
        per_chunk, fixed = fit(getattr(long, key) / long.requests, getattr(short, key) / short.requests)
        n.update(per_chunk_us=per_chunk / 1000, fixed_ms=fixed / 1e6)
        tag = " (upstream)" if row.target == "upstream" else ""
        cells += [
            f"{per_chunk / 1000:.1f}{tag}",
            f"{fixed / 1e6:.2f}{tag}",
            f"{hwm[row.target] / 1024:.0f}" if row.target in memory_targets else "-",
        ]
        nums[row.name] = n
        out.append([row.name, *cells])
    return out, nums


def fit(cpu256: float, cpu16: float) -> tuple[float, float]:
    """(per chunk, fixed per request) from the CPU of one request of 256 events and one of 16."""
    per_chunk = (cpu256 - cpu16) / (256 - 16)
    return per_chunk, cpu16 - 16 * per_chunk


def per_round(results: dict[str, dict[str, Cell]], row: str) -> list[tuple[float, float]]:
    """Each round's own (per chunk, fixed) fit, round i of cpu256 with round i of cpu16."""
    long, short = results["cpu256"][row].rounds, results["cpu16"][row].rounds
    return [fit(a / na, b / nb) for (a, na), (b, nb) in zip(long, short, strict=False)]


def spread(values: list[float], fmt: str) -> str:
    """min–max and the standard deviation of the per-round values (one round: no spread)."""
    if len(values) < 2:
        return f"{values[0]:{fmt}} (1 round)" if values else "-"
    return f"{min(values):{fmt}}–{max(values):{fmt}} sd {statistics.stdev(values):{fmt}}"


def regenerate_lines(results: dict[str, dict[str, Cell]], nums: dict, hwm: dict[str, int]) -> tuple[list[str], dict]:
    """--regenerate 1 vs 0 on the same `tools` requests in the same rounds: the pooled ratios, then each
    round's own fit, whose spread says how far one run's ratio can be trusted on this machine."""
    pooled, rounds, raw = [], [], {}
    for label, on, off in PAIRS:
        a, b = nums[on], nums[off]
        chunk_us, fixed_ms = (a["per_chunk_us"], b["per_chunk_us"]), (a["fixed_ms"], b["fixed_ms"])
        pooled.append(
            f"CPU/chunk {chunk_us[0] / chunk_us[1]:.2f}×, fixed CPU/request {fixed_ms[0] / fixed_ms[1]:.2f}× "
            f"({label}: {chunk_us[0]:.1f} vs {chunk_us[1]:.1f} µs, {fixed_ms[0]:.2f} vs {fixed_ms[1]:.2f} ms)"
        )
        r1, r0 = per_round(results, on), per_round(results, off)
        chunk = [x[0] / y[0] for x, y in zip(r1, r0, strict=True)]
        fixed = [x[1] / y[1] for x, y in zip(r1, r0, strict=True)]
        rounds.append(
            f"      {label}, {len(chunk)} rounds: CPU/chunk ratio {spread(chunk, '.2f')}, "
            f"fixed ratio {spread(fixed, '.2f')}; "
            f"µs/chunk 1: {spread([x[0] / 1000 for x in r1], '.1f')}, 0: {spread([y[0] / 1000 for y in r0], '.1f')}; "
            f"ms/request 1: {spread([x[1] / 1e6 for x in r1], '.2f')}, 0: {spread([y[1] / 1e6 for y in r0], '.2f')}"
        )
        raw[label] = {"per_chunk_ratio": chunk, "fixed_ratio": fixed, "regenerate1": r1, "regenerate0": r0}
    rss = f"RSS peak (32 streams × 1 MB bodies) {hwm['tapfix'] / 1024:.0f} vs {hwm['tapfix0'] / 1024:.0f} MB"
    head = "INFO  regenerate 1 vs 0: " + "; ".join([*pooled, rss])
    return [head, "      per round (each round's own two-point fit: min–max, sd):", *rounds], raw


def export_lines(results: dict[str, dict[str, Cell]], nums: dict, fleet: Fleet) -> list[str]:
    """OTLP export on vs off (issue 20's target: at most 5% more CPU per chunk and per request), the
    same requests (capture only, c=8, 256 and 16 events) in the same rounds, and what the receiver got."""
    on, off = nums[EXPORT], nums[CAPTURE]
    chunk, fixed = on["per_chunk_us"] / off["per_chunk_us"], on["fixed_ms"] / off["fixed_ms"]
    r_on, r_off = per_round(results, EXPORT), per_round(results, CAPTURE)
    got = fleet.stats_of("otlpsink")
    sent = fleet.sent.get(EXPORT, 0)
    verdict = "OK  " if got["spans"] >= sent and not got["undecodable"] else "WARN"
    return [
        f"INFO  OTLP export on vs off (c=8, 256/16-event streams; target ≤ 1.05×): CPU/chunk {chunk:.2f}× "
        f"({on['per_chunk_us']:.1f} vs {off['per_chunk_us']:.1f} µs), fixed CPU/request {fixed:.2f}× "
        f"({on['fixed_ms']:.2f} vs {off['fixed_ms']:.2f} ms); per round: CPU/chunk ratio "
        f"{spread([x[0] / y[0] for x, y in zip(r_on, r_off, strict=True)], '.2f')}, fixed ratio "
        f"{spread([x[1] / y[1] for x, y in zip(r_on, r_off, strict=True)], '.2f')}",
        f"{verdict}  export: the receiver decoded {got['spans']} spans in {got['trace_posts']} posts and "
        f"{got['metric_points']} metric points in {got['metric_posts']} posts, for {sent} requests sent",
    ]


@contextmanager
def on_one_cpu(fleet: Fleet, pin: bool = True) -> Iterator[str]:
    """The proxies on the first CPU, this process (the load generator) and the upstream on the second, each
    thread's affinity set as `taskset -a -p` would, all CPUs again after. Yields how they were placed.

    Why: unpinned on two CPUs, a proxy's threads and the harness's share both, and tapfix's two threads
    (the event loop's and the capture writer's) hand the GIL to each other across CPUs: measured side by
    side (16-event streams, 8 at a time, 1,000 requests), the writer's thread spent 0.80 ms per request
    pinned against 1.06-1.15 unpinned. A GIL-bound process is one core's worth of Python wherever it runs;
    on one CPU each proxy pays for its own work and not for where the scheduler put it. Plain mitmproxy
    (one thread) is placed the same way."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin:
        yield "not pinned (--unpinned): the proxies, the load generator and the upstream share every CPU"
        return
    if len(cpus) < 2:
        yield "not pinned: fewer than 2 CPUs"
        return
    for name, pid in fleet.pids.items():
        procstat.pin(pid, {cpus[1]} if name == "upstream" else {cpus[0]})
    procstat.pin(os.getpid(), {cpus[1]})
    try:
        yield (
            f"every proxy's threads pinned to CPU {cpus[0]}, the load generator (this process) and the upstream "
            f"to CPU {cpus[1]} (sched_setaffinity of each thread, as `taskset -a -p`)"
        )
    finally:
        for pid in (*fleet.pids.values(), os.getpid()):
            procstat.pin(pid, set(cpus))


def run_lane(fleet: Fleet, quick: bool, pin: bool = True) -> tuple[dict[str, dict[int, lane.Cell]], str]:
    """The stream lane (bench/lane.py) for LANE_ROWS, placed by `on_one_cpu`. Returns the cells and how
    they were placed."""
    with on_one_cpu(fleet, pin) as how:
        return _lane(fleet, quick), how


def _lane(fleet: Fleet, quick: bool) -> dict[str, dict[int, lane.Cell]]:
    target = {r.name: r.target for r in ROWS}
    rows = {
        name: (fleet.ports[target[name]], None if target[name] == "upstream" else fleet.pids[target[name]])
        for name in LANE_ROWS
    }

    def sent(name: str, n: int) -> None:
        fleet.sent[name] = fleet.sent.get(name, 0) + n

    return lane.step_up(
        rows,
        "direct",
        streams=2 if quick else 3,
        rounds=1 if quick else 2,
        body=load.request_body(load.AGENT_BODY, tools=True),
        idle=lambda: procstat.wait_idle(fleet.pids),
        cpu_ns=procstat.cpu_ns,
        sent=sent,
        log=lambda line: print(line, file=sys.stderr),
    )


def lane_lines(cells: dict[str, dict[int, lane.Cell]], how: str, quick: bool) -> tuple[str, list[str], dict]:
    """The lane's table, its targets as PASS/MISS lines, and the numbers for --json."""
    rows, best = lane.report(cells, "direct")
    title = (
        f"Stream lane: N concurrent streams of {lane.DELTAS} deltas {lane.GAP_MS:.0f} ms apart, "
        f"{2 if quick else 3} streams per connection back to back, {1 if quick else 2} round(s); added = this path's "
        f"percentile minus direct's at the same N; (core) = the proxy's CPU seconds per second; {how}"
    )
    lines = [
        "streams sustained (nothing lost, +token p99 ≤ one gap): " + ", ".join(f"{n} {v}" for n, v in best.items()),
        verdict(
            "streams sustained, agents' path ≥ plain mitmproxy's",
            float(best[AGENTS]),
            float(best[MITM]),
            f"agents' path {best[AGENTS]}, mitmproxy {best[MITM]}",
            at_least=True,
        ),
        verdict("streams sustained on one core, agents' path ≥ 128", float(best[AGENTS]), 128.0, "streams", True),
    ]
    raw = {
        name: {str(level): cell.res.summary() | {"cpu_s": cell.cpu_ns / 1e9} for level, cell in by_level.items()}
        for name, by_level in cells.items()
    }
    return title + "\n\n" + render(rows), lines, {"sustained": best, "levels": raw}


def first_attempt_check(fleet: Fleet) -> str:
    """Issue 34: every request reached the upstream once, over mitmproxy's own connection (tapfix made no
    later attempt: every stream here is healthy), on the agents' path as on the --regenerate 0 twin."""
    later = {name: fleet.later_attempts(name) for name in ("tapfix", "tapfix0")}
    stats = fleet.upstream_stats()
    got, sent = stats["requests"], sum(fleet.sent.values())
    verdict = "OK  " if got == sent and not any(later.values()) else "WARN"
    return (
        f"{verdict}  first attempts: the upstream got {got} stream requests for the {sent} sent (direct and through "
        f"every proxy, warm-up included); later attempts made: {later['tapfix']} on the agents' path, "
        f"{later['tapfix0']} at --regenerate 0; tapfix's own asks besides: {stats['tokenize_asked']} prompt counts "
        f"(POST /tokenize: the max_tokens clamp, for a prompt whose bytes may not fit the window), "
        f"{stats['models_asked']} model lists (GET /v1/models: the window)"
    )


def _ratio(name: str, value: float, limit: float, a: float, b: float, unit: str) -> tuple[str, float, float, str]:
    return (name, value, limit, f"{a:.{1 if unit == 'µs' else 2}f} vs {b:.{1 if unit == 'µs' else 2}f} {unit}")


def check_targets(nums: dict, hwm: dict[str, int]) -> list[str]:
    """Issue 34's targets first (the agents' path against its --regenerate 0 twin and plain mitmproxy, the
    path without tools against plain mitmproxy, 32 paced streams), then the earlier ones."""
    m, a, a0, c, n = nums[MITM], nums[AGENTS], nums[AGENTS0], nums[CALLS], nums[CAPTURE]
    rss = hwm["tapfix"] / 1024
    checks = [
        _ratio(
            "agents' path, CPU/chunk ≤ 1.1× --regenerate 0",
            a["per_chunk_us"] / a0["per_chunk_us"],
            1.1,
            a["per_chunk_us"],
            a0["per_chunk_us"],
            "µs",
        ),
        _ratio(
            "agents' path, fixed CPU/request ≤ 1.2× --regenerate 0",
            a["fixed_ms"] / a0["fixed_ms"],
            1.2,
            a["fixed_ms"],
            a0["fixed_ms"],
            "ms",
        ),
        _ratio(
            "agents' path, CPU/chunk ≤ 1.25× mitmproxy",
            a["per_chunk_us"] / m["per_chunk_us"],
            1.25,
            a["per_chunk_us"],
            m["per_chunk_us"],
            "µs",
        ),
        _ratio(
            "agents' path, fixed CPU/request ≤ 1.5× mitmproxy",
            a["fixed_ms"] / m["fixed_ms"],
            1.5,
            a["fixed_ms"],
            m["fixed_ms"],
            "ms",
        ),
        _ratio(
            "no tools, CPU/chunk ≤ 1.25× mitmproxy",
            n["per_chunk_us"] / m["per_chunk_us"],
            1.25,
            n["per_chunk_us"],
            m["per_chunk_us"],
            "µs",
        ),
        _ratio(
            "no tools, fixed CPU/request ≤ 1.5× mitmproxy",
            n["fixed_ms"] / m["fixed_ms"],
            1.5,
            n["fixed_ms"],
            m["fixed_ms"],
            "ms",
        ),
        (
            "agents' path, added TTFT p50 at 32 paced streams ≤ plain mitmproxy's + 10 ms",
            a["paced32"][0],
            m["paced32"][0] + 10.0,
            f"ms, mitmproxy {m['paced32'][0]:.2f}",
        ),
        _ratio(
            "tool call in stream, CPU/chunk ≤ 2× mitmproxy",
            c["per_chunk_us"] / m["per_chunk_us"],
            2.0,
            c["per_chunk_us"],
            m["per_chunk_us"],
            "µs",
        ),
        ("agents' path, added TTFT p50 at 1 stream ≤ 2 ms", a["ttft1"][0], 2.0, "ms"),
        ("agents' path, added TTFT p99 at 1 stream ≤ 5 ms", a["ttft1"][1], 5.0, "ms"),
        ("agents' path, added TTFT p99, 32 paced streams ≤ 10 ms", a["paced32"][1], 10.0, "ms"),
        ("RSS peak, 32 streams × 1 MB bodies ≤ 150 MB", rss, 150.0, "MB"),
    ]
    return [verdict(*check) for check in checks]


RATIO_TARGET = re.compile(r"[≤≥] [\d.]+×")  # "≤ 1.25× mitmproxy": the value is a ratio


def verdict(what: str, value: float, limit: float, note: str, at_least: bool = False) -> str:
    """PASS when `value` is at most `limit` (`at_least`: at least); the measured value is shown, and its share
    of the limit."""
    shown = f"{value:.2f}×" if RATIO_TARGET.search(what) else f"{value:.2f}"
    share = f"{value / limit * 100:.0f}%" if limit else "∞"
    ok = value >= limit if at_least else value <= limit
    return f"{'PASS' if ok else 'MISS'}  {what}: {shown} ({note}; {share} of the target)"


def chunk_reads(db: Path) -> str:
    """How many upstream reads tapfix saw per stream kind: 1 per event means CPU/chunk is per event."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        rows = conn.execute("select request_headers, chunk_count from exchanges").fetchall()
        conn.close()
    except sqlite3.Error as e:
        return f"(could not read {db}: {e})"
    groups: dict[tuple[str, str], list[int]] = {}
    for headers, count in rows:
        h = dict(json.loads(headers))
        groups.setdefault((h.get("x-bench-chunks", "?"), h.get("x-bench-delay-ms", "?")), []).append(count or 0)
    parts = [
        f"{k[0]} events @{k[1]} ms: {sum(v) / len(v):.1f} reads ({len(v)} captures)" for k, v in sorted(groups.items())
    ]
    return f"{len(rows)} captures stored; " + "; ".join(parts)


def render(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests (about a minute)")
    ap.add_argument("--rounds", type=int, default=0, help="rounds per phase (default 4, quick 2)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (db, logs)")
    ap.add_argument("--no-lane", action="store_true", help="skip the stream lane (N concurrent paced streams)")
    ap.add_argument("--json", type=Path, help="also write the raw numbers here")
    ap.add_argument(
        "--unpinned",
        action="store_true",
        help="leave every process on every CPU in the CPU phases and the lane (default: the proxies on one)",
    )
    ap.add_argument(
        "--tapfix-arg",
        action="append",
        default=None,
        help="extra `tapfix run` argument (repeatable; default: --engine vllm)",
    )
    a = ap.parse_args()
    rounds = a.rounds or (2 if a.quick else 4)
    work = Path(tempfile.mkdtemp(prefix="tapfix-bench-"))
    # --regenerate 1 spelled out (the default on main, but the rows are labelled by it); tapfix0 adds 0 last
    fleet = Fleet(work, ["--regenerate", "1", *(a.tapfix_arg if a.tapfix_arg is not None else ["--engine", "vllm"])])
    t0 = time.monotonic()
    print(
        f"tapfix bench {'--quick ' if a.quick else ''}{datetime.datetime.now().isoformat(timespec='seconds')}; "
        f"{os.cpu_count()} cpus; work dir {work}",
        file=sys.stderr,
    )
    try:
        fleet.start()
        busy0, ours0 = (
            procstat.machine_busy_ns(),
            procstat.self_cpu_ns() + sum(procstat.ticks_ns(p) for p in fleet.pids.values()),
        )
        idle = {k: procstat.idle_rate_ns_per_s(p, 0.5) / 1e6 for k, p in fleet.pids.items()}
        warm_up(fleet)
        results = {}
        placed = ""
        for phase in PHASES:
            t = time.monotonic()
            with on_one_cpu(fleet, phase.pinned and not a.unpinned) as how:
                results[phase.name] = run_phase(fleet, phase, a.quick, rounds)
            placed = how if phase.pinned else placed
            print(f"  {phase.name}: {time.monotonic() - t:.1f}s", file=sys.stderr)
        lane_cells, pinned = None, ""
        if not a.no_lane:
            t = time.monotonic()
            lane_cells, pinned = run_lane(fleet, a.quick, not a.unpinned)
            print(f"  lane: {time.monotonic() - t:.1f}s", file=sys.stderr)
        hwm = {k: procstat.memory_kb(p)["VmHWM"] for k, p in fleet.pids.items()}
        ours = procstat.self_cpu_ns() + sum(procstat.ticks_ns(p) for p in fleet.pids.values()) - ours0
        others = procstat.machine_busy_ns() - busy0 - ours
        elapsed = time.monotonic() - t0
        rows, nums = table(results, hwm)
        up = results["cpu256"]["direct"]
        print()
        print(render(rows))
        print()
        for line in check_targets(nums, hwm):
            print(line)
        lane_raw: dict = {}
        if lane_cells is not None:
            lane_table, lane_checks, lane_raw = lane_lines(lane_cells, pinned, a.quick)
            for line in lane_checks[1:]:
                print(line)
            print()
            print(lane_table)
            print()
            print(lane_checks[0])
        print()
        print(
            f"upstream's own cost: {up.upstream_ns / up.requests / 256 / 1000:.1f} µs CPU per chunk "
            f"(bench/upstream.py; idle CPU ms/s: " + ", ".join(f"{k} {v:.2f}" for k, v in idle.items()) + ")"
        )
        print(f"tapfix: {chunk_reads(fleet.db)}")
        print(f"tapfix --regenerate 0: {chunk_reads(fleet.db_of('tapfix0'))}")
        print(first_attempt_check(fleet))
        print(f"CPU phases (CPU per chunk and per request): {placed}")
        print(
            f"wall time {elapsed:.0f}s; phases x rounds: {len(PHASES)} x {rounds}; noise: other processes used "
            f"{max(others, 0) / 1e9 / elapsed:.2f} of {os.cpu_count()} cores meanwhile, load avg now "
            f"{open('/proc/loadavg').read().split()[0]}"
        )
        regen, regen_rounds = regenerate_lines(results, nums, hwm)
        for line in regen:
            print(line)
        time.sleep(1.5)  # the exporter's last batch (its worker sends at least once a second)
        for line in export_lines(results, nums, fleet):
            print(line)
        if a.json:
            out = {
                "nums": nums,
                "placed": placed,
                "hwm_kb": hwm,
                "table": rows,
                "regenerate_rounds": regen_rounds,
                "lane": lane_raw,
            }
            a.json.write_text(json.dumps(out, indent=2))
    finally:
        fleet.stop()
        size = sum(f.stat().st_size for f in work.glob("bench.db*"))
        print(f"capture db after shutdown: {size / MB:.1f} MB", file=sys.stderr)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
