#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""Profile a live tapfix process under the benchmark's load with py-spy, and rank the costs.

Why py-spy on the real process rather than a harness: the per-chunk cost is mostly mitmproxy's
machinery around tapfix's callables (events, layers, chunked framing); a harness that drives
`StreamPipeline` alone would miss it and misjudge shares. py-spy samples without touching the
code (`--nonblocking`: it never pauses the process, so timing is not distorted), all threads
(the writer thread shows up as its own thread), idle frames excluded.

    .venv/bin/pip install py-spy      # profiling only; not a project dependency
    bench/profile.py --kind content --tools --seconds 20
    bench/profile.py --chunks 16 --seconds 15           # fixed per-request costs dominate
    bench/profile.py --chunks 16 --compare-regenerate   # the relay's cost: --regenerate 1 minus 0

Prints CPU per thread, the top functions by self time and tapfix's frames by inclusive time, in µs
per request (each thread's samples scaled by its CPU from /proc); with --compare, plain mitmproxy
under the same load and the per-function difference; with --compare-regenerate, tapfix at
`--regenerate 1` (a request with `tools` goes through the relay) against `--regenerate 0` (direct).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import load
import procstat
from runner import BIN, Fleet

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def short(file: str) -> str:
    for marker in ("/site-packages/", "/lib/python3.12/", "/work/main/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


# Leaf frames where a thread waits without using CPU; py-spy's --nonblocking idle detection lets
# some through (the event loop in epoll, the writer thread in SimpleQueue.get). Dropped.
IDLE_LEAVES = ("EpollSelector.select (", "CaptureWriter._run (", "Condition.wait (", "Event.wait (")


def parse(raw: Path, thread_ns: dict[int, int], requests: int) -> tuple[dict, dict, dict]:
    """py-spy raw (collapsed) stacks → self and inclusive µs per request by function, and per thread.

    Each thread's samples are scaled by that thread's CPU from /proc, so a sample of the event loop
    and one of the writer thread each stand for the CPU time their own thread really used."""
    rows: list[tuple[str, list[str], int]] = []
    samples: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, *frames = stack.split(";")
        names = []
        for f in frames:
            m = FRAME.match(f)
            names.append(f"{m['func']} ({short(m['file'])})" if m else f)
        if not names or names[-1].startswith(IDLE_LEAVES):
            continue
        rows.append((thread, names, int(count)))
        samples[thread] += int(count)
    scale = {}
    for thread, n in samples.items():
        m = re.search(r"\((\d+)\)", thread)
        ns = thread_ns.get(int(m[1]), 0) if m else 0
        scale[thread] = ns / 1000 / max(requests, 1) / n
    own: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    for thread, names, n in rows:
        us = n * scale[thread]
        own[names[-1]] += us
        for name in set(names):
            incl[name] += us
    per_thread = {t: (n, n * scale[t]) for t, n in samples.items()}
    return own, incl, per_thread


def record(spy: str, fleet: Fleet, target: str, a: argparse.Namespace, raw: Path) -> dict:
    """Drive the load at one proxy while py-spy samples it; CPU per thread from /proc."""
    pid, port = fleet.pids[target], fleet.ports[target]
    body = load.request_body(a.body_bytes, tools=not a.no_tools)
    headers = load.bench_headers(a.kind, a.chunks, a.delay_ms)
    asyncio.run(load.run_load("127.0.0.1", port, concurrency=4, requests=32, body=body, headers=headers))
    procstat.wait_idle(fleet.pids)
    stop = threading.Event()
    sent = [0]

    def drive() -> None:  # long runs: connection setup stays out of the profile
        batch = a.concurrency * max(4, int(2000 / a.chunks))
        while not stop.is_set():
            asyncio.run(
                load.run_load("127.0.0.1", port, concurrency=a.concurrency, requests=batch, body=body, headers=headers)
            )
            sent[0] += batch

    cpu0, tasks0 = procstat.cpu_ns(pid), procstat.task_cpu_ns(pid)
    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    subprocess.run(
        [
            spy,
            "record",
            "-p",
            str(pid),
            "-r",
            str(a.rate),
            "-d",
            str(int(a.seconds)),
            "-f",
            "raw",
            "-o",
            str(raw),
            "--nonblocking",
            "--threads",
        ],
        check=True,
        capture_output=True,
    )
    stop.set()
    driver.join()
    procstat.wait_idle(fleet.pids)
    tasks = {tid: ns - tasks0.get(tid, 0) for tid, ns in procstat.task_cpu_ns(pid).items()}
    return {"cpu": procstat.cpu_ns(pid) - cpu0, "tasks": tasks, "sent": sent[0], "raw": raw}


def report(target: str, run: dict, a: argparse.Namespace) -> dict[str, float]:
    """Print one profile; returns self time per function in µs per request."""
    sent, cpu = max(run["sent"], 1), run["cpu"]
    own, incl, per_thread = parse(run["raw"], run["tasks"], sent)
    print(
        f"\n=== {target}: {sent} requests × {a.chunks} events ({a.kind}, tools={'no' if a.no_tools else 'yes'}, "
        f"{a.concurrency} streams @{a.delay_ms} ms); CPU {cpu / sent / 1000:.0f} µs/request = "
        f"{cpu / sent / a.chunks / 1000:.1f} µs per event incl. fixed costs"
    )
    print("threads (busy samples; CPU from /proc/PID/task/TID/schedstat):")
    for thread, (n, us) in sorted(per_thread.items(), key=lambda kv: -kv[1][1]):
        print(f"  {n:6d} samples  {us:8.1f} µs/request  {thread}")
    print(f"top {a.top} by self time (µs/request, % of the process's CPU):")
    total = sum(own.values()) or 1
    for name, us in own.most_common(a.top):
        print(f"  {us:8.1f}  {us / total * 100:5.1f}%  {name}")
    mine = [
        (k, v)
        for k, v in incl.items()
        if re.search(r"\((proxy|addons)/", k) and not k.startswith(("run ", "_run_proxy "))
    ]
    if mine:
        print(f"top {a.top} tapfix frames by inclusive time (µs/request, %):")
        for name, us in sorted(mine, key=lambda kv: -kv[1])[: a.top]:
            print(f"  {us:8.1f}  {us / total * 100:5.1f}%  {name}")
    return dict(own)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--kind", choices=["content", "tools"], default="content")
    ap.add_argument("--no-tools", action="store_true", help="requests without `tools` (repair not armed)")
    ap.add_argument("--chunks", type=int, default=256)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--body-bytes", type=int, default=2048)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--compare", action="store_true", help="also profile plain mitmproxy; print the difference")
    ap.add_argument(
        "--compare-regenerate",
        action="store_true",
        help="tapfix --regenerate 1 against a second tapfix at --regenerate 0 (the relay's cost)",
    )
    ap.add_argument("--out", type=Path, help="keep the raw stacks in this folder (flamegraph input)")
    a = ap.parse_args()
    spy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy not found: .venv/bin/pip install py-spy")
    work = Path(tempfile.mkdtemp(prefix="tapfix-prof-"))
    out = a.out or work
    out.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(work, ["--engine", "vllm", *(["--regenerate", "1"] if a.compare_regenerate else [])])
    other = "tapfix0" if a.compare_regenerate else "mitm" if a.compare else None
    targets = ("tapfix",) if other is None else (other, "tapfix")
    try:
        fleet.start(which=targets)
        runs = {t: record(spy, fleet, t, a, out / f"{t}.stacks") for t in targets}
    finally:
        fleet.stop()
    costs = {t: report(t, runs[t], a) for t in targets}
    if other is not None:
        keys = set(costs["tapfix"]) | set(costs[other])
        diff = sorted(((costs["tapfix"].get(k, 0) - costs[other].get(k, 0), k) for k in keys), reverse=True)
        what = "tapfix --regenerate 1 minus 0" if other == "tapfix0" else "tapfix minus mitmproxy"
        print(f"\n=== {what}, self time µs/request (top {a.top} increases):")
        for d, k in diff[: a.top]:
            print(f"  {d:+7.1f}  {k}")
    if not a.out:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
