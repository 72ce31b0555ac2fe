"""A fleet end to end: three real `tapfix run` processes on three ports, in front of one `tapfix mock`,
writing one PostgreSQL database (on the suite's second server, `postgres_to_restart`: restarting it
disturbs no other test) under concurrent streamed agent sessions whose turns a load balancer spreads
over the instances. Then
`captures list` and `captures export` see every exchange byte-exact, each agent run is one session;
a `kill -9` of one instance loses nothing it finished more than a second before; a PostgreSQL restart
in the middle of the load (and a start while it is down) loses nothing either, the outage held in memory.

`fleet` runs the load once per module and yields what the clients sent and received, for any check of
what the store gives back (browse, replay) to reuse."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from tests.support.inproc import cli, start_mock
from tests.support.postgres import PostgresServer
from tests.support.procs import TAPFIX, Proc, free_port, wait_port

pytestmark = [pytest.mark.postgres]
INSTANCES = 3
AGENTS = 6  # concurrent agent runs, each turn to the next instance (round robin, as a balancer would)
TURNS = 3


@dataclass
class Turn:
    capture_id: str
    instance: int
    sent: bytes  # the request body as the client sent it
    received: bytes  # the response body as the client received it
    finished: float  # time.time() when the client had the whole response


@dataclass
class Fleet:
    url: str  # the database's URL (with its password)
    server: PostgresServer
    proxies: list[Proc]
    agents: dict[str, list[Turn]] = field(default_factory=dict)  # agent run → its turns in order


@pytest.fixture(scope="module")
def server(postgres_to_restart: PostgresServer) -> PostgresServer:
    return postgres_to_restart  # stopped and started here: not the session's `postgres`


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_mock(tmp_path_factory.mktemp("fleet-mock"), "--chunk-delay-ms", "1")
    yield proc
    proc.stop()


def _proxies(tmp: Path, upstream: str, db: str, n: int, *args: str) -> list[Proc]:
    """`n` instances started at once (their start-up overlaps), each listening before this returns."""
    started = []
    for _ in range(n):
        port = free_port()
        log = tmp / f"proxy-{port}.log"
        argv = [*TAPFIX, "run", "--upstream", upstream, "--listen", f"127.0.0.1:{port}", "--db", db, *args]
        proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
        proc.log_path = log  # type: ignore[attr-defined]
        started.append(Proc(proc, port, log))
    for handle in started:
        wait_port(handle.port, handle.proc)
    return started


def _stop(proxies: list[Proc]) -> None:
    """SIGTERM to all at once (each drains its writer), then wait for each."""
    for proxy in proxies:
        if proxy.proc.poll() is None:
            proxy.proc.send_signal(signal.SIGTERM)
    for proxy in proxies:
        proxy.stop()


def _reply(received: bytes) -> str:
    """The assistant text of a chat stream, to send back in the next turn as an agent does."""
    text = []
    for line in received.split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            for choice in orjson.loads(line[6:]).get("choices", []):
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def _turn(client: httpx.Client, proxy: Proc, instance: int, messages: list[dict[str, str]]) -> Turn:
    sent = orjson.dumps({"model": "tapfix-mock", "stream": True, "messages": messages})
    headers = {"content-type": "application/json", "accept-encoding": "identity"}
    with client.stream("POST", f"{proxy.url}/v1/chat/completions", content=sent, headers=headers) as response:
        assert response.status_code == 200
        received = b"".join(response.iter_raw())
    return Turn(response.headers["x-tapfix-capture-id"], instance, sent, received, time.time())


def _agent(fleet: Fleet, name: str, first: int) -> None:
    messages = [{"role": "system", "content": f"you are agent {name}. " * 40}]
    turns = fleet.agents[name]
    with httpx.Client(timeout=30) as client:
        for k in range(TURNS):
            messages.append({"role": "user", "content": f"{name}, step {k}: " + "tool output line\n" * 30})
            instance = (first + k) % len(fleet.proxies)
            turns.append(_turn(client, fleet.proxies[instance], instance, messages))
            messages.append({"role": "assistant", "content": _reply(turns[-1].received)})


@pytest.fixture(scope="module")
def fleet(server: PostgresServer, mock: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    url = server.create_database("fleet")
    proxies = _proxies(tmp_path_factory.mktemp("fleet"), mock.url, url, INSTANCES)
    fleet = Fleet(url, server, proxies, {f"agent{i}": [] for i in range(AGENTS)})
    try:
        threads = [threading.Thread(target=_agent, args=(fleet, name, i)) for i, name in enumerate(fleet.agents)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(len(turns) == TURNS for turns in fleet.agents.values())
        _settled(proxies)
        yield fleet
    finally:
        _stop(proxies)


def _health(proxy: Proc) -> dict[str, Any]:
    return dict(httpx.get(f"{proxy.url}/tapfix/health", timeout=5).json()["capture_writer"])


def _settled(proxies: list[Proc], timeout: float = 20) -> None:
    """Every instance has written (or counted) all it was given, nothing held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        healths = [_health(p) for p in proxies]
        if all(h["queue_depth"] == 0 and h["store"]["held"] == 0 and h["store"]["state"] == "ok" for h in healths):
            return
        time.sleep(0.05)
    raise AssertionError(f"writers not settled: {healths}")


def _bodies(url: str, ids: list[str], kind: str) -> dict[str, bytes]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("select id, tapfix_body_bytes(id, %s) from exchanges where id = any(%s)", (kind, ids))
        return {str(r[0]): bytes(r[1]) for r in rows}


def test_the_fleet_stores_every_exchange_byte_exact_with_sessions_intact(fleet: Fleet) -> None:
    listed = cli("captures", "list", "--db", fleet.url, "--limit", "0", "--json")
    assert listed.returncode == 0, listed.stderr.decode()
    rows = {r["id"]: r for r in map(json.loads, listed.stdout.splitlines())}
    turns = [t for ts in fleet.agents.values() for t in ts]
    assert sorted(rows) == sorted(t.capture_id for t in turns)  # every exchange once, ids unique across instances
    assert {t.instance for t in turns} == set(range(INSTANCES))
    sessions = {name: {rows[t.capture_id]["session_id"] for t in ts} for name, ts in fleet.agents.items()}
    assert all(len(ids) == 1 and None not in ids for ids in sessions.values()), sessions
    assert len({next(iter(ids)) for ids in sessions.values()}) == AGENTS  # one session per agent run
    ids = [t.capture_id for t in turns]
    sent, received = _bodies(fleet.url, ids, "request"), _bodies(fleet.url, ids, "client_response")
    for t in turns:
        assert sent[t.capture_id] == t.sent and received[t.capture_id] == t.received
    for proxy in fleet.proxies:  # the banner and health name the store, its password masked
        store = _health(proxy)["store"]
        assert store["backend"] == "postgresql" and ":***@" in store["location"] and ":***@" in proxy.log()
        assert fleet.server.password not in proxy.log() + json.dumps(store)
    last = fleet.agents["agent0"][-1]  # and through the CLI, as a user exports them
    assert cli("captures", "export", last.capture_id, "--db", fleet.url).stdout == last.sent
    exported = cli("captures", "export", last.capture_id, "--db", fleet.url, "--client-response")
    assert exported.returncode == 0 and exported.stdout == last.received


def test_browse_and_replay_see_the_whole_fleet(fleet: Fleet, mock: Proc) -> None:
    """The browser lists every instance's exchanges and shows each agent run as one session, turns in
    order, bodies exact; `tapfix replay` resends a turn that another instance recorded."""
    from starlette.testclient import TestClient
    from tapfix.proxy.browse import create_app
    from tapfix.proxy.store.locator import StoreLocator

    turns = [t for ts in fleet.agents.values() for t in ts]
    with TestClient(create_app(StoreLocator.resolve(fleet.url, postgres=True)), base_url="http://127.0.0.1") as c:
        listed = c.get("/").text
        assert all(f'href="/exchange/{t.capture_id}"' in listed for t in turns)
        for ts in fleet.agents.values():
            session = c.get(f"/exchange/{ts[0].capture_id}").text.split('href="/session/')[1].split('"')[0]
            page = c.get(f"/session/{session}").text
            assert [page.index(f'href="/exchange/{t.capture_id}"') for t in ts] == sorted(
                page.index(f'href="/exchange/{t.capture_id}"') for t in ts
            )
        last = fleet.agents["agent1"][-1]
        assert c.get(f"/exchange/{last.capture_id}/body/request").content == last.sent
        assert c.get(f"/exchange/{last.capture_id}/body/client_response").content == last.received
    again = cli("replay", last.capture_id, "--db", fleet.url, "--upstream", mock.url, "--json")
    assert again.returncode == 0, again.stderr.decode()
    run = json.loads(again.stdout.splitlines()[0])
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        row = conn.execute("select source_id, tags from exchanges where id = %s", (run["capture_id"],)).fetchone()
    assert row == (last.capture_id, '["replay"]')


def _load(proxies: list[Proc], done: list[Turn], failed: list[str], stop: threading.Event, name: str) -> None:
    """One agent after another, turn after turn, to the instances in turn, until `stop`."""
    messages: list[dict[str, str]] = []
    with httpx.Client(timeout=10) as client:
        k = 0
        while not stop.is_set():
            if k % TURNS == 0:
                messages = [{"role": "system", "content": f"load {name} {k}"}]
            messages.append({"role": "user", "content": f"{name} {k}: " + "x" * 200})
            instance = k % len(proxies)
            try:
                done.append(_turn(client, proxies[instance], instance, messages))
            except (httpx.HTTPError, AssertionError) as e:
                failed.append(f"{instance}: {e!r}")
                if proxies[instance].proc.poll() is not None:
                    return
                time.sleep(0.05)
            else:
                messages.append({"role": "assistant", "content": _reply(done[-1].received)})
            k += 1


def _stored(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {str(r[0]) for r in conn.execute("select id from exchanges")}


def test_after_kill_9_every_exchange_finished_a_second_before_is_there(
    server: PostgresServer, mock: Proc, tmp_path: Path
) -> None:
    url = server.create_database("killed")
    (victim,) = _proxies(tmp_path, mock.url, url, 1)
    done: list[Turn] = []
    failed: list[str] = []
    stop = threading.Event()
    loaders = [threading.Thread(target=_load, args=([victim], done, failed, stop, f"k{i}")) for i in range(2)]
    for t in loaders:
        t.start()
    deadline = time.monotonic() + 10
    while len(done) < 8:  # then a second more: these must all be there after the kill
        assert time.monotonic() < deadline, failed[:3]
        time.sleep(0.02)
    time.sleep(1.1)
    killed_at = time.time()
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(5)
    stop.set()
    for t in loaders:
        t.join(10)
    finished_before = {t.capture_id for t in done if t.finished < killed_at - 1.0}
    assert len(finished_before) >= 8, (len(done), failed[:3])
    assert finished_before <= _stored(url)


def test_a_restart_of_postgresql_mid_load_loses_nothing_and_a_down_start_waits(
    server: PostgresServer, mock: Proc, tmp_path: Path
) -> None:
    url = server.create_database("restarted")
    server.down()
    try:
        strict = [*TAPFIX, "run", "--strict", "--upstream", mock.url, "--listen", f"127.0.0.1:{free_port()}"]
        refusing = subprocess.Popen([*strict, "--db", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # Without --strict: serves, holds, migrates later.
        proxies = _proxies(tmp_path, mock.url, url, 1, "--store-queue", "500", "--store-queue-bytes", "64M")
        _, said = refusing.communicate(timeout=30)
        message = said.decode()
        assert refusing.returncode != 0 and "--strict" in message and "can't connect" in message, message
        assert server.password not in message and ":***@" in message and "Traceback" not in message
        assert len(message.strip().splitlines()) == 1, message
        health = httpx.get(f"{proxies[0].url}/tapfix/health", timeout=5).json()
        store = health["capture_writer"]["store"]
        assert (store["state"], store["max_held"], store["max_held_bytes"]) == ("starting", 500, 64 << 20)
        assert health["status"] == "degraded"  # the store is away: health says so at the top
    finally:
        server.up()
    done: list[Turn] = []
    failed: list[str] = []
    stop = threading.Event()
    peak = {"held": 0}

    def watch() -> None:
        while not stop.is_set():
            peak["held"] = max([peak["held"], *(_health(p)["store"]["held"] for p in proxies)])
            time.sleep(0.02)

    threads = [threading.Thread(target=_load, args=(proxies, done, failed, stop, f"r{i}")) for i in range(2)]
    threads.append(threading.Thread(target=watch))
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)
        before = len(done)
        away = server.restart()
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(10)
        _settled(proxies)
        healths = [_health(p) for p in proxies]
    finally:
        _stop(proxies)
    assert not failed, failed[:3]  # traffic never broke
    assert {t.capture_id for t in done} == _stored(url)  # every exchange, none lost
    assert all(h["failures"] == 0 and h["store"]["retries"] == 0 for h in healths), healths
    print(f"\nPostgreSQL away {away:.2f} s; {len(done) - before} exchanges during and after; peak held {peak['held']}")
    assert peak["held"] > 0  # the outage was real: exchanges waited in memory


def test_probe_captures_and_mock_replays_a_capture_on_postgresql(fleet: Fleet, mock: Proc) -> None:
    from click.testing import CliRunner
    from tapfix.proxy.cli.main import main
    from tapfix.proxy.replay.server import recorded_response
    from tapfix.proxy.store.pg.reader import PostgresReader

    url = fleet.server.create_database("probed")
    probed = CliRunner().invoke(main, ["probe", "--upstream", mock.url, "--only", "models,streaming", "--db", url])
    assert probed.exit_code == 0, probed.output
    with psycopg.connect(url, autocommit=True) as conn:
        tags = [r[0] for r in conn.execute("select tags from exchanges")]
    assert len(tags) >= 2 and all("probe" in json.loads(t) for t in tags)
    turn = fleet.agents["agent1"][0]
    with PostgresReader(fleet.url) as reader:
        recorded = recorded_response(reader, turn.capture_id)  # what `tapfix mock --capture ID --db URL` serves
    assert recorded.status == 200 and b"".join(c for _, c in recorded.chunks) == turn.received
