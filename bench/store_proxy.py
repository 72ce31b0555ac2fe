"""Write throughput through the proxy: real `tapfix run` processes in front of `tapfix mock`, one writing
SQLite and one PostgreSQL, loaded side by side in the same rounds (bench/load.py's keep-alive
clients, 8 streams), so a noisy moment of the shared machine hits both alike.

For each store: exchanges/s over the load (the proxy's answer rate, what a client sees), the
writer's peak queue depth (from `/tapfix/health`, polled every 50 ms), how long after the last answer
the writer had stored everything, and the count: rows in the store against requests sent, lost
(health's `failures`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import load  # noqa: E402
from runner import free_port, wait_port  # noqa: E402

ROUNDS = 4
CONCURRENCY = 8


def health(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/tapfix/health", timeout=10) as r:
        return json.loads(r.read()).get("capture_writer") or {}


class Proxies:
    """`tapfix mock` and one `tapfix run` per store, as child processes; stopped by PID."""

    def __init__(self, work: Path, stores: dict[str, str]) -> None:
        self.work, self.procs, self.ports = work, {}, {}
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CONFIG_HOME": str(work / "config")}
        mock = free_port()
        self._spawn("mock", ["mock", "--listen", f"127.0.0.1:{mock}"], mock, env)
        for name, db in stores.items():
            port = free_port()
            argv = ["run", "--upstream", f"http://127.0.0.1:{mock}", "--listen", f"127.0.0.1:{port}", "--db", db]
            self._spawn(name, argv, port, env)

    def _spawn(self, name: str, argv: list[str], port: int, env: dict[str, str]) -> None:
        log = open(self.work / f"proxy-{name}.log", "wb")
        cmd = [sys.executable, "-m", "tapfix.proxy.cli", *argv]
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work)
        self.ports[name] = port
        wait_port(port, self.procs[name], f"tapfix {argv[0]} ({name})")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in self.procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def _watch(port: int, peak: dict[str, int], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            peak["queue"] = max(peak["queue"], int(health(port).get("queue_depth", 0)))
        except OSError:
            pass
        stop.wait(0.05)


def run(work: Path, n: int, pg_dsn: str) -> dict[str, dict[str, Any]]:
    """`n` exchanges through each store's proxy; the numbers per store."""
    stores = {"sqlite": str(work / "proxy.db"), "postgresql": pg_dsn}
    proxies = Proxies(work, stores)
    body = load.request_body(2048, tools=False)
    out = {name: {"sent": 0, "wall": 0.0, "peak_queue": 0, "errors": 0} for name in stores}
    try:
        per_round = [n // ROUNDS + (1 if i < n % ROUNDS else 0) for i in range(ROUNDS)]
        names = list(stores)
        for i, count in enumerate(per_round):
            for name in names[i % 2 :] + names[: i % 2]:
                peak, stop = {"queue": 0}, threading.Event()
                watcher = threading.Thread(target=_watch, args=(proxies.ports[name], peak, stop), daemon=True)
                watcher.start()
                t = time.perf_counter()
                res = asyncio.run(
                    load.run_load(
                        "127.0.0.1", proxies.ports[name], concurrency=CONCURRENCY, requests=count, body=body, headers={}
                    )
                )
                out[name]["wall"] += time.perf_counter() - t
                out[name]["sent"] += count
                out[name]["errors"] += len(res.errors)
                stop.set()
                watcher.join()
                out[name]["peak_queue"] = max(out[name]["peak_queue"], peak["queue"])
        for name in names:
            t = time.perf_counter()
            while time.perf_counter() - t < 120:
                h = health(proxies.ports[name])
                if h.get("written", 0) + h.get("failures", 0) >= out[name]["sent"]:
                    break
                time.sleep(0.05)
            out[name].update(drain_s=time.perf_counter() - t, lost=h.get("failures", 0), written=h.get("written", 0))
    finally:
        proxies.stop()
    for name, db in stores.items():
        out[name]["stored"] = _count(db)
        out[name]["per_s"] = out[name]["sent"] / out[name]["wall"] if out[name]["wall"] else 0.0
    return out


def _count(db: str) -> int:
    if db.startswith(("postgresql://", "postgres://")):
        import psycopg

        with psycopg.connect(db) as conn:
            return int(conn.execute("select count(*) from exchanges").fetchone()[0])
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return int(conn.execute("select count(*) from exchanges").fetchone()[0])
