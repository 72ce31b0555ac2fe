"""`tapfix captures tail` against a store a real `tapfix run` (in front of `tapfix mock`) is writing: the
tails start before the store exists and wait for it; lines come in completion order (a slow stream that
arrived first is printed after a fast one), with `list`'s columns and filters, in --json too; a writer
restart repeats nothing; `--since ID|AGE` starts back; SIGINT and a closed stdout end it quietly with 0.

The tails are processes (a signal, a closed pipe, lines read as a process prints them); the writer they
follow, the proxy and its mock, runs in the test process (tests/support/inproc.py), as `captures list` does."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.inproc import InprocMock, InprocProxy, cli, start_mock, start_proxy
from tests.support.procs import TAPFIX

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SCENARIO = {
    "rules": [
        {"when": {"model": "slow"}, "do": "stall", "seconds": 1.5, "after_chunks": 1},
        {"when": {"model": "err"}, "do": "http_error", "status": 500},
    ]
}


@dataclass
class Tail:
    """A `tapfix captures tail` process and the lines it printed, read by a thread as they come."""

    proc: subprocess.Popen[bytes]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    said: list[str] = field(default_factory=list)  # its stderr, line by line, as it comes
    said_reader: threading.Thread | None = None

    @classmethod
    def start(cls, db: Path, *args: str) -> Tail:
        proc = subprocess.Popen(
            [*TAPFIX, "captures", "tail", "--db", str(db), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        tail = cls(proc)
        threading.Thread(target=tail._read, daemon=True).start()
        tail.said_reader = threading.Thread(target=tail._read_stderr, daemon=True)
        tail.said_reader.start()
        return tail

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode().rstrip("\n"))

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.said.append(line.decode().rstrip("\n"))

    def waiting(self, timeout: float = 20.0) -> None:
        """Until it said it waits for the store (it started, and found none)."""
        deadline = time.monotonic() + timeout
        while not any(line.startswith("tapfix: waiting for a capture store") for line in self.said):
            assert self.proc.poll() is None and time.monotonic() < deadline, (self.proc.returncode, self.said)
            time.sleep(0.05)

    def take(self, count: int, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        got = []
        while len(got) < count:
            try:
                got.append(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"{len(got)} of {count} lines after {timeout}s: {got}") from None
        return got

    def quiet_for(self, seconds: float) -> list[str]:
        """Whatever more it prints within `seconds` (nothing, when nothing more was committed)."""
        time.sleep(seconds)
        extra = []
        while not self.lines.empty():
            extra.append(self.lines.get())
        return extra

    def interrupt(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.said_reader is not None:
            self.said_reader.join(5)  # to the end of what it said
        return self.proc.returncode, "\n".join(self.said)


@dataclass
class World:
    tmp: Path
    db: Path
    mock: InprocMock
    proxy: InprocProxy
    tails: dict[str, Tail]
    ids: list[str] = field(default_factory=list)  # in completion order


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("tail")
    db = tmp / "captures.db"
    (tmp / "scenario.json").write_text(json.dumps(SCENARIO))
    # Started before the store exists: each waits for it.
    tails = {
        "table": Tail.start(db),
        "json": Tail.start(db, "--json"),
        "trace": Tail.start(db, "--json", "--trace", TRACE),
        "flag": Tail.start(db, "--flag", "upstream_error"),
    }
    for tail in tails.values():
        tail.waiting()  # the proxy creates the store at once when it starts: after they looked for it
    mock = start_mock(tmp, "--scenario", str(tmp / "scenario.json"))
    proxy = start_proxy(tmp, mock.url, db=db)
    world = World(tmp, db, mock, proxy, tails)
    try:
        yield world
    finally:
        for tail in tails.values():
            tail.interrupt()
        world.proxy.stop()  # a test restarts the proxy: stop the one running now, not only the first
        proxy.stop()
        mock.stop()


def chat(proxy: InprocProxy, model: str, headers: dict[str, str] | None = None, stream: bool = False) -> str:
    body: dict[str, Any] = {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        r.read()
        return r.headers["x-tapfix-capture-id"]


def test_lines_come_in_completion_order_with_list_columns_and_filters(world: World) -> None:
    slow: list[str] = []
    thread = threading.Thread(target=lambda: slow.append(chat(world.proxy, "slow", stream=True)))
    thread.start()
    time.sleep(0.4)  # the slow stream arrived first, and stalls
    fast = chat(world.proxy, "fast", {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"})
    thread.join(20)
    err = chat(world.proxy, "err")
    world.ids += [fast, slow[0], err]

    rows = [json.loads(line) for line in world.tails["json"].take(3)]
    assert [r["id"] for r in rows] == world.ids, "commit order: the slow stream completed second"
    assert [r["model"] for r in rows] == ["fast", "slow", "err"] and rows[0]["trace_id"] == TRACE
    assert rows[2]["status"] == 500 and "upstream_error" in rows[2]["flags"]
    listed = cli("captures", "list", "--db", str(world.db), "--json").stdout.splitlines()
    assert sorted(rows, key=lambda r: r["id"]) == sorted((json.loads(x) for x in listed), key=lambda r: r["id"])

    header, *table = world.tails["table"].take(4)
    assert header.split()[:3] == ["ID", "TIME", "(UTC)"] and "FLAGS" in header and "CLIENT" in header
    assert [line.split()[0] for line in table] == world.ids
    assert [line.split()[5] for line in table] == ["fast", "slow", "err"]  # id, date, time, method, path, model
    assert all(len(line) > header.index("CLIENT") for line in table), "fixed widths: the columns line up"

    assert [json.loads(line)["id"] for line in world.tails["trace"].take(1)] == [fast]
    _, flagged = world.tails["flag"].take(2)
    assert flagged.split()[0] == err


def test_a_writer_restart_repeats_nothing_and_since_starts_back(world: World) -> None:
    if len(world.ids) != 3:
        pytest.skip("needs the first test's exchanges")
    world.proxy.stop()
    world.proxy = start_proxy(world.tmp, world.mock.url, db=world.db)  # a new writer on the same store
    world.ids += [chat(world.proxy, "after-restart-1"), chat(world.proxy, "after-restart-2")]
    got = [json.loads(line)["id"] for line in world.tails["json"].take(2)]
    assert got == world.ids[3:]
    assert world.tails["json"].quiet_for(0.6) == [], "nothing twice"
    assert world.tails["trace"].quiet_for(0) == [] and world.tails["flag"].quiet_for(0) == []
    assert len(world.tails["table"].take(2)) == 2

    after_fast = Tail.start(world.db, "--json", "--since", world.ids[0][:12])
    recent = Tail.start(world.db, "--json", "--since", "10m")
    assert [json.loads(line)["id"] for line in after_fast.take(4)] == world.ids[1:]
    assert [json.loads(line)["id"] for line in recent.take(5)] == world.ids
    for tail in (after_fast, recent):
        assert tail.quiet_for(0.5) == []
        code, stderr = tail.interrupt()
        assert (code, stderr) == (0, ""), stderr


def test_sigint_and_a_closed_stdout_end_it_quietly(world: World) -> None:
    head = subprocess.Popen(  # `tapfix captures tail | head -1`: read a line, then go away
        [*TAPFIX, "captures", "tail", "--db", str(world.db), "--since", "10m"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert head.stdout is not None and head.stdout.readline().startswith(b"ID ")  # the header comes first
    head.stdout.close()
    chat(world.proxy, "after-the-reader-left")  # its line is written to no one
    try:
        assert head.wait(10) == 0
    finally:
        head.kill()
    assert head.stderr is not None and head.stderr.read() == b""
    for name, tail in world.tails.items():
        code, stderr = tail.interrupt()
        assert code == 0, (name, stderr)
        assert stderr.strip() == f"tapfix: waiting for a capture store at {world.db} (`tapfix run` creates it)", name
