"""The e2e-marker guard, a pytest plugin (tests/conftest.py loads it): a test that starts a process or
listens on a socket must carry the `e2e` marker, so `-m "not e2e"` really is the fast, in-process set.

While a test without the marker is set up, run or torn down, starting a process (`subprocess.Popen`,
and with it `subprocess.run`, `asyncio`'s subprocesses and `os.popen`; `os.fork`, `os.forkpty`,
`os.posix_spawn[p]`, `os.system`, multiprocessing's spawn) and listening on or binding a socket to a
non-zero port fail the test. Binding to port 0 (how `free_port` asks for a port) and
`socket.socketpair` (asyncio's self-pipe) stay allowed. A violation in another thread (a server
thread, say) fails the test too: it is recorded and reported when the phase ends.

The guard is re-entrant: a test that runs pytest in-process (`pytester.runpytest`) guards the inner
run's tests by their own markers, not by the outer test's.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

RULE = (
    "every test that starts a process or listens on a socket carries the e2e marker "
    "(@pytest.mark.e2e, or pytestmark = pytest.mark.e2e in the module); see tests/support/e2e_guard.py"
)


class UnmarkedE2E(Exception):
    """Raised where an unmarked test starts a process or listens (not an OSError, so no retry loop
    swallows it)."""


@dataclass
class _Phase:
    nodeid: str
    guarded: bool
    violations: list[str] = field(default_factory=list)


_phases: list[_Phase] = []
_INHERITED = object()  # the patched name was the base class's (socket.socket.listen is _socket.socket's)
_saved: dict[tuple[object, str], Any] = {}
_installs = 0


def _check(what: str) -> None:
    if _phases and _phases[-1].guarded:
        message = f"{_phases[-1].nodeid} {what} without the e2e marker: {RULE}"
        _phases[-1].violations.append(message)
        raise UnmarkedE2E(message)


def _wrap(owner: object, name: str, describe: Callable[..., str | None]) -> None:
    original = getattr(owner, name)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        what = describe(*args, **kwargs)
        if what is not None:
            _check(what)
        return original(*args, **kwargs)

    _saved[(owner, name)] = vars(owner).get(name, _INHERITED) if isinstance(owner, type) else original
    setattr(owner, name, guarded)


def _bind(sock: socket.socket, address: Any, *_: Any) -> str | None:
    port = address[1] if isinstance(address, tuple) and len(address) >= 2 else 0
    return f"binds a socket to port {port}" if port else None


def _install() -> None:
    _wrap(subprocess.Popen, "_execute_child", lambda self, args, *_, **__: f"starts a process {args!r}")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            _wrap(os, name, lambda *args, _n=name, **_: f"starts a process (os.{_n})")
    _wrap(_posixsubprocess, "fork_exec", lambda *_, **__: "starts a process (_posixsubprocess.fork_exec)")
    _wrap(socket.socket, "listen", lambda *_: "listens on a socket")
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
    if _installs == 0:
        _install()
    _installs += 1


def pytest_unconfigure(config: pytest.Config) -> None:
    global _installs
    _installs -= 1
    if _installs == 0:
        _uninstall()


def _guard(item: pytest.Item) -> Generator[None, None, None]:
    phase = _Phase(item.nodeid, item.get_closest_marker("e2e") is None)
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
    return (yield from _guard(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guard(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    return (yield from _guard(item))
