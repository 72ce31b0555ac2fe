"""The Host header in reverse mode: the capture keeps the one the client sent, the upstream gets its own.

A capture is read as "what the client sent": a record whose Host (and `url`) names the upstream says the
client talked to the upstream directly, which it never did. The upstream still needs its own name in Host
(virtual hosts, engines behind a gateway), whichever way tapfix chose it: the single `--upstream`, a routed
model's upstream, or a path tapfix forwards without recording.
"""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from tests.inproc.test_e2e_modes import tls_upstream  # noqa: F401 - a fixture: an https upstream with its own CA
from tests.support.config_text import toml_table
from tests.support.inproc import start, start_proxy
from tests.support.procs import response_head, wait_capture
from tests.support.rawserver import RawServer, json_upstreams


def _ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.fixture
def upstreams(request):
    """Two recording upstreams on the loopback address the test names (`indirect` parametrize), else 127.0.0.1."""
    host = getattr(request, "param", "127.0.0.1")
    if ":" in host and not _ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback (::1) to run an upstream on")
    with json_upstreams(2, host) as servers:
        yield servers


# An IPv6 upstream is named in brackets wherever tapfix writes host:port (Host, url, upstream_url).
LOOPBACKS = pytest.mark.parametrize("upstreams", ["127.0.0.1", "::1"], indirect=True, ids=["ipv4", "ipv6"])


def _post(port: int, host: str, path: str = "/v1/chat/completions", model: str = "m") -> str:
    """A raw request with a Host of the test's choosing (a name for the proxy no client library would
    derive from its address); returns the capture id from the response head ("" if none)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = response_head(
        port,
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        + body,
    )
    assert head.startswith(b"HTTP/1.1 200"), head
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-tapfix-capture-id":
            return value.strip().decode()
    return ""


def _recorded_hosts(row: dict) -> list[str]:
    return [value for name, value in json.loads(row["request_headers"]) if name.lower() == "host"]


def _hostport(server: RawServer) -> str:
    return server.hostport


@LOOPBACKS
def test_single_upstream_records_the_clients_host_and_sends_the_upstreams(tmp_path, upstreams):
    upstream = upstreams[0]
    proxy = start_proxy(tmp_path, f"{upstream.url}/v1")
    client_host = f"localhost:{proxy.port}"
    try:
        row = wait_capture(proxy.extra["db"], _post(proxy.port, client_host))
        assert _recorded_hosts(row) == [client_host]
        assert row["url"] == f"http://{client_host}/v1/chat/completions"
        assert row["upstream_url"] == f"{upstream.url}/v1/chat/completions"
        assert upstream.requests[-1].header("host") == _hostport(upstream)

        assert _post(proxy.port, client_host, "/tapfix/not-a-route") == ""  # forwarded, not recorded
        assert upstream.requests[-1].path == "/tapfix/not-a-route"
        assert upstream.requests[-1].header("host") == _hostport(upstream)
    finally:
        proxy.stop()


def routes(first: str, second: str) -> str:
    """Two vLLM upstreams, one model on each; the second's URL names /v1."""
    return (
        toml_table("upstreams.first", base_url=first, engine="vllm")
        + toml_table("upstreams.second", base_url=f"{second}/v1", engine="vllm")
        + toml_table("models.a", upstream="first")
        + toml_table("models.b", upstream="second")
    )


@LOOPBACKS
def test_routed_upstream_gets_its_own_host(tmp_path, upstreams):
    first, second = upstreams
    config = tmp_path / "tapfix.toml"
    config.write_text(routes(first.url, second.url))
    db = tmp_path / "routed.db"
    proxy = start(["--config", str(config), "--db", str(db)], tmp_path / "p.log")
    port = proxy.port
    client_host = f"localhost:{port}"
    try:
        for model, server in (("b", second), ("a", first)):
            row = wait_capture(db, _post(port, client_host, model=model))
            assert _recorded_hosts(row) == [client_host]
            assert row["url"] == f"http://{client_host}/v1/chat/completions"
            assert row["upstream_url"].startswith(server.url + "/")
            assert server.requests[-1].header("host") == _hostport(server)
            assert all(r.header("host") == _hostport(server) for r in server.requests)
        posts = [[r for r in server.requests if r.head.startswith(b"POST ")] for server in (first, second)]
        assert [len(p) for p in posts] == [1, 1]  # besides tapfix's own GET /v1/models at startup
    finally:
        proxy.stop()


def test_regular_mode_passes_the_clients_host_and_records_it(tmp_path, upstreams):
    upstream = upstreams[0]
    db = tmp_path / "regular.db"
    proxy = start(["--mode", "regular", "--intercept", "127.0.0.1", "--db", str(db)], tmp_path / "p.log")
    try:
        with httpx.Client(proxy=proxy.url) as client:
            response = client.post(f"{upstream.url}/v1/chat/completions", json={"model": "m", "messages": []})
        row = wait_capture(db, response.headers["x-tapfix-capture-id"])
        assert _recorded_hosts(row) == [_hostport(upstream)]
        assert row["url"] == row["upstream_url"] == f"{upstream.url}/v1/chat/completions"
        assert upstream.requests[-1].header("host") == _hostport(upstream)
    finally:
        proxy.stop()


def test_tls_upstream_is_named_by_its_own_address_not_the_clients_sni(tmp_path, tls_upstream):  # noqa: F811
    """A client speaking TLS to tapfix gives its own server name; the upstream's certificate is checked
    against the upstream's name, as before tapfix kept the client's Host."""
    url, cert = tls_upstream
    proxy = start_proxy(tmp_path, url, "--upstream-ca", str(cert), env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    try:
        with httpx.Client(verify=False) as client:  # tapfix's own certificate: mitmproxy's CA in tmp_path
            response = client.post(f"https://localhost:{proxy.port}/v1/chat/completions", json={"model": "tls-model"})
        assert response.json() == {"echo": "tls-model"}
        row = wait_capture(proxy.extra["db"], response.headers["x-tapfix-capture-id"])
        assert row["url"] == f"https://localhost:{proxy.port}/v1/chat/completions"
        assert row["upstream_url"] == f"{url}/v1/chat/completions"
    finally:
        proxy.stop()
