"""Benchmark bodies from SQL: pages of 100 rows of `exchange_bodies` through a real Datasette.

Why: `tapfix_body` rebuilds a delta-stored body per row (store/sql_functions.py), and a page of
Datasette's view `exchange_bodies` asks for 100 requests and 100 responses; the target is that
such a page renders in well under 1 s on a big store. The store is filled through the real
`CaptureWriter` with interleaved agent sessions (bench/storage.py's: 30 KB -> 1 MB requests, a
tool call per turn, so requests are delta chains up to bodies.MAX_DEPTH deep). Then a real
`datasette serve` (tapfix's plugin found by its entry point) is timed over loopback, page by
page, newest first (`?_sort_desc=id`, the README's link) and in stored order (the view's own);
Datasette's facet suggestions, on the first page only, each stop at their 50 ms limit on the
body columns, so the first page is also timed without them (`?_nosuggest=1`). Then the same
pages straight from Python's sqlite3, with the connection's reader keeping inflated pieces (the
default) and keeping none, to show what that buys.

    .venv/bin/python bench/sql_bodies.py [--sessions 6] [--turns 120] [--final-kb 1000] [--keep DB]

Not a test: it prints one line per measurement, wall time and the CPU Datasette used (CPU is what
to compare on a shared machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from tapfix.proxy.store.sql_functions import register
from tapfix.proxy.store.sqlite.bodies import DECODED_MAX_BODIES
from tapfix.proxy.store.sqlite.database import read_only_uri
from tapfix.proxy.store.writer import CaptureWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import cpu_ns, machine_busy_ns  # noqa: E402
from runner import free_port, wait_port  # noqa: E402
from storage import agent_turn, session  # noqa: E402

PAGE = 100


def fill(db: Path, sessions: int, turns: int, final_kb: int) -> tuple[int, int]:
    """Interleaved agent sessions (as agents running side by side write them); returns (exchanges, raw bytes)."""
    writer = CaptureWriter(db)
    runs = [session(turns, final_kb, seed=7 + s) for s in range(sessions)]
    raw = written = 0
    for _ in range(turns):
        for s, run in enumerate(runs):
            body, events, _args = next(run)
            ex = agent_turn(body, events, f"ses_bench{s:02d}")
            raw += len(body) + sum(map(len, events))
            writer.submit(ex)
            written += 1
            while writer.stats.written + writer.stats.failures < written - 8:  # bounded memory
                time.sleep(0.001)
    writer.close()
    if writer.stats.failures:
        raise SystemExit(f"writer failures: {writer.stats.last_error}")
    return written, raw


def timed_pages(
    client: httpx.Client, pid: int, path: str, offsets: list[int], sort: bool, **extra: str
) -> list[tuple[float, float, int]]:
    """(wall ms, Datasette's CPU ms, bytes) per page, in order: the server has finished its work when
    the response has arrived, so its CPU is read right after (wall time measures the neighbours too)."""
    out = []
    for offset in offsets:
        params: dict[str, str | int] = {"_size": PAGE, **extra}
        if sort:
            params["_sort_desc"] = "id"
        if offset:
            params["_next"] = offset
        cpu, t = cpu_ns(pid), time.perf_counter()
        response = client.get(path, params=params)
        ms = (time.perf_counter() - t) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{path} {params}: HTTP {response.status_code}: {response.text[:300]}")
        out.append((ms, (cpu_ns(pid) - cpu) / 1e6, len(response.content)))
    return out


def summary(label: str, pages: list[tuple[float, float, int]]) -> str:
    ms, cpu = [m for m, _, _ in pages], [c for _, c, _ in pages]
    return (
        f"{label}: {len(ms)} pages; wall first {ms[0]:.0f} ms, median {statistics.median(ms):.0f} ms,"
        f" max {max(ms):.0f} ms; datasette CPU first {cpu[0]:.0f} ms, median {statistics.median(cpu):.0f} ms,"
        f" max {max(cpu):.0f} ms; page {statistics.median(b for _, _, b in pages) / 2**20:.1f} MB"
    )


def direct(db: Path, offsets: list[int], max_bodies: int) -> list[float]:
    """CPU ms per page of `select id, request, response ... limit 100` through Python's sqlite3, one connection."""
    conn = sqlite3.connect(read_only_uri(db), uri=True)
    register(conn, max_bodies=max_bodies)
    out = []
    for offset in offsets:
        t = time.process_time_ns()
        rows = conn.execute(
            "select id, request, response from exchange_bodies order by id desc limit ? offset ?", (PAGE, offset)
        ).fetchall()
        out.append((time.process_time_ns() - t) / 1e6)
        assert len(rows) == min(PAGE, total_rows(conn) - offset)
    conn.close()
    return out


def total_rows(conn: sqlite3.Connection) -> int:
    return int(conn.execute("select count(*) from exchanges").fetchone()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=6, help="agent sessions, interleaved")
    ap.add_argument("--turns", type=int, default=120, help="turns per session")
    ap.add_argument("--final-kb", type=int, default=1000, help="size of a session's last request body")
    ap.add_argument("--keep", type=Path, help="write the store here (and keep it) instead of a temp dir")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tapfix-sql-bench-"))
    db = a.keep or work / "tapfix.db"
    if db.exists():
        raise SystemExit(f"{db} exists: the bench fills a new store")
    t = time.perf_counter()
    exchanges, raw = fill(db, a.sessions, a.turns, a.final_kb)
    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    conn = sqlite3.connect(read_only_uri(db), uri=True)
    depth, bodies = conn.execute("select max(depth), count(*) from bodies").fetchone()
    conn.close()
    print(
        f"store: {exchanges} exchanges ({a.sessions} sessions x {a.turns} turns, requests up to {a.final_kb} KB),"
        f" raw bodies {raw / 2**20:.0f} MB, on disk {size / 2**20:.1f} MB, {bodies} bodies,"
        f" delta chains up to {depth} deep; filled in {time.perf_counter() - t:.0f} s"
    )
    offsets = list(range(0, exchanges, PAGE))
    port = free_port()
    log = open(work / "datasette.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "datasette"), "serve", str(db), "-h", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_port(port, proc, "datasette", timeout=60)
        name = db.stem
        busy, wall = machine_busy_ns(), time.perf_counter()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            html, pid = f"/{name}/exchange_bodies", proc.pid
            print(
                summary("datasette HTML, newest first (?_sort_desc=id)", timed_pages(client, pid, html, offsets, True))
            )
            print(summary("  again (bodies remembered per connection)", timed_pages(client, pid, html, offsets, True)))
            print(summary("datasette HTML, stored order", timed_pages(client, pid, html, offsets, False)))
            no_suggestions = timed_pages(client, pid, html, offsets, True, _nosuggest="1")
            print(summary("datasette HTML, newest first, ?_nosuggest=1", no_suggestions))
            print(summary("datasette JSON, newest first", timed_pages(client, pid, f"{html}.json", offsets, True)))
        cores = (machine_busy_ns() - busy) / 1e9 / (time.perf_counter() - wall)
        print(f"  the machine was busy {cores:.2f} cores on average meanwhile (this bench and datasette included)")
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()
    for label, keep in (("its reader keeping inflated pieces (the default)", DECODED_MAX_BODIES), ("keeping none", 0)):
        ms = direct(db, offsets, keep)
        print(
            f"python sqlite3, 100 rows of request+response, newest first, {label}: CPU first {ms[0]:.0f} ms,"
            f" median {statistics.median(ms):.0f} ms, max {max(ms):.0f} ms"
        )
    if not a.keep:
        shutil.rmtree(work)
    else:
        os.replace(work / "datasette.log", db.with_suffix(".datasette.log"))
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
