"""Wall time of a whole agent run when turn 1's tool call is broken: `tapfix run --regenerate 1` (tapfix asks
the upstream again inside the agent's request) against `--regenerate 0` (the error event goes to the agent,
which resends the turn on its own schedule: opencode after about 2 s, omp after about 0.5 s).

Wall time, not CPU, because what the user waits for is the point here. So the numbers only mean something
side by side in one run: the modes alternate (rotated per round), each run gets its own mock, proxy,
capture store and agent HOME, and the noise line says how much CPU other processes took meanwhile.

    .venv/bin/python bench/agents_regenerate.py --runs 5 [--agents opencode,omp] [--scenario NAME]

Needs the pinned agents (scripts/install-agents). Every run is checked: exit 0, hello.txt holds the greeting,
and the store holds the expected requests (regenerate 1: no resend, one attempt under turn 1; regenerate 0: the
agent resent turn 1), so a broken setup can't pass as a fast one.
"""

from __future__ import annotations

import argparse
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repo's tests/ helpers
import procstat  # noqa: E402

from tests.e2e.agents import AGENTS, BIN, GREETING, PROMPT, Sandbox, run_agent  # noqa: E402
from tests.support.procs import start_mock, start_proxy  # noqa: E402

MODES = ("1", "0")  # --regenerate values
MAX_RUNS = 5  # per agent per mode: the machine is shared, a bounded measurement
TIMEOUT = 90.0


@dataclass
class Run:
    agent: str
    mode: str
    seconds: float  # the agent process, start to exit
    turn1: float  # first turn-1 request started → turn 2's request started (from the captures)
    client_requests: int  # tool-carrying requests the agent sent
    upstream_requests: int  # every exchange tapfix sent upstream for them (attempts included)


def _turn_rows(db: Path) -> tuple[list[tuple[str, int]], int]:
    """(started_at, request body hash) of the tool-carrying client requests, oldest first, and the number
    of attempts under them."""
    from tapfix.proxy.store.reader import capture_body, load_capture
    from tapfix.proxy.store.writer import open_for_reading

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


def one_run(agent: str, mode: str, scenario: str, root: Path) -> Run:
    work = Path(tempfile.mkdtemp(prefix=f"{agent}-r{mode}-", dir=root))
    mock = start_mock(work, "--scenario", scenario)
    proxy = None
    try:
        proxy = start_proxy(work, mock.url, "--regenerate", mode, db=work / "captures.db")
        run = run_agent(agent, Sandbox(work, agent), f"{proxy.url}/v1", PROMPT, timeout=TIMEOUT)
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
        return Run(agent, mode, run.seconds, stamps[-1] - stamps[0], len(turns), len(turns) + attempts)
    finally:
        if proxy is not None:
            proxy.stop()
        mock.stop()


def table(runs: list[Run], agents: list[str]) -> str:
    head = ["agent", "--regenerate", "runs", "median s", "min s", "max s", "turn 1 median s", "requests agent/upstream"]
    lines = [head]
    for agent in agents:
        medians = {}
        for mode in MODES:
            mine = [r for r in runs if r.agent == agent and r.mode == mode]
            secs = [r.seconds for r in mine]
            medians[mode] = statistics.median(secs)
            counts = sorted({f"{r.client_requests}/{r.upstream_requests}" for r in mine})
            lines.append(
                [
                    agent,
                    mode,
                    str(len(mine)),
                    f"{medians[mode]:.2f}",
                    f"{min(secs):.2f}",
                    f"{max(secs):.2f}",
                    f"{statistics.median(r.turn1 for r in mine):.2f}",
                    ", ".join(counts),
                ]
            )
        ratio = medians["0"] / medians["1"]
        saved = medians["0"] - medians["1"]
        lines.append([agent, "ratio 0/1", "", f"{ratio:.2f}x", "", "", f"saved {saved:.2f} s", ""])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=MAX_RUNS, help=f"runs per agent per mode (1-{MAX_RUNS})")
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--scenario", default="break_args_first_attempt", help="a `tapfix mock --scenario`")
    args = parser.parse_args()
    if not 1 <= args.runs <= MAX_RUNS:
        parser.error(f"--runs must be 1..{MAX_RUNS}")
    agents = [a for a in args.agents.split(",") if a]
    if not all((BIN / a).exists() for a in agents):
        raise SystemExit(f"agents not installed in {BIN}: run scripts/install-agents")

    quiet = _others_before()
    busy0, ours0, t0 = procstat.machine_busy_ns(), _our_cpu_ns(), time.monotonic()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="tapfix-agents-bench-") as tmp:
        for i in range(args.runs):
            for agent in agents:
                for mode in MODES if i % 2 == 0 else MODES[::-1]:
                    run = one_run(agent, mode, args.scenario, Path(tmp))
                    runs.append(run)
                    print(f"  {agent} --regenerate {mode}: {run.seconds:.2f} s", file=sys.stderr)
    elapsed = time.monotonic() - t0
    others = procstat.machine_busy_ns() - busy0 - (_our_cpu_ns() - ours0)
    print(table(runs, agents))
    print(
        f"\nscenario {args.scenario}, {args.runs} runs per agent per mode, {elapsed:.0f} s in all; nproc "
        f"{os.cpu_count()}; other processes used {quiet:.2f} of the cores in the 3 s before, and at most "
        f"{others / 1e9 / elapsed:.2f} during the runs (an upper bound: the agents' helper processes, killed "
        f"with their group, are counted there too)"
    )


def _others_before(seconds: float = 3.0) -> float:
    """Cores other processes keep busy while this one sleeps: how quiet the machine is to start with."""
    busy, ours = procstat.machine_busy_ns(), _our_cpu_ns()
    time.sleep(seconds)
    return (procstat.machine_busy_ns() - busy - (_our_cpu_ns() - ours)) / 1e9 / seconds


def _our_cpu_ns() -> int:
    """This process and every child it waited for (mock, proxy, agent leaders and what they waited for)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime) * 1e9)


if __name__ == "__main__":
    main()
