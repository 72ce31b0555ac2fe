"""What OTLP export costs tapfix: two identical `tapfix run` processes, export off and `--otlp` on, side by side.

Issue 20's target: at c=8 with 256-event streams, CPU per chunk and per request at most 5% more with
export on. Both processes serve the same requests in the same rounds (a rotated order, so a noisy
moment on this shared machine hits both); CPU is the whole process (all threads: the writer that
builds each Turn, the export worker that builds and sends the spans, the metric reader), read from
/proc before a block and after it once the process is idle again. The fit is the main bench's:
1 ms-paced streams of 256 and 16 events, per_chunk = (cpu256 - cpu16) / 240, fixed = cpu16 - 16 x
per_chunk. The receiver is a loopback OTLP/HTTP sink in this process that answers 200 to everything
(its CPU is not counted); the run checks it got every span.

    bench/otlp.py            # 4 rounds, about two minutes
    bench/otlp.py --quick    # 2 rounds, under a minute
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import load
import procstat
import runner

PROCS = {"off": "tapfix, export off", "on": "tapfix --otlp (spans + metrics)"}
PHASES = {"cpu256": (256, 128, 32), "cpu16": (16, 512, 128)}  # chunks, requests per row (full, quick)


class _Sink(http.server.BaseHTTPRequestHandler):
    """OTLP/HTTP receiver that keeps nothing: an empty 200 is a valid Export*ServiceResponse."""

    posts: dict[str, int] = {}

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("content-length") or 0))
        _Sink.posts[self.path] = _Sink.posts.get(self.path, 0) + 1
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Pair(runner.Fleet):
    """The upstream and the two tapfix processes; `on` exports to `sink`."""

    def __init__(self, work: Path, sink: str) -> None:
        super().__init__(work, ["--engine", "vllm"])
        self.sink = sink

    def start(self, which: tuple[str, ...] = ()) -> None:
        import os

        env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CONFIG_HOME": str(self.work / "config")}
        up = runner.free_port()
        self._spawn(
            "upstream", [sys.executable, str(runner.ROOT / "bench/upstream.py"), "--listen", f"127.0.0.1:{up}"], up, env
        )
        for name in PROCS:
            port = runner.free_port()
            argv = [
                str(runner.BIN / "tapfix"),
                "run",
                "--upstream",
                f"http://127.0.0.1:{up}",
                "--listen",
                f"127.0.0.1:{port}",
            ]
            argv += ["--db", str(self.work / f"{name}.db"), *self.tapfix_args]
            self._spawn(name, argv + (["--otlp", self.sink] if name == "on" else []), port, env)


def block(pair: Pair, name: str, chunks: int, n: int, body: bytes) -> int:
    """One row's block: n requests at c=8; the process's CPU for them (ns)."""
    pids = pair.pids
    procstat.wait_idle(pids, max_s=20.0)
    before = procstat.snapshot(pids)
    res = asyncio.run(
        load.run_load(
            "127.0.0.1",
            pair.ports[name],
            concurrency=8,
            requests=n,
            body=body,
            headers=load.bench_headers("content", chunks, 1),
        )
    )
    procstat.wait_idle(pids, max_s=20.0)
    if res.errors:
        print(f"  {name}/{chunks}: {len(res.errors)} errors, first: {res.errors[0]}", file=sys.stderr)
    return procstat.snapshot(pids)[name] - before[name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=0)
    a = ap.parse_args()
    rounds = a.rounds or (2 if a.quick else 4)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="tapfix-bench-otlp-"))
    pair = Pair(work, f"http://127.0.0.1:{server.server_address[1]}")
    body = load.request_body(2048, tools=True)
    t0 = time.monotonic()
    try:
        pair.start()
        for name in PROCS:  # warm-up: lazy imports, connections, the exporters' first batch
            for chunks in (16, 256):
                block(pair, name, chunks, 16, body)
        cpu = {(name, ph): [] for name in PROCS for ph in PHASES}  # per round: ns per request
        for i in range(rounds):
            for ph, (chunks, full, quick) in PHASES.items():
                n = (quick if a.quick else full) // rounds
                for name in list(PROCS)[i % 2 :] + list(PROCS)[: i % 2]:
                    cpu[(name, ph)].append(block(pair, name, chunks, n, body) / n)
        fit = {}
        for name in PROCS:
            per_round = [
                ((c256 - c16) / 240, c16 - 16 * (c256 - c16) / 240)
                for c256, c16 in zip(cpu[(name, "cpu256")], cpu[(name, "cpu16")], strict=True)
            ]
            c256, c16 = (statistics.mean(cpu[(name, ph)]) for ph in PHASES)
            fit[name] = ((c256 - c16) / 240, c16 - 16 * (c256 - c16) / 240, per_round)
        print()
        print("| | CPU µs/chunk | CPU ms/request (fixed) | CPU ms per 256-chunk request |")
        print("|---|---|---|---|")
        for name, label in PROCS.items():
            chunk, fixed, _ = fit[name]
            whole = statistics.mean(cpu[(name, "cpu256")])
            print(f"| {label} | {chunk / 1e3:.1f} | {fixed / 1e6:.2f} | {whole / 1e6:.2f} |")
        ratio_chunk = fit["on"][0] / fit["off"][0]
        ratio_fixed = fit["on"][1] / fit["off"][1]
        ratio_256 = statistics.mean(cpu[("on", "cpu256")]) / statistics.mean(cpu[("off", "cpu256")])
        print()
        spread = [on[0] / off[0] for on, off in zip(fit["on"][2], fit["off"][2], strict=True)]
        print(
            f"export on / off: CPU/chunk {ratio_chunk:.3f}x, fixed CPU/request {ratio_fixed:.3f}x, "
            f"a whole 256-chunk request {ratio_256:.3f}x "
            f"(per-round CPU/chunk ratio {min(spread):.3f}-{max(spread):.3f})"
        )
        verdict = "PASS" if ratio_256 <= 1.05 else "MISS"
        print(f"{verdict}  target: a 256-chunk request at c=8 costs at most 5% more CPU with export on")
        with urllib.request.urlopen(f"http://127.0.0.1:{pair.ports['on']}/tapfix/health", timeout=10) as r:
            spans = json.loads(r.read())["telemetry"]["spans"]
        print(
            f"spans: {spans['exported']} exported, {spans['failed']} failed, {spans['dropped']} dropped; receiver got "
            f"{_Sink.posts} (POSTs by path); wall time {time.monotonic() - t0:.0f}s"
        )
    finally:
        pair.stop()
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
