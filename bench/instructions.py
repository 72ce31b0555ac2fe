"""Instructions per chunk and per request of a proxy, counted by valgrind (callgrind): repeatable under load.

Why: on a shared machine CPU time read from /proc moves with the neighbours by ±20% per round (cache
misses, frequency, hyperthread siblings); an instruction count doesn't. So to decide what to change,
each proxy runs under `valgrind --tool=callgrind --instr-atstart=no`, collection is switched on only
around a block of requests (`callgrind_control -i on/off`) after a warm-up, and the counts of two blocks
(streams of 256 and of 16 events) give instructions per chunk and fixed instructions per request by the
same two-point fit as bench/run's CPU. Events are paced slowly (the proxy runs ~50× slower under
valgrind) so each is its own read, as with a real model. What it doesn't count: kernel work (the
sockets' syscalls, the same for every proxy), and waiting.

    bench/instructions.py                       # plain mitmproxy, tapfix agents' path, no tools, --regenerate 0
    bench/instructions.py --rows mitm,agents --requests 8 --pairs 3

Each row prints the median of its fits (and each fit), then the ratios to plain mitmproxy's. Where the
instructions go inside a row is py-spy's job (bench/profile.py): the interpreter's own functions are all
valgrind sees.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import load
import procstat
from runner import BIN, ROOT, free_port, wait_port

ROWS = {  # name → (proxy, request with tools?, stream kind, extra tapfix arguments)
    "mitm": ("mitm", True, "content", []),
    "agents": ("tapfix", True, "content", ["--regenerate", "1"]),
    "agents0": ("tapfix", True, "content", ["--regenerate", "0"]),
    "calls": ("tapfix", True, "tools", ["--regenerate", "1"]),
    "notools": ("tapfix", False, "content", ["--regenerate", "1"]),
}
SUMMARY = re.compile(rb"^totals:\s+(\d+)", re.M)


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def _ctl(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=120)


def _dumped(out: Path, before: set[Path], port: int) -> int:
    """Instructions in the dump files written since `before` (callgrind writes one per dump and thread).

    valgrind acts on a `callgrind_control` command only when the process next runs: an idle proxy sits
    in epoll and would dump at exit. So it is woken with a bare TCP connection (collection is off by then:
    not counted) until the dump, with its `totals:` line, is on disk."""
    for step in range(600):
        new = set(out.parent.glob(out.name + ".*")) - before  # the dumps: .1, .2, … (not the exit file)
        found = [SUMMARY.search(f.read_bytes()) for f in new]
        if new and all(found):
            return sum(int(m[1]) for m in found if m)
        if step % 5 == 0:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
        time.sleep(0.1)
    raise SystemExit("callgrind wrote no dump")


def measure(row: str, upstream: str, work: Path, requests: int, delay_ms: float, pairs: int) -> dict:
    proxy, tools, kind, extra = ROWS[row]
    port = free_port()
    out = work / f"{row}.callgrind"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CONFIG_HOME": str(work / "config")}
    if proxy == "mitm":
        mode = f"reverse:{upstream}@127.0.0.1:{port}"
        argv = [str(BIN / "mitmdump"), "-q", "--mode", mode, "-s", str(ROOT / "bench/mitm_stream.py")]
        argv += ["--set", "connection_strategy=lazy", "--set", f"confdir={work / 'mitm-conf'}"]
    else:
        argv = [str(BIN / "tapfix"), "run", "--upstream", upstream, "--listen", f"127.0.0.1:{port}"]
        argv += ["--db", str(work / f"{row}.db"), "--engine", "vllm", *extra]
    proc = _spawn([*valgrind, *argv], work / f"{row}.log", env)
    try:
        wait_port(port, proc, row, timeout=600)
        body = load.request_body(load.AGENT_BODY, tools=tools)
        for chunks in (16, 256, 16, 256):  # warm-up: lazy imports, caches, the store's first pages
            asyncio.run(_block(port, body, kind, chunks, delay_ms, 2))
        fits = []
        for _ in range(pairs):
            counts = {}
            for chunks in (256, 16):
                procstat.wait_idle({row: proc.pid}, quiet_ns=30_000_000, max_s=60)  # the writer stored it all
                before = set(work.glob(out.name + ".*"))
                _ctl(proc.pid, "-z")
                _ctl(proc.pid, "-i", "on")
                asyncio.run(_block(port, body, kind, chunks, delay_ms, requests))
                procstat.wait_idle({row: proc.pid}, quiet_ns=30_000_000, max_s=60)  # and this block's, counted
                _ctl(proc.pid, "-i", "off")
                _ctl(proc.pid, "-d")
                counts[chunks] = _dumped(out, before, port) / requests
            per_chunk = (counts[256] - counts[16]) / 240
            fits.append((per_chunk, counts[16] - 16 * per_chunk))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "per_chunk": statistics.median(f[0] for f in fits),
        "fixed": statistics.median(f[1] for f in fits),
        "fits": fits,
    }


async def _block(port: int, body: bytes, kind: str, chunks: int, delay_ms: float, requests: int) -> None:
    res = await load.run_load(
        "127.0.0.1",
        port,
        concurrency=1,
        requests=requests,
        body=body,
        headers=load.bench_headers(kind, chunks, delay_ms),
        timeout=3600,
    )
    if res.errors:
        raise SystemExit(f"{len(res.errors)} errors, first: {res.errors[0]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="mitm,agents,notools,agents0", help=f"comma-separated: {','.join(ROWS)}")
    ap.add_argument("--requests", type=int, default=8, help="requests per block")
    ap.add_argument("--delay-ms", type=float, default=15.0, help="pacing between events (one read each)")
    ap.add_argument("--pairs", type=int, default=2, help="256- and 16-event blocks per row: each pair is one fit")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind not found (apt-get install valgrind)")
    work = Path(tempfile.mkdtemp(prefix="tapfix-ir-"))
    up = free_port()
    upstream = subprocess.Popen([sys.executable, str(ROOT / "bench/upstream.py"), "--listen", f"127.0.0.1:{up}"])
    results = {}
    try:
        wait_port(up, upstream, "upstream")
        for row in a.rows.split(","):
            results[row] = r = measure(row, f"http://127.0.0.1:{up}", work, a.requests, a.delay_ms, a.pairs)
            fits = "; ".join(f"{c:,.0f} / {f:,.0f}" for c, f in r["fits"])
            line = f"{row:8s} {r['per_chunk']:>10,.0f} Ir/chunk {r['fixed']:>13,.0f} Ir/request (fits: {fits})"
            print(line, flush=True)
    finally:
        upstream.terminate()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    base = results.get("mitm")
    if base:
        for row, r in results.items():
            print(
                f"{row:8s} per chunk {r['per_chunk'] / base['per_chunk']:.2f}× mitmproxy, "
                f"fixed {r['fixed'] / base['fixed']:.2f}×"
            )


if __name__ == "__main__":
    main()
