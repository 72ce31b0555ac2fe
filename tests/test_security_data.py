"""What is stored and where secrets can leak: logs, error bodies, CLI output, file modes, the CA key,
replay/export, config files, and the per-model privacy switch.

tests/test_e2e_capture.py already proves header/URL secrets never reach the db/-wal/-shm files and
tests/test_upstream_and_redact.py the redaction rules; this adds the other ways out.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import load_capture
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.procs import cli, free_port, start_mock, start_proxy, wait_capture

SECRET = "sk-live-SECRETSECRET0123456789"
SECRET2 = "tok_ANOTHERSECRET987654321"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.e2e
def test_secrets_never_reach_logs_error_bodies_or_cli_output(tmp_path):
    mock = start_mock(tmp_path)
    proxy = start_proxy(tmp_path, mock.url, "--verbose", db=tmp_path / "c.db")
    dead = start_proxy(tmp_path, f"http://127.0.0.1:{free_port()}", "--verbose", db=tmp_path / "d.db")
    headers = {
        "authorization": f"Bearer {SECRET}",
        "x-api-key": SECRET,
        "cookie": f"s={SECRET2}",
        "x-custom": f"value {SECRET2}",
    }
    query = f"?key={SECRET}&api_key={SECRET2}&token={SECRET}"
    body = {"model": "tapfix-mock", "messages": [{"role": "user", "content": "hi"}]}
    seen: list[str] = []
    try:
        r = httpx.post(f"{proxy.url}/v1/chat/completions{query}", json=body, headers=headers, timeout=20)
        seen.append(r.text)
        ids = [r.headers["x-tapfix-capture-id"]]
        with httpx.stream(
            "POST", f"{proxy.url}/v1/chat/completions{query}", json=body | {"stream": True}, headers=headers, timeout=20
        ) as s:  # a client that hangs up mid-stream
            ids.append(s.headers["x-tapfix-capture-id"])
            next(s.iter_raw())
        r = httpx.post(f"{dead.url}/v1/chat/completions{query}", json=body, headers=headers, timeout=20)
        assert r.status_code == 502
        seen.append(r.text)
        wait_capture(dead.extra["db"], r.headers["x-tapfix-capture-id"])
        for capture_id in ids:
            wait_capture(proxy.extra["db"], capture_id, timeout=15)
            for args in (
                ("captures", "show", capture_id),
                ("captures", "export", capture_id, "--as", "curl"),
                ("captures", "export", capture_id, "--as", "python"),
            ):
                out = cli(*args, "--db", str(proxy.extra["db"]))
                assert out.returncode == 0, out.stderr
                seen.append(out.stdout.decode(errors="replace") + out.stderr.decode(errors="replace"))
        listed = cli("captures", "list", "--json", "--limit", "0", "--db", str(proxy.extra["db"]))
        seen.append(listed.stdout.decode())
    finally:
        proxy.stop()
        dead.stop()
        mock.stop()
    seen += [proxy.log(), dead.log(), mock.log()]
    assert "POST /v1/chat/completions" in proxy.log()  # --verbose did log the requests
    for text in seen:
        assert SECRET not in text and SECRET2 not in text, text[:2000]


def test_db_wal_and_shm_are_private_even_with_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        writer = CaptureWriter(tmp_path / "c.db")
        writer.submit(Exchange(request=b"{}", status=200))
        deadline = 50
        while writer.health()["written"] < 1 and deadline:
            import time

            time.sleep(0.05)
            deadline -= 1
        files = [tmp_path / n for n in ("c.db", "c.db-wal", "c.db-shm")]
        assert all(f.exists() for f in files)
        assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
        writer.close()
    finally:
        os.umask(old)


@pytest.mark.e2e
def test_mitmproxy_ca_key_stays_private_under_the_config_dir(tmp_path):
    config_home = tmp_path / "xdg"
    mock = start_mock(tmp_path)
    proxy = start_proxy(tmp_path, mock.url, env={"XDG_CONFIG_HOME": str(config_home)})
    try:
        httpx.get(f"{proxy.url}/v1/models", timeout=10)
    finally:
        proxy.stop()
        mock.stop()
    confdir = config_home / "tapfix" / "mitmproxy"
    assert _mode(confdir) == 0o700
    keys = [p for p in confdir.iterdir() if p.name in ("mitmproxy-ca.pem", "mitmproxy-ca.p12")]
    assert keys, list(confdir.iterdir())
    for key in keys:  # the CA's private key: whoever reads it can intercept this user's TLS
        assert _mode(key) & 0o077 == 0, (key, oct(_mode(key)))


@pytest.mark.e2e
def test_tapfix_processes_starting_together_share_one_whole_ca(tmp_path):
    """The first start makes the CA; six starting at once on a fresh config dir (mitmproxy writes the
    key file in pieces) all load one whole CA. Unlocked, rounds like these failed most runs."""
    load = (
        "from mitmproxy.certs import CertStore; from tapfix.addons.runner.master import confdir;"
        "print(CertStore.from_store(confdir(), 'mitmproxy', 2048).default_ca.fingerprint().hex())"
    )
    for round_ in range(2):
        env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / f"xdg{round_}")}
        procs = [
            subprocess.Popen([sys.executable, "-c", load], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for _ in range(6)
        ]
        outputs = [proc.communicate(timeout=60)[0].decode().strip() for proc in procs]
        assert all(proc.returncode == 0 for proc in procs), outputs
        assert len(set(outputs)) == 1, outputs


def test_replay_and_export_never_send_or_write_captured_secrets(tmp_path):
    from tapfix.proxy.replay.client import build_request
    from tapfix.proxy.replay.export import bundle_files, curl_script, python_script
    from tapfix.proxy.store.sqlite.reader import SqliteReader

    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    ex = Exchange(
        method="POST",
        path=f"/v1/chat/completions?api_key={SECRET}",
        url=f"http://h/v1/x?key={SECRET}",
        upstream_url=f"http://127.0.0.1:9/v1/chat/completions?key={SECRET}",
        status=200,
        request=b'{"model":"m","messages":[]}',
        content_type="application/json",
        response=b"{}",
        request_headers=[
            ("authorization", f"Bearer {SECRET}"),
            ("x-api-key", SECRET2),
            ("x-trace", f"id {SECRET2}"),
            ("user-agent", "opencode"),
        ],
        forwarded_headers=[("authorization", f"Bearer {SECRET}"), ("user-agent", "opencode")],
    )
    writer.submit(ex)
    writer.close()
    conn = open_for_reading(db)
    capture = load_capture(conn, ex.id)
    out = [curl_script(capture, b"{}"), python_script(capture, b"{}")]
    out += [v.decode(errors="replace") for v in bundle_files(SqliteReader(conn), capture).values()]
    for which in ("forwarded", "request"):
        request = build_request(SqliteReader(conn), ex.id, which=which)
        out.append(repr(request.headers) + request.url)
        assert not any(name.lower() in ("authorization", "x-api-key") for name, _ in request.headers)
    for text in out:
        assert SECRET not in text and SECRET2 not in text


@pytest.mark.e2e
def test_config_refuses_literal_keys_through_the_cli(tmp_path):
    config = tmp_path / "tapfix.toml"
    config.write_text(
        f'[upstreams.gpu]\nbase_url = "http://127.0.0.1:9/v1"\nengine = "vllm"\napi_key = "{SECRET}"\n'
        '[models.m]\nupstream = "gpu"\n'
    )
    for args in (("run", "--config", str(config), "--db", str(tmp_path / "c.db")), ("check", "--config", str(config))):
        result = cli(*args)
        text = result.stdout.decode() + result.stderr.decode()
        assert result.returncode != 0 and "api_key_env" in text, text
        assert SECRET not in text
    assert not (tmp_path / "c.db").exists()


@pytest.mark.e2e
def test_per_model_privacy_switch_stores_metadata_only(tmp_path):
    mock = start_mock(tmp_path)
    config = tmp_path / "tapfix.toml"
    config.write_text(
        f'[upstreams.local]\nbase_url = "{mock.url}/v1"\nengine = "vllm"\n'
        '[models.private]\nupstream_model = "tapfix-mock"\nstore_bodies = false\n'
        '[models.open]\nupstream_model = "tapfix-mock"\n'
    )
    port = free_port()
    from tests.support.procs import start

    db = tmp_path / "c.db"
    proxy = start(
        ["run", "--config", str(config), "--listen", f"127.0.0.1:{port}", "--db", str(db)], port, tmp_path / "p.log"
    )
    try:
        rows = {}
        for model in ("private", "open"):
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                timeout=20,
                json={"model": model, "messages": [{"role": "user", "content": f"PROMPT-{model}-TEXT"}]},
            )
            assert r.status_code == 200
            rows[model] = wait_capture(db, r.headers["x-tapfix-capture-id"])
    finally:
        proxy.stop()
        mock.stop()
    private, public = rows["private"], rows["open"]
    assert private["request_body_id"] is None and private["response_body_id"] is None and private["content"] is None
    assert private["status"] == 200 and private["model"] == "private" and private["prompt_tokens"] is not None
    assert public["request_body_id"] is not None and public["content"]
    raw = db.read_bytes() + (
        db.with_name(db.name + "-wal").read_bytes() if db.with_name(db.name + "-wal").exists() else b""
    )
    assert b"PROMPT-private-TEXT" not in raw and b"PROMPT-open-TEXT" in raw
    assert json.loads(private["request_headers"])  # metadata is still there
