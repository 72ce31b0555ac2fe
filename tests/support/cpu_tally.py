"""Counts the CPU (user + system) each test module costs, and each tier, and prints the table at the end.

Off by default: `-p tests.support.cpu_tally` turns it on (`scripts/test --quick -p tests.support.cpu_tally`).
Wall-clock time says little on a shared machine; the CPU a module burns is what the run costs whoever runs it.

A test's CPU is the test process's CPU (every thread: an in-process proxy's and mock's count too) from the
start of its setup to the end of its teardown, so a module's fixtures are charged to the module; the processes
a test starts are counted as they are reaped (RUSAGE_CHILDREN), charged to the test that was running then.
What no test owns (imports, collection, the session's fixtures) is "outside tests". Under pytest-xdist each
worker counts its own and hands it to the controller. `TAPFIX_CPU_TALLY=PATH` also writes it all as JSON.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_KEY = "tapfix_cpu_tally"
_tests: dict[str, list[float]] = {}  # nodeid -> [own cpu, children's cpu, wall]
_tiers: dict[str, str] = {}  # nodeid -> tier
_timeline: dict[str, list[Any]] = {}  # nodeid -> [worker, start (epoch seconds), end]: where a run's wall time went
_session: list[float] = []  # each process's whole CPU, own and children's
SHOWN_MODULES = 40
SHOWN_TESTS = 30


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    own0, kids0 = _cpu()
    wall0, start = time.monotonic(), time.time()
    try:
        return (yield)
    finally:
        own1, kids1 = _cpu()
        _tests[item.nodeid] = [own1 - own0, kids1 - kids0, time.monotonic() - wall0]
        _tiers[item.nodeid] = _tier(item)
        _timeline[item.nodeid] = [os.environ.get("PYTEST_XDIST_WORKER", "main"), start, time.time()]


def _tier(item: pytest.Item) -> str:
    # imported here: `-p` loads this module before conftest.py registers process_count for assertion rewriting
    from tests.support.process_count import item_tier

    return item_tier(item)


def pytest_sessionfinish(session: pytest.Session) -> None:
    own, kids = _cpu()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_KEY] = json.dumps(
            {"tests": _tests, "tiers": _tiers, "timeline": _timeline, "session": [own, kids]}
        )
    elif not _session:  # plain pytest: the session's process and what it reaped
        _session.extend([own, kids])
    else:  # xdist's controller: its children are the workers, counted by themselves
        _session.append(own)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    raw = getattr(node, "workeroutput", {}).get(_KEY)
    if raw:
        data = json.loads(raw)
        _tests.update(data["tests"])
        _tiers.update(data["tiers"])
        _timeline.update(data["timeline"])
        _session.extend(data["session"])


def totals() -> dict[str, Any]:
    modules: Counter[str] = Counter()
    module_wall: Counter[str] = Counter()
    tiers: Counter[str] = Counter()
    for nodeid, (own, kids, wall) in _tests.items():
        module = nodeid.split("::", 1)[0]
        modules[module] += own + kids
        module_wall[module] += wall
        tiers[_tiers[nodeid]] += own + kids
    whole = sum(_session)
    return {
        "cpu_s": round(whole, 1),
        "in_tests_s": round(sum(tiers.values()), 1),
        "by_tier": {t: round(s, 1) for t, s in sorted(tiers.items())},
        "by_module": {m: [round(s, 2), round(module_wall[m], 2)] for m, s in modules.most_common()},
        "by_test": {n: [round(v, 3) for v in t] for n, t in sorted(_tests.items(), key=lambda kv: -sum(kv[1][:2]))},
        "timeline": dict(sorted(_timeline.items(), key=lambda kv: kv[1][1])),
    }


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is not None or not _tests:
        return
    t = totals()
    write = terminalreporter.write_line
    terminalreporter.section("cpu (user + system, seconds)")
    tiers = ", ".join(f"{k} {v}" for k, v in t["by_tier"].items())
    write(f"{t['cpu_s']} s in all, {t['in_tests_s']} s in tests; by tier: {tiers}")
    for module, (cpu, wall) in list(t["by_module"].items())[:SHOWN_MODULES]:
        write(f"{cpu:8.1f} cpu {wall:8.1f} wall  {module}")
    write("slowest tests by cpu:")
    for nodeid, (own, kids, wall) in list(t["by_test"].items())[:SHOWN_TESTS]:
        write(f"{own + kids:8.2f} cpu {wall:8.2f} wall  {nodeid}")
    out = os.environ.get("TAPFIX_CPU_TALLY")
    if out:
        Path(out).write_text(json.dumps(t, indent=1) + "\n")
