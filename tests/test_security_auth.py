"""Who can get in: loopback by default; beyond loopback only with the tapfix token, given as the client's
API key, checked in constant time, stripped, and never forwarded (the upstream gets its own key).

Unit tests drive `addons/auth.py` directly; the end-to-end ones run `tapfix run --token` for real.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from pathlib import Path

import httpx
import pytest
from mitmproxy.test import tflow
from tapfix.addons.auth import TokenAuth
from tapfix.addons.runner.master import build_runtime
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.net import parse_listen

from tests.support.procs import free_port, start, wait_capture
from tests.support.rawserver import RawRequest, RawServer

TOKEN = "tapfix-token-0123456789abcdef"


def _auth(intercept: set[str] | None = None) -> TokenAuth:
    runtime = build_runtime(Settings(upstream="http://127.0.0.1:9"))
    runtime.intercept_hosts = intercept or set()
    return TokenAuth(runtime, TOKEN)


def _flow(**headers: str):
    flow = tflow.tflow()
    flow.request.headers.clear()
    for name, value in headers.items():
        flow.request.headers[name.replace("_", "-")] = value
    return flow


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"Bearer {TOKEN}"},
        {"authorization": f"bearer  {TOKEN} "},
        {"x_api_key": TOKEN},
        {"api_key": TOKEN},
    ],
)
def test_the_token_as_api_key_is_accepted_and_stripped(headers):
    flow = _flow(**headers, user_agent="opencode")
    _auth().requestheaders(flow)
    assert flow.response is None
    assert dict(flow.request.headers) == {"user-agent": "opencode"}  # the token never goes upstream


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong-token-0123456789abcd"},
        {"authorization": TOKEN},
        {"authorization": f"Basic {TOKEN}"},
        {"x_api_key": TOKEN[:-1]},
        {"x_api_key": TOKEN + "x"},
        {"authorization": "Bearer "},
        {"x_api_key": ""},
    ],
)
def test_anything_else_gets_openai_shaped_401(headers):
    flow = _flow(**headers)
    auth = _auth()
    auth.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 401
    error = json.loads(flow.response.content)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert TOKEN not in flow.response.text and auth.rejected == 1


def test_short_tokens_are_refused():
    runtime = build_runtime(Settings(upstream="http://127.0.0.1:9"))
    with pytest.raises(ValueError):
        TokenAuth(runtime, "short")


def test_connect_needs_the_token_unless_the_host_is_intercepted():
    auth = _auth(intercept={"api.example.com"})
    flow = _flow()
    flow.request.host = "elsewhere.example.org"
    auth.http_connect(flow)
    assert flow.response is not None and flow.response.status_code == 407  # never an open relay
    for value in (f"Bearer {TOKEN}", "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode()):
        ok = _flow(proxy_authorization=value)
        ok.request.host = "elsewhere.example.org"
        auth.http_connect(ok)
        assert ok.response is None and "proxy-authorization" not in ok.request.headers
    inside = _flow()
    inside.request.host = "api.example.com"
    auth.http_connect(inside)
    assert inside.response is None  # its requests are checked one by one by `request`


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


@pytest.mark.e2e
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
        ["run", "--upstream", "http://127.0.0.1:9", "--listen", str(port), "--db", str(tmp_path / "c.db")],
        port,
        tmp_path / "p.log",
    )
    try:
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, little-endian hex
    finally:
        proxy.stop()


@pytest.mark.e2e
def test_non_loopback_without_token_refuses_to_start(tmp_path):
    from tests.support.procs import cli

    env = {k: v for k, v in os.environ.items() if k != "TAPFIX_TOKEN"}
    result = cli(
        "run",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        f"0.0.0.0:{free_port()}",
        "--db",
        str(tmp_path / "c.db"),
        env=env | {"TAPFIX_TOKEN": ""},
    )
    assert result.returncode != 0
    message = result.stderr.decode()
    assert "refusing to listen" in message and "--token" in message and "TAPFIX_TOKEN" in message
    short = cli(
        "run",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        f"0.0.0.0:{free_port()}",
        "--token",
        "abc",
        "--db",
        str(tmp_path / "c.db"),
    )
    assert short.returncode != 0 and "at least 8" in short.stderr.decode()


@pytest.mark.e2e
def test_token_end_to_end_on_all_interfaces(tmp_path):
    ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    upstream = RawServer(lambda _r: [(0.0, ok)])
    port = free_port()
    db = tmp_path / "c.db"
    proxy = start(
        [
            "run",
            "--upstream",
            upstream.url,
            "--listen",
            f"0.0.0.0:{port}",
            "--db",
            str(db),
            "--key-env",
            "UPSTREAM_KEY",
        ],
        port,
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
