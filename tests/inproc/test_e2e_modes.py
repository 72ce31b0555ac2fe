"""Regular (forward) proxy mode with an allow-list, and TLS upstreams with their own CA."""

from __future__ import annotations

import datetime
import json
import ssl
import threading

import httpx
import pytest
import uvicorn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.inproc import cli, start
from tests.support.procs import free_port, wait_capture
from tests.support.rawserver import RawServer

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


def test_regular_mode_captures_only_allow_listed_hosts(tmp_path):
    server = RawServer(lambda _: [(0.0, OK)])
    db = tmp_path / "r.db"
    proxy = start(["--mode", "regular", "--intercept", "127.0.0.1", "--db", str(db)], tmp_path / "proxy.log")
    try:
        with httpx.Client(proxy=proxy.url) as client:
            captured = client.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", json={"model": "m"})
            passed = client.post(f"http://localhost:{server.port}/v1/chat/completions", json={"model": "other"})
        assert captured.json() == {"ok": True} and passed.json() == {"ok": True}
        assert "x-tapfix-capture-id" in captured.headers
        assert "x-tapfix-capture-id" not in passed.headers
        wait_capture(db, captured.headers["x-tapfix-capture-id"])
        proxy.stop()
        rows = [json.loads(line) for line in cli("captures", "list", "--json", "--db", str(db)).stdout.splitlines()]
        assert [r["model"] for r in rows] == ["m"]
        assert len(server.requests) == 2
    finally:
        proxy.stop()
        server.close()


def _self_signed(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_upstream(tmp_path):
    cert, key = _self_signed(tmp_path)

    async def chat(request):
        return JSONResponse({"echo": (await request.json())["model"]})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ssl_certfile=str(cert),
            ssl_keyfile=str(key),
            lifespan="off",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.02)
    yield f"https://127.0.0.1:{port}", cert
    server.should_exit = True
    thread.join(5)


@pytest.mark.parametrize("trust", ["ca", "insecure", "none"])
def test_tls_upstream(tmp_path, tls_upstream, trust):
    url, cert = tls_upstream
    args = {"ca": ["--upstream-ca", str(cert)], "insecure": ["--insecure"], "none": []}[trust]
    proxy = start(["--upstream", url, "--db", str(tmp_path / "t.db"), *args], tmp_path / "proxy.log")
    try:
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "tls-model"})
        if trust == "none":
            assert response.status_code == 502  # an unverifiable certificate is refused, not ignored
            _assert_tls_refusal_is_tapfix_json(response, url, tmp_path / "t.db")
        else:
            assert response.json() == {"echo": "tls-model"}
        ssl.create_default_context()  # the test's own trust store is untouched
    finally:
        proxy.stop()


def _assert_tls_refusal_is_tapfix_json(response: httpx.Response, url: str, db) -> None:
    """The agent reads tapfix's JSON error, as for an upstream refusing TCP (a 502 it retries), never
    mitmproxy's HTML page; the message names the upstream and why its certificate was refused, and the
    capture keeps the refusal and what the client was told."""
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "upstream_unreachable"
    assert error["message"].startswith(f"upstream {url} unreachable: ")
    assert "certificate" in error["message"].lower()
    row = wait_capture(db, response.headers["x-tapfix-capture-id"])
    assert row["status"] == 502 and "upstream_unreachable" in json.loads(row["flags"])
    assert "upstream_error" not in json.loads(row["flags"]), "one failure, one flag: the router named it"
    assert json.loads(row["error"]) == error, "the capture records what the client was told (tapfix's answer)"
    assert "tapfix_answered" in json.loads(row["flags"]) and row["upstream_url"] == ""
    exported = cli("captures", "export", row["id"], "--db", str(db), "--client-response")
    assert json.loads(exported.stdout) == response.json()
