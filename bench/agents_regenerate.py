"""Wall time of a whole agent run when turn 1's tool call is broken: `tapfix run --regenerate 1` (tapfix asks
the upstream again inside the agent's request) against `--regenerate 0` (the error event goes to the agent,
which resends the turn on its own schedule: opencode after about 2 s, omp after about 0.5 s).

Wall time, not CPU, because what the user waits for is the point here. So the numbers only mean something
side by side in one run: the modes alternate (rotated per round), each run gets its own mock, proxy,
capture store and agent HOME, and the noise line says how much CPU other processes took meanwhile.

    .venv/bin/python bench/agents_regenerate.py --runs 5 [--agents opencode,omp] [--scenario NAME] [--wait-quiet S]

Needs the pinned agents (scripts/install-agents). Every run is checked: exit 0, hello.txt holds the greeting,
and the store holds the expected requests (regenerate 1: no resend, one attempt under turn 1; regenerate 0: the
agent resent turn 1), so a broken setup can't pass as a fast one.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repo's tests/ helpers
import procstat  # noqa: E402

from tests.e2e.agents import AGENTS, BIN, GREETING, PROMPT, STARTERS, Sandbox  # noqa: E402
from tests.support.procs import start_mock, start_proxy  # noqa: E402

MODES = ("1", "0")  # --regenerate values
MAX_RUNS = 5  # per agent per mode: the machine is shared, a bounded measurement
TIMEOUT = 90.0
QUIET = 0.25  # cores other processes may use for the machine to count as quiet (--wait-quiet)


@dataclass
class Run:
    agent: str
    mode: str
    seconds: float  # the agent process, start to exit
    turn1: float  # first turn-1 request started → turn 2's request started (from the captures)
    client_requests: int  # tool-carrying requests the agent sent
    upstream_requests: int  # every exchange tapfix sent upstream for them (attempts included)
    others: float  # cores the processes outside this run kept busy meanwhile (Others, a lower bound)


class Others:
    """CPU of the processes outside this benchmark's own sessions, sampled from /proc every 0.2 s: the
    noise a run had. A lower bound: a process that starts and ends between two samples is missed (the
    bench's own processes each run in a session of their own, so helpers an agent leaves behind are
    still ours)."""

    def __init__(self) -> None:
        self.ours: set[int] = {os.getsid(0)}
        self._start: dict[tuple[int, int], int] = {}  # (pid, starttime) -> ticks when first seen
        self._last: dict[tuple[int, int], int] = {}
        self._boot_ticks = self._uptime_ticks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _uptime_ticks() -> int:
        with open("/proc/uptime") as f:
            return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK"))

    def _sample(self) -> None:
        for pid, fields in procstat.processes():
            if int(fields[3]) in self.ours:
                continue
            key, ticks = (pid, int(fields[19])), int(fields[11]) + int(fields[12])
            # A process started after the sampler did counts from zero; an older one from its first sample.
            self._start.setdefault(key, 0 if key[1] >= self._boot_ticks else ticks)
            self._last[key] = ticks

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def ns(self) -> int:
        return sum(self._last[k] - self._start[k] for k in self._last) * procstat.TICK_NS

    def __enter__(self) -> Others:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sample()


def _turn_rows(db: Path) -> tuple[list[tuple[str, int]], int]:
    """(started_at, request body hash) of the tool-carrying client requests, oldest first, and the number
    of attempts under them."""
    from tapfix.proxy.store.sqlite.database import open_for_reading
    from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

    conn = open_for_reading(db)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute("select id, started_at, attempt_of from exchanges order by ts, id").fetchall()
        out, attempts = [], 0
        for row in rows:
            body = capture_body(conn, load_capture(conn, row["id"]), "request")
            if b'"tools"' not in body:
                continue  # opencode's title request
            if row["attempt_of"] is None:
                out.append((row["started_at"], hash(body)))
            else:
                attempts += 1
        return out, attempts
    finally:
        conn.close()


def one_run(agent: str, mode: str, scenario: str, root: Path, others: Others) -> Run:
    work = Path(tempfile.mkdtemp(prefix=f"{agent}-r{mode}-", dir=root))
    mock = start_mock(work, "--scenario", scenario)
    others.ours.add(mock.proc.pid)
    proxy = None
    try:
        proxy = start_proxy(work, mock.url, "--regenerate", mode, db=work / "captures.db")
        others.ours.add(proxy.proc.pid)
        noise0 = others.ns()
        started = STARTERS[agent](Sandbox(work, agent), f"{proxy.url}/v1", PROMPT)
        others.ours.add(started.proc.pid)
        run = started.wait(TIMEOUT)
        noise = (others.ns() - noise0) / 1e9 / run.seconds
        proxy.stop()  # the writer commits everything before the store is read
        problem = None
        if run.timed_out or run.returncode != 0:
            problem = f"exit {run.returncode}, timed out {run.timed_out}"
        elif not run.file("hello.txt").exists() or run.file("hello.txt").read_text() != GREETING:
            problem = "hello.txt missing or wrong"
        turns, attempts = _turn_rows(proxy.extra["db"])
        if problem is None:
            resent = len(turns) - len({h for _, h in turns})
            # --regenerate 1: the agent resends nothing, tapfix made the attempts; 0: the other way round.
            if not ((resent == 0 and attempts > 0) if mode == "1" else (resent > 0 and attempts == 0)):
                problem = f"{resent} turns resent by the agent and {attempts} attempts by tapfix"
        if problem:
            raise SystemExit(f"{agent} --regenerate {mode}: {problem}\n{run.describe()}\n{proxy.log()[-2000:]}")
        stamps = [datetime.fromisoformat(s).timestamp() for s, _ in turns]
        return Run(agent, mode, run.seconds, stamps[-1] - stamps[0], len(turns), len(turns) + attempts, noise)
    finally:
        if proxy is not None:
            proxy.stop()
        mock.stop()


def table(runs: list[Run], agents: list[str]) -> str:
    head = ["agent", "--regenerate", "runs", "whole run median (min-max) s", "turn 1 median (min-max) s"]
    head += ["requests agent/upstream", "others, cores"]
    lines = [head]

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    for agent in agents:
        whole, turn1 = {}, {}
        for mode in MODES:
            mine = [r for r in runs if r.agent == agent and r.mode == mode]
            whole[mode] = statistics.median(r.seconds for r in mine)
            turn1[mode] = statistics.median(r.turn1 for r in mine)
            counts = sorted({f"{r.client_requests}/{r.upstream_requests}" for r in mine})
            noise = [r.others for r in mine]
            lines.append(
                [
                    agent,
                    mode,
                    str(len(mine)),
                    spread([r.seconds for r in mine]),
                    spread([r.turn1 for r in mine]),
                    ", ".join(counts),
                    f"{min(noise):.2f}-{max(noise):.2f}",
                ]
            )
        lines.append(
            [
                agent,
                "0 vs 1",
                "",
                f"{whole['0'] / whole['1']:.2f}x, {whole['0'] - whole['1']:+.2f} s",
                f"{turn1['0'] / turn1['1']:.2f}x, {turn1['0'] - turn1['1']:+.2f} s",
                "",
                "",
            ]
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=MAX_RUNS, help=f"runs per agent per mode (1-{MAX_RUNS})")
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--scenario", default="break_args_first_attempt", help="a `tapfix mock --scenario`")
    parser.add_argument(
        "--wait-quiet", type=float, default=0, metavar="SECONDS", help="first wait up to this long for a quiet machine"
    )
    args = parser.parse_args()
    if not 1 <= args.runs <= MAX_RUNS:
        parser.error(f"--runs must be 1..{MAX_RUNS}")
    agents = [a for a in args.agents.split(",") if a]
    if not all((BIN / a).exists() for a in agents):
        raise SystemExit(f"agents not installed in {BIN}: run scripts/install-agents")

    runs: list[Run] = []
    with Others() as others, tempfile.TemporaryDirectory(prefix="tapfix-agents-bench-") as tmp:
        quiet = _quiet(others, 3.0)
        deadline = time.monotonic() + args.wait_quiet
        while quiet > QUIET and time.monotonic() < deadline:
            print(f"  others use {quiet:.2f} cores; waiting for < {QUIET}", file=sys.stderr)
            quiet = _quiet(others, 3.0)
        t0, noise0 = time.monotonic(), others.ns()
        for i in range(args.runs):
            for agent in agents:
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    run = one_run(agent, mode, args.scenario, Path(tmp), others)
                    runs.append(run)
                    print(
                        f"  {agent} --regenerate {mode}: {run.seconds:.2f} s, others {run.others:.2f}", file=sys.stderr
                    )
        elapsed = time.monotonic() - t0
        noise = (others.ns() - noise0) / 1e9 / elapsed
    print(table(runs, agents))
    print(
        f"\nscenario {args.scenario}, {args.runs} runs per agent per mode, {elapsed:.0f} s in all; nproc "
        f"{os.cpu_count()}; other processes kept {quiet:.2f} cores busy in the 3 s before and {noise:.2f} "
        f"during the runs (sampled from /proc, a lower bound)"
    )


def _quiet(others: Others, seconds: float) -> float:
    """Cores other processes keep busy while this one sleeps."""
    before = others.ns()
    time.sleep(seconds)
    return (others.ns() - before) / 1e9 / seconds


if __name__ == "__main__":
    main()
