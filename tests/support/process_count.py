"""Counts the processes the suite starts, by tier and by program, and prints the count at the end of every run.

What the test processes start themselves is counted (`subprocess`, and asyncio's subprocesses through it);
what those processes start in turn (an agent's tools, a script's commands) is not.

A process start is what costs this suite its time (a tapfix start is 0.8-2 s of CPU), so the count is
kept in plain sight: `tapfix run` / `mock` / `captures` … by subcommand, everything else by program name.
A start is charged to the tier of the test running when it began (unit, inproc, process: the guard's, so a
PostgreSQL variant in tests/unit counts as process; a file not yet in a tier folder is charged to its folder,
"tests" for the top), and to "session" when no test runs (the early build, xdist's workers).

Under pytest-xdist each worker counts its own starts and hands them to the controller, which sums them.
`TAPFIX_PROCESS_COUNT=PATH` also writes the totals there as JSON (for a closing note, or a comparison).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_KEY = "tapfix_process_count"
_counts: Counter[tuple[str, str]] = Counter()  # (tier, program) -> starts
_current: list[str] = []  # the tier of the test in progress (a stack: pytester nests runs)
_original: Any = None
TESTS = Path(__file__).resolve().parent.parent


def program(args: Any) -> str:
    """What a start is called in the count: `tapfix SUBCOMMAND`, `python -m MODULE`, or the program's name.
    Only the program (and a Python's -m module) says what runs: `runuser -u postgres -- createdb tapfix`
    is a runuser, whatever its arguments are called."""
    argv = [os.fsdecode(a) for a in args] if isinstance(args, (list, tuple)) else [os.fsdecode(args)]
    if not argv:
        return "?"
    words = argv if len(argv) > 1 else argv[0].split()
    name = Path(words[0]).name
    if name == "tapfix":
        return _tapfix(words[1:])
    if name.startswith("python") and "-m" in words[1:]:
        at = words.index("-m")
        module = words[at + 1] if at + 1 < len(words) else ""
        if module in ("tapfix.proxy.cli", "tapfix.proxy.cli.__main__"):
            return _tapfix(words[at + 2 :])
        if module.startswith("tapfix.proxy.cli."):  # a command's own module
            return f"tapfix {module.rsplit('.', 1)[1]}"
        return f"python -m {module}".strip()
    return name


def _tapfix(rest: list[str]) -> str:
    sub = next((w for w in rest if not w.startswith("-")), "")
    return f"tapfix {sub}".strip()


def tier_of(path: Path) -> str:
    try:
        rel = path.resolve().relative_to(TESTS)
    except ValueError:
        return "other"
    return rel.parts[0] if len(rel.parts) > 1 else "tests"


def _record(args: Any) -> None:
    _counts[(_current[-1] if _current else "session", program(args))] += 1


def pytest_configure(config: pytest.Config) -> None:
    global _original
    if _original is None:
        _original = subprocess.Popen._execute_child  # type: ignore[attr-defined]

        def counted(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> Any:
            _record(args)
            return _original(self, args, *rest, **kw)

        subprocess.Popen._execute_child = counted  # type: ignore[attr-defined]


def item_tier(item: pytest.Item) -> str:
    """In a tier folder, the tier the guard gives the test (tests/support/e2e_guard.py: a PostgreSQL variant
    in tests/unit is the process tier's); elsewhere its folder, as the baseline was counted."""
    from tests.support.e2e_guard import TIERS
    from tests.support.e2e_guard import tier_of as guard_tier

    folder = tier_of(Path(str(item.path)))
    return guard_tier(item) if folder in TIERS else folder


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    _current.append(item_tier(item))
    try:
        return (yield)
    finally:
        _current.pop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller sums
        workeroutput[_KEY] = json.dumps([[t, p, n] for (t, p), n in _counts.items()])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    raw = getattr(node, "workeroutput", {}).get(_KEY)
    for tier, prog, n in json.loads(raw) if raw else []:
        _counts[(tier, prog)] += n


def totals() -> dict[str, Any]:
    by_tier: Counter[str] = Counter()
    tapfix_by_tier: Counter[str] = Counter()
    for (tier, prog), n in _counts.items():
        by_tier[tier] += n
        if prog.startswith("tapfix"):
            tapfix_by_tier[tier] += n
    by_program: Counter[str] = Counter()
    for (_, prog), n in _counts.items():
        by_program[prog] += n
    return {
        "processes": sum(by_tier.values()),
        "tapfix": sum(tapfix_by_tier.values()),
        "by_tier": dict(sorted(by_tier.items())),
        "tapfix_by_tier": dict(sorted(tapfix_by_tier.items())),
        "by_program": dict(by_program.most_common()),
    }


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is not None:
        return
    t = totals()
    write = terminalreporter.write_line
    terminalreporter.section("processes started")
    write(f"{t['processes']} processes, {t['tapfix']} of them tapfix")
    for tier, n in t["by_tier"].items():
        write(f"  {tier}: {n} ({t['tapfix_by_tier'].get(tier, 0)} tapfix)")
    top = ", ".join(f"{p} {n}" for p, n in list(t["by_program"].items())[:12])
    if top:
        write(f"  by program: {top}")
    out = os.environ.get("TAPFIX_PROCESS_COUNT")
    if out:
        Path(out).write_text(json.dumps(t, indent=2) + "\n")
