"""The e2e-marker guard (tests/support/e2e_guard.py) fails an unmarked test that starts a process or
listens on a socket, and lets a marked one, and everything in-process, through.

Runs pytest in-process on a small module with the guard loaded, as tests/conftest.py loads it.
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
    assert "every test that starts a process or listens on a socket carries the e2e marker" in text


def test_marked_and_in_process_tests_pass(outcome: pytest.RunResult) -> None:
    assert outcome.parseoutcomes().get("passed") == 4, outcome.stdout.str()
    for name in ("test_in_process_is_fine", "test_marked_process", "test_marked_listen", "test_module_marked"):
        assert f"FAILED test_guarded.py::{name}" not in outcome.stdout.str()
        assert f"FAILED test_marked_module.py::{name}" not in outcome.stdout.str()
