"""The tier guard, a pytest plugin (tests/conftest.py loads it): each test runs in one of three tiers, and
the guard fails a test that does what its tier rules out, so `scripts/test --quick` really starts nothing.

- `tests/unit/`: pure functions. No process, no network socket (AF_INET/AF_INET6: no connection, no
  listener, not even on port 0). `socket.socketpair` stays allowed (an event loop's self-pipe).
- `tests/inproc/`: the real proxy, the mock and their clients inside the test process (tests/support/inproc.py).
  No process. (Sockets are theirs: they listen on port 0, which mitmproxy turns into a port free on every
  interface for TCP and UDP by binding it; traffic goes to loopback, as everywhere in the suite.)
- `tests/process/`: what only a real process proves. Anything goes.

A test that carries `postgres`, `realengine`, `vllm`, `agents` or `browser` runs an outside program (the
marker says which): it is in the process tier wherever its file lives (a backend parametrization keeps its
PostgreSQL variant beside the SQLite one). Every test gets its tier as a marker (`unit`, `inproc`, `process`),
set here, never written by hand: `-m "not process"` is the quick set.

A file outside the tier folders (the top of tests/, tests/cli, tests/e2e: until they move) keeps the
e2e-marker rule: a test that starts a process or listens must carry `e2e` (its tier is then `process`);
one that does not carry it may neither (its tier is `unit`, without the socket rule). In a tier folder the
folder says it all: an `e2e` marker there is an error.

What counts as starting a process: `subprocess.Popen` (and with it `subprocess.run`, asyncio's subprocesses,
`os.popen`), `os.fork`, `os.forkpty`, `os.posix_spawn[p]`, `os.system`, multiprocessing's spawn. A violation
in another thread (a server thread, say) fails the test too: it is recorded and reported when the phase ends.

The guard is re-entrant: a test that runs pytest in-process (`pytester.runpytest`) guards the inner run's
tests by their own tiers, not by the outer test's.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TIERS = ("unit", "inproc", "process")
OUTSIDE_PROGRAMS = ("postgres", "realengine", "vllm", "agents", "browser")  # each marker: process tier
LEGACY = "legacy"  # a file outside the tier folders, unmarked: the e2e-marker rule
RULE = (
    "tests/unit: no process, no network socket; tests/inproc: no process; "
    "tests/process: anything (a file outside these folders: a test that starts a process or listens carries "
    "the e2e marker); see tests/support/e2e_guard.py"
)
# What each tier rules out (the process tier: nothing).
FORBIDDEN: dict[str, frozenset[str]] = {
    "unit": frozenset({"process", "network socket"}),
    "inproc": frozenset({"process"}),
    LEGACY: frozenset({"process", "listen", "fixed port"}),
    "process": frozenset(),
}


class UnmarkedE2E(Exception):
    """Raised where a test does what its tier rules out (not an OSError, so no retry loop swallows it)."""


@dataclass
class _Phase:
    nodeid: str
    tier: str
    violations: list[str] = field(default_factory=list)


_phases: list[_Phase] = []
_INHERITED = object()  # the patched name was the base class's (socket.socket.listen is _socket.socket's)
_saved: dict[tuple[object, str], Any] = {}
_installs = 0
_TIER = pytest.StashKey[str]()


def tier_of(item: pytest.Item) -> str:
    """The item's tier: an outside program's marker, else its folder, else (legacy) its e2e marker."""
    if any(item.get_closest_marker(name) for name in OUTSIDE_PROGRAMS):
        return "process"
    folder = _tier_folder(Path(str(item.path)), item.config.rootpath)
    if folder is not None:
        return folder
    return "process" if item.get_closest_marker("e2e") else LEGACY


def _tier_folder(path: Path, root: Path) -> str | None:
    try:
        parts = path.resolve().relative_to(root.resolve()).parts
    except ValueError:
        return None
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else None


def _check(kind: str, what: str) -> None:
    if not _phases:
        return
    phase = _phases[-1]
    if kind in FORBIDDEN[phase.tier]:
        where = "without the e2e marker" if phase.tier == LEGACY else f"in the {phase.tier} tier"
        message = f"{phase.nodeid} {what} {where}: {RULE}"
        phase.violations.append(message)
        raise UnmarkedE2E(message)


def _wrap(owner: object, name: str, describe: Callable[..., tuple[str, str] | None]) -> None:
    original = getattr(owner, name)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        found = describe(*args, **kwargs)
        if found is not None:
            _check(*found)
        return original(*args, **kwargs)

    _saved[(owner, name)] = vars(owner).get(name, _INHERITED) if isinstance(owner, type) else original
    setattr(owner, name, guarded)


def _bind(sock: socket.socket, address: Any, *_: Any) -> tuple[str, str] | None:
    port = address[1] if isinstance(address, tuple) and len(address) >= 2 else 0
    return ("fixed port", f"binds a socket to port {port}") if port else None


def _new_socket(sock: socket.socket, family: Any = -1, type: Any = -1, proto: Any = -1, fileno: Any = None) -> Any:
    if family in (socket.AF_INET, socket.AF_INET6) or (family == -1 and fileno is None):
        return "network socket", "opens a network socket"
    return None


def _install() -> None:
    _wrap(subprocess.Popen, "_execute_child", lambda self, args, *_, **__: ("process", f"starts a process {args!r}"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            _wrap(os, name, lambda *args, _n=name, **_: ("process", f"starts a process (os.{_n})"))
    _wrap(_posixsubprocess, "fork_exec", lambda *_, **__: ("process", "starts a process (_posixsubprocess.fork_exec)"))
    _wrap(socket.socket, "__init__", _new_socket)
    _wrap(socket.socket, "listen", lambda *_: ("listen", "listens on a socket"))
    _wrap(socket.socket, "bind", _bind)


def _uninstall() -> None:
    for (owner, name), original in _saved.items():
        if original is _INHERITED:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _saved.clear()


def pytest_configure(config: pytest.Config) -> None:
    global _installs
    for tier, what in (
        ("unit", "pure: no process, no network socket (set from tests/unit/ by tests/support/e2e_guard.py)"),
        ("inproc", "the proxy and the mock in the test process, no process (set from tests/inproc/)"),
        ("process", "starts processes (set from tests/process/ or an outside program's marker)"),
    ):
        config.addinivalue_line("markers", f"{tier}: {what}")
    if _installs == 0:
        _install()
    _installs += 1


def pytest_unconfigure(config: pytest.Config) -> None:
    global _installs
    _installs -= 1
    if _installs == 0:
        _uninstall()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.stash[_TIER] = tier_of(item)
        if tier != LEGACY:
            item.add_marker(tier)


def _guard(item: pytest.Item) -> Generator[None, None, None]:
    phase = _Phase(item.nodeid, item.stash.get(_TIER, None) or tier_of(item))
    _phases.append(phase)
    try:
        yield
    except BaseException:
        if not phase.violations:
            raise
    finally:
        _phases.remove(phase)
    if phase.violations:  # reported even when the test caught the error, or failed of its effect elsewhere
        pytest.fail("\n".join(dict.fromkeys(phase.violations)), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    if item.get_closest_marker("e2e") and _tier_folder(Path(str(item.path)), item.config.rootpath):
        pytest.fail(f"{item.nodeid} carries the e2e marker in a tier folder, which says its tier: {RULE}", False)
    return (yield from _guard(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guard(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    return (yield from _guard(item))
