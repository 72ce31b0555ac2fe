"""The tier guard (tests/support/e2e_guard.py): in tests/unit no process and no network socket, in tests/inproc
no process, in tests/process anything; an outside program's marker puts a test in the process tier; a file
outside the tier folders keeps the e2e-marker rule (an unmarked test that starts a process or listens fails).

Runs pytest in-process on small modules with the guard loaded, as tests/conftest.py loads it.
"""

from __future__ import annotations

import pytest

MODULE = """
import asyncio
import os
import socket
import subprocess
import threading

import pytest


def test_process():
    subprocess.run(["true"], check=True)


def test_process_caught():
    try:
        subprocess.run(["true"], check=True)
    except Exception:
        pass


def test_os_system():
    os.system("true")


def test_asyncio_subprocess():
    async def main():
        proc = await asyncio.create_subprocess_exec("true")
        await proc.wait()
    asyncio.run(main())


def test_listen():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()


def test_bind_fixed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 1))


def test_server_thread():
    def serve():
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                s.listen()
        except Exception:
            pass
    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()


@pytest.fixture
def spawned():
    subprocess.run(["true"], check=True)


def test_fixture_process(spawned):
    pass


def test_in_process_is_fine(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # how free_port asks for a port
    a, b = socket.socketpair()
    a.close(), b.close()
    asyncio.run(asyncio.sleep(0))  # an event loop's self-pipe
    (tmp_path / "x").write_text("x")


@pytest.mark.e2e
def test_marked_process():
    subprocess.run(["true"], check=True)


@pytest.mark.e2e
def test_marked_listen():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
"""

MARKED_MODULE = """
import subprocess

import pytest

pytestmark = pytest.mark.e2e


def test_module_marked():
    subprocess.run(["true"], check=True)
"""

FAILING = [
    "test_process",
    "test_process_caught",
    "test_os_system",
    "test_asyncio_subprocess",
    "test_listen",
    "test_bind_fixed_port",
    "test_server_thread",
]


@pytest.fixture
def outcome(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeini("[pytest]\nmarkers =\n    e2e: starts processes\naddopts = --strict-markers -p no:cacheprovider\n")
    pytester.makepyfile(test_guarded=MODULE, test_marked_module=MARKED_MODULE)
    return pytester.runpytest("-p", "tests.support.e2e_guard", "-rfE")


def test_unmarked_tests_that_start_a_process_or_listen_fail_with_the_rule(outcome: pytest.RunResult) -> None:
    outcome.assert_outcomes(passed=4, failed=len(FAILING), errors=1)
    failed = {line.split("::")[1].split(" ")[0] for line in outcome.outlines if line.startswith("FAILED ")}
    assert failed == set(FAILING), outcome.stdout.str()
    text = outcome.stdout.str()
    assert "ERROR test_guarded.py::test_fixture_process" in text  # a fixture that starts one fails at setup
    assert "test_process starts a process ['true'] without the e2e marker" in text
    assert "test_listen listens on a socket without the e2e marker" in text
    assert "test_bind_fixed_port binds a socket to port 1 without the e2e marker" in text
    assert "a test that starts a process or listens carries the e2e marker" in text


def test_marked_and_in_process_tests_pass(outcome: pytest.RunResult) -> None:
    assert outcome.parseoutcomes().get("passed") == 4, outcome.stdout.str()
    for name in ("test_in_process_is_fine", "test_marked_process", "test_marked_listen", "test_module_marked"):
        assert f"FAILED test_guarded.py::{name}" not in outcome.stdout.str()
        assert f"FAILED test_marked_module.py::{name}" not in outcome.stdout.str()


UNIT = """
import asyncio
import socket
import subprocess

import pytest


def test_connects():
    socket.create_connection(("127.0.0.1", 9))


def test_binds_port_0():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))


def test_process():
    subprocess.run(["true"], check=True)


def test_pure(tmp_path):
    a, b = socket.socketpair()
    a.close(), b.close()
    asyncio.run(asyncio.sleep(0))  # an event loop's self-pipe
    (tmp_path / "x").write_text("x")


@pytest.mark.postgres
def test_outside_program():
    subprocess.run(["true"], check=True)


@pytest.mark.e2e
def test_e2e_marker_in_a_tier_folder():
    pass
"""

INPROC = """
import socket
import subprocess


def test_listens_on_port_0():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()


def test_process():
    subprocess.run(["true"], check=True)
"""

PROCESS = """
import subprocess


def test_process():
    subprocess.run(["true"], check=True)
"""


@pytest.fixture
def tiers(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeini(
        "[pytest]\nmarkers =\n    e2e: starts processes\n    postgres: a server\n"
        "addopts = --strict-markers -p no:cacheprovider\n"
    )
    for folder, module in (("unit", UNIT), ("inproc", INPROC), ("process", PROCESS)):
        path = pytester.path / "tests" / folder / f"test_{folder}_tier.py"
        path.parent.mkdir(parents=True)
        path.write_text(module)
    return pytester.runpytest("-p", "tests.support.e2e_guard", "-rfE", "tests")


def test_each_tier_fails_what_it_rules_out(tiers: pytest.RunResult) -> None:
    text = tiers.stdout.str()
    failed = {line.split(" ")[1].split(" ")[0] for line in tiers.outlines if line.startswith(("FAILED ", "ERROR "))}
    assert failed == {
        "tests/unit/test_unit_tier.py::test_connects",
        "tests/unit/test_unit_tier.py::test_binds_port_0",
        "tests/unit/test_unit_tier.py::test_process",
        "tests/unit/test_unit_tier.py::test_e2e_marker_in_a_tier_folder",
        "tests/inproc/test_inproc_tier.py::test_process",
    }, text
    assert "test_connects opens a network socket in the unit tier" in text
    assert "test_inproc_tier.py::test_process starts a process ['true'] in the inproc tier" in text
    assert "carries the e2e marker in a tier folder" in text
    tiers.assert_outcomes(passed=4, failed=4, errors=1)


def test_the_tier_is_a_marker_and_the_quick_set_is_not_process(
    pytester: pytest.Pytester, tiers: pytest.RunResult
) -> None:
    quick = pytester.runpytest("-p", "tests.support.e2e_guard", "-m", "not process", "--co", "-q", "tests")
    ids = {line for line in quick.outlines if "::" in line}
    assert "tests/unit/test_unit_tier.py::test_outside_program" not in ids  # postgres: the process tier
    assert "tests/process/test_process_tier.py::test_process" not in ids
    assert "tests/inproc/test_inproc_tier.py::test_listens_on_port_0" in ids
    assert "tests/unit/test_unit_tier.py::test_pure" in ids
