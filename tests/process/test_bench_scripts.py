"""The bench scripts' rows against real processes: `bench/versus` reads each tree's command line, the agents'
path rows and their `--regenerate 0` twins send each request upstream once with no later attempt (issues 19
and 34; a long prompt's count, which tapfix asks first, is no stream request), and the stream lane reads every
delta and how late it came and counts the requests it wrote, and the CPU phases and the lane place the processes
on one CPU each side and give every CPU back. The pure checks are in
tests/unit/test_bench_scripts.py."""

from __future__ import annotations

import asyncio
import importlib
import os
import socketserver
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench(name: str) -> Any:
    """A bench script as a module (they import their siblings by bare name, so bench/ goes on the path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


FLAG_COMMIT = "5daa0b8"  # settings: tapfix run --regenerate N; its parent rejects the flag


def test_versus_reads_from_each_trees_cli_whether_it_knows_regenerate(tmp_path: Path) -> None:
    versus = _bench("versus")
    assert versus.knows_regenerate(None)  # this tree
    for rev, knows in ((f"{FLAG_COMMIT}^", False), (FLAG_COMMIT, True)):
        if subprocess.run(["git", "-C", str(BENCH.parent), "cat-file", "-e", rev], capture_output=True).returncode:
            pytest.skip(f"{rev} is not in this clone")
        pkg = tmp_path / rev / "tapfix"
        pkg.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(BENCH.parent), "archive", rev, "proxy", "addons", "schemas"],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive.stdout, check=True)
        assert versus.knows_regenerate(pkg.parent) is knows, rev


def test_every_request_reaches_the_upstream_once_on_the_agents_path_and_its_twin(tmp_path: Path) -> None:
    runner = _bench("runner")
    fleet = runner.Fleet(tmp_path, ["--regenerate", "1", "--engine", "vllm"])
    rows = {r.name: r for r in runner.ROWS}
    sent = {runner.AGENTS: 3, runner.CALLS0: 2, runner.AGENTS0: 1, runner.CAPTURE: 2}
    try:
        fleet.start(which=("tapfix", "tapfix0"))
        for name, n in sent.items():
            row = rows[name]
            phase = runner.Phase("check", 2, 16, 0, 0, 0)
            res = asyncio.run(runner.run_block(fleet, row, phase, n, load_body(row.tools)))
            assert not res.errors and len(res.ttft) == n, (name, res.errors)
        # An agent-sized prompt of 1 MB (the RSS phase's): tapfix's clamp asks the upstream for its count first
        # (`POST /tokenize`, as of a vLLM: its bytes might not fit the window), which is no stream request.
        big = runner.Phase("check", 1, 16, 0, 0, 0)
        for name in (runner.AGENTS, runner.AGENTS0):
            body = _bench("load").request_body(runner.MB, tools=True)
            res = asyncio.run(runner.run_block(fleet, rows[name], big, 1, body))
            assert not res.errors and len(res.ttft) == 1, (name, res.errors)
            sent[name] += 1
        assert (fleet.later_attempts("tapfix"), fleet.later_attempts("tapfix0")) == (0, 0)
        assert fleet.upstream_stats()["requests"] == sum(sent.values())
        assert fleet.upstream_stats()["tokenize_asked"] == 2
        assert runner.first_attempt_check(fleet).startswith("OK  "), runner.first_attempt_check(fleet)
        fleet.sent[runner.CALLS] = 1  # a request the upstream never saw is reported
        assert runner.first_attempt_check(fleet).startswith("WARN"), runner.first_attempt_check(fleet)
    finally:
        fleet.stop()


def test_the_stream_lane_reads_every_delta_and_how_late_it_came(tmp_path: Path) -> None:
    runner, lane = _bench("runner"), _bench("lane")
    fleet = runner.Fleet(tmp_path, [])
    try:
        fleet.start(which=())
        port = fleet.ports["upstream"]
        res = asyncio.run(lane.run_level("127.0.0.1", port, 3, streams=2, body=load_body(True), deltas=8, gap_ms=5))
    finally:
        fleet.stop()
    assert res.errors == [] and (res.streams, res.complete, res.lost) == (6, 6, 0)
    assert len(res.ttft) == 6 and len(res.delay) == 6 * 8
    assert all(0 <= d < 5.0 for d in res.delay), "each delta's delay, from the upstream's own stamp"


def test_the_stream_lane_counts_the_requests_it_wrote_not_the_streams_it_asked_for() -> None:
    """A connection whose first answer fails takes no more streams: what the runner checks the upstream's count
    against is what went over the wire."""
    lane = _bench("lane")
    received: list[bytes] = []

    class Refusing(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while head := self._head():
                length = next((int(h[15:]) for h in head if h.lower().startswith(b"content-length:")), 0)
                self.rfile.read(length)
                received.append(head[0])
                self.wfile.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")

        def _head(self) -> list[bytes]:
            lines = []
            while (line := self.rfile.readline()) not in (b"\r\n", b""):
                lines.append(line.rstrip(b"\r\n"))
            return lines

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Refusing)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    counted: dict[str, int] = {}
    try:
        cells = lane.step_up(
            {"refusing": (server.server_address[1], None)},
            "refusing",
            levels=(2,),
            streams=3,
            body=load_body(True),
            idle=lambda: None,
            cpu_ns=lambda pid: 0,
            sent=lambda name, n: counted.__setitem__(name, counted.get(name, 0) + n),
        )
    finally:
        server.shutdown()
        server.server_close()
    res = cells["refusing"][2].res
    assert res.streams == 6 and len(res.errors) == 2 and res.lost == 6 * lane.DELTAS
    assert counted == {"refusing": 2} and len(received) == 2, (counted, received)


def load_body(tools: bool) -> bytes:
    return bytes(_bench("load").request_body(_bench("load").AGENT_BODY, tools=tools))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="placing processes on one CPU needs two")
def test_the_cpu_phases_and_the_lane_put_the_proxies_on_one_cpu_and_give_every_cpu_back() -> None:
    runner = _bench("runner")
    cpus = sorted(os.sched_getaffinity(0))
    children = {name: subprocess.Popen(["sleep", "30"]) for name in ("upstream", "mitm", "tapfix")}
    fleet = SimpleNamespace(pids={name: p.pid for name, p in children.items()})
    try:
        assert {p.name for p in runner.PHASES if p.pinned} == {"cpu256", "cpu16"}
        with runner.on_one_cpu(fleet) as how:
            assert os.sched_getaffinity(fleet.pids["mitm"]) == os.sched_getaffinity(fleet.pids["tapfix"]) == {cpus[0]}
            assert os.sched_getaffinity(fleet.pids["upstream"]) == os.sched_getaffinity(0) == {cpus[1]}
            assert f"CPU {cpus[0]}" in how
        assert all(os.sched_getaffinity(pid) == set(cpus) for pid in [*fleet.pids.values(), os.getpid()])
        with runner.on_one_cpu(fleet, pin=False) as how:
            assert os.sched_getaffinity(fleet.pids["tapfix"]) == set(cpus) and "not pinned" in how
    finally:
        os.sched_setaffinity(0, set(cpus))
        for p in children.values():
            p.kill()
            p.wait()
