from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.support import early_build
from tests.support.ci import unavailable
from tests.support.depth import examples
from tests.support.postgres import PostgresServer, missing_reason, start_postgres
from tests.support.procs import STARTED, start_mock, start_proxy

# pytester: tests/process/test_structure_e2e_guard.py runs pytest on small modules to prove the guard works.
# e2e_guard: a test that starts a process or listens on a socket must carry the e2e marker.
pytest_plugins = ["pytester", "tests.support.e2e_guard", "tests.support.process_count"]

# CI runs the same examples every time (a red CI is then reproducible, never a dice roll); local runs
# explore new ones, and hypothesis keeps what it finds in .hypothesis/.
# No deadline: a property test checks what is computed, and time is the benchmark's (bench/); on a shared 2-core
# machine a starved worker took 300 ms over hypothesis' default 200 ms deadline on a 0.2 ms example.
# A test without an example count of its own runs hypothesis' 100 at the depth tests/support/depth.py reads.
settings.register_profile("local", deadline=None, max_examples=examples(100))
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None, max_examples=examples(100))
settings.load_profile("ci" if os.environ.get("CI") else "local")

ROOT = Path(__file__).resolve().parent.parent
LOG_TAIL = 3000  # characters of each process's log a failing test shows
_FIRST_PROC = pytest.StashKey[tuple[int, int]]()
_EARLY_BUILD = pytest.StashKey[list[subprocess.Popen]]()


def pytest_configure(config: pytest.Config) -> None:
    # Started in the background (`.ci/run &`, nohup), this process inherits SIGINT ignored, and so would every
    # tapfix process a test starts: a `captures tail` then ignores the Ctrl-C its tests send, as it should
    # under nohup. Handled here, SIGINT is back at its default in each child (exec resets a handled signal),
    # as a terminal's Ctrl-C finds it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.stash[_EARLY_BUILD] = early_build.start(config)
    # The SDKs name the platform in their headers, and Python learns the processor by running `uname -p`
    # once: here, before any test, so no in-process test starts it (tests/support/e2e_guard.py).
    platform.processor()


def pytest_unconfigure(config: pytest.Config) -> None:
    early_build.stop(config.stash.get(_EARLY_BUILD, []))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The vLLM tests first and the llama.cpp ones last (tests/support/early_build.py `order`: a cold
    machine builds llama-server meanwhile)."""
    items.sort(key=lambda item: early_build.order(Path(str(item.path))))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with every file of tests/process/vllm/ in one unit, so one worker runs them all and its
    session fixtures start each vLLM server once per run (each worker would start its own).

    The files go out slowest tier first once the early builds are done (a warm cache: at once): xdist hands
    them out by test count, most first, which left the process tier's one-test files (a wheel build, a
    PostgreSQL fill, an agent) for last, each queued behind the other on one worker while the other had
    nothing left. The unit tier's small files now end the run. While a build still runs (a cold cache), xdist's
    order stays: the engine suites' tests wait for their build where they come."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    vllm = early_build.VLLM.relative_to(config.rootpath).as_posix() + "/"

    class VllmTogether(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return vllm if nodeid.startswith(vllm) else super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first assignment: the work queue is complete
                self.ordered = True
                if early_build.done(config.stash.get(_EARLY_BUILD, [])):
                    units = sorted(self.workqueue.items(), key=lambda unit: early_build.tier_rank(unit[0]))
                    self.workqueue.clear()
                    self.workqueue.update(units)
            super()._assign_work_unit(node)

    return VllmTogether(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_FIRST_PROC] = (len(STARTED), len(_inproc_started()))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failing test shows the logs of the tapfix processes (and in-process proxies and mocks) it ran beside:
    the ones it started and the module's that still run. On CI those logs are gone once the run ends."""
    report = yield
    if report.failed:
        first, first_inproc = item.stash.get(_FIRST_PROC, (len(STARTED), len(_inproc_started())))
        for k, proc in enumerate(STARTED):
            if (k >= first or proc.proc.poll() is None) and proc.log_path.exists():
                text = proc.log_path.read_text(errors="replace")
                report.sections.append((f"log {proc.log_path.name} (exit {proc.proc.poll()})", text[-LOG_TAIL:]))
        for k, handle in enumerate(_inproc_started()):
            if (k >= first_inproc or handle.alive()) and handle.log():
                report.sections.append((f"log {handle.log_path.name} (in-process)", handle.log()[-LOG_TAIL:]))
    return report


def _inproc_started() -> list:
    """tests/support/inproc.py's handles, if a test imported it (it imports mitmproxy: a unit run need not)."""
    module = sys.modules.get("tests.support.inproc")
    return module.STARTED if module is not None else []


def corpus_dir() -> Path:
    """The shared corpus when present (CI has ../shared), else the project's copy."""
    shared = ROOT.parent / "shared" / "corpus" / "toolcalls"
    return shared if shared.is_dir() else ROOT / "tests" / "corpus" / "toolcalls"


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def mock(module_tmp):
    proc = start_mock(module_tmp)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def proxy(module_tmp, mock):
    proc = start_proxy(module_tmp, mock.url)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the whole run (tests/support/postgres.py), stopped at the end.
    Tests that use it carry the `postgres` and `e2e` markers; each makes its own database
    (`postgres.create_database(name)`) when it needs an empty one."""
    yield from _postgres_server()


@pytest.fixture(scope="session")
def postgres_to_restart() -> Iterator[PostgresServer]:
    """A second server, for the tests that stop and start it (outages, restarts: `down`, `up`,
    `restart`), so `postgres` is never disturbed. A test leaves it running."""
    yield from _postgres_server()


def _postgres_server() -> Iterator[PostgresServer]:
    reason = missing_reason()
    if reason:
        unavailable(f"{reason}; .ci/run installs it")
    server = start_postgres()
    yield server
    server.stop()
