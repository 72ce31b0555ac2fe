"""Who can get in: loopback by default; beyond loopback only with the tapfix token, given as the client's
API key, checked in constant time, stripped, and never forwarded (the upstream gets its own key).

The real proxy in the test process: what it listens on, and the token end to end (tests/unit/test_security_auth.py
drives `addons/auth.py` directly; tests/process/test_security_auth.py: the refusal to start).
"""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.net import parse_listen

from tests.support.inproc import start
from tests.support.procs import free_port, wait_capture
from tests.support.rawserver import RawRequest, RawServer

TOKEN = "tapfix-token-0123456789abcdef"


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a LISTEN socket on `port`, from /proc/net/tcp{,6}."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            host, _, hexport = local.partition(":")
            if state == "0A" and int(hexport, 16) == port:
                found.add(host)
    return found


def test_defaults_bind_to_loopback_only(tmp_path):
    from tapfix.proxy.cli import main

    assert Settings().listen_host == "127.0.0.1" and parse_listen(":9000", 1) == ("127.0.0.1", 9000)
    for command, expected in (("run", "127.0.0.1:8080"), ("mock", "127.0.0.1:8000")):
        listen = next(p for p in main.commands[command].params if p.name == "listen")
        assert listen.default == expected
    from tapfix.proxy.cli.browse import browse

    assert next(p for p in browse.params if p.name == "listen").default == "127.0.0.1:8081"
    # A real proxy given only a port listens on 127.0.0.1, nowhere else.
    port = free_port()
    proxy = start(
        ["--upstream", "http://127.0.0.1:9", "--listen", str(port), "--db", str(tmp_path / "c.db")], tmp_path / "p.log"
    )
    try:
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, little-endian hex
    finally:
        proxy.stop()


def test_token_end_to_end_on_all_interfaces(tmp_path):
    ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    upstream = RawServer(lambda _r: [(0.0, ok)])
    port = free_port()
    db = tmp_path / "c.db"
    proxy = start(
        [
            "--upstream",
            upstream.url,
            "--listen",
            f"0.0.0.0:{port}",
            "--db",
            str(db),
            "--key-env",
            "UPSTREAM_KEY",
        ],
        tmp_path / "p.log",
        env={"TAPFIX_TOKEN": TOKEN, "UPSTREAM_KEY": "upstream-own-key-42"},
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    preflight = len(upstream.requests)  # `tapfix run` checks the upstream (GET /v1/models) at start
    try:
        assert _listening_addresses(port) & {"00000000", "00000000000000000000000000000000"}
        for headers in ({}, {"authorization": "Bearer nope-nope-nope"}, {"x-api-key": "sk-wrong"}):
            r = httpx.post(url, json=body, headers=headers, timeout=10)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"http://127.0.0.1:{port}/tapfix/health", timeout=10).status_code == 401
        assert len(upstream.requests) == preflight  # nothing unauthenticated went upstream
        for headers in ({"authorization": f"Bearer {TOKEN}"}, {"x-api-key": TOKEN}):
            r = httpx.post(url, json=body, headers=headers, timeout=10)
            assert r.status_code == 200, r.text
            seen: RawRequest = upstream.requests[-1]
            assert TOKEN.encode() not in seen.head
            assert seen.header("authorization") == "Bearer upstream-own-key-42"
            wait_capture(db, r.headers["x-tapfix-capture-id"])
        with socket.create_connection(("127.0.0.1", port)) as s:  # no token, raw: still refused
            s.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 401")
    finally:
        proxy.stop()
        upstream.close()
    for name in (db, db.with_name(db.name + "-wal")):
        if name.exists():
            assert TOKEN.encode() not in name.read_bytes()
            assert b"upstream-own-key-42" not in name.read_bytes()
    assert TOKEN not in proxy.log() and "upstream-own-key-42" not in proxy.log()
