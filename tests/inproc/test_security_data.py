"""What is stored and where secrets can leak, through the real proxy in the test process: logs, error
bodies, CLI output, the CA key, the per-model privacy switch (file modes and replay/export in
tests/unit/test_security_data.py; the CA lock and the config's refusal in tests/process/test_security_data.py).

tests/inproc/test_e2e_capture.py already proves header/URL secrets never reach the db/-wal/-shm files and
tests/unit/test_upstream_and_redact.py the redaction rules; this adds the other ways out.
"""

from __future__ import annotations

import json

import httpx

from tests.support.inproc import cli, start, start_mock, start_proxy
from tests.support.procs import free_port, wait_capture
from tests.support.secrets import SECRET, SECRET2, file_mode


def test_secrets_never_reach_logs_error_bodies_or_cli_output(tmp_path):
    mock = start_mock(tmp_path)
    proxy = start_proxy(tmp_path, mock.url, "--verbose", db=tmp_path / "c.db")
    dead = None
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
        proxy.stop()  # one in-process proxy at a time: then the one whose upstream is gone
        dead = start_proxy(tmp_path, f"http://127.0.0.1:{free_port()}", "--verbose", db=tmp_path / "d.db")
        r = httpx.post(f"{dead.url}/v1/chat/completions{query}", json=body, headers=headers, timeout=20)
        assert r.status_code == 502
        seen.append(r.text)
        wait_capture(dead.extra["db"], r.headers["x-tapfix-capture-id"])
    finally:
        proxy.stop()
        if dead is not None:
            dead.stop()
        mock.stop()
    seen += [proxy.log(), dead.log(), mock.log()]
    assert "POST /v1/chat/completions" in proxy.log()  # --verbose did log the requests
    for text in seen:
        assert SECRET not in text and SECRET2 not in text, text[:2000]


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
    assert file_mode(confdir) == 0o700
    keys = [p for p in confdir.iterdir() if p.name in ("mitmproxy-ca.pem", "mitmproxy-ca.p12")]
    assert keys, list(confdir.iterdir())
    for key in keys:  # the CA's private key: whoever reads it can intercept this user's TLS
        assert file_mode(key) & 0o077 == 0, (key, oct(file_mode(key)))


def test_per_model_privacy_switch_stores_metadata_only(tmp_path):
    mock = start_mock(tmp_path)
    config = tmp_path / "tapfix.toml"
    config.write_text(
        f'[upstreams.local]\nbase_url = "{mock.url}/v1"\nengine = "vllm"\n'
        '[models.private]\nupstream_model = "tapfix-mock"\nstore_bodies = false\n'
        '[models.open]\nupstream_model = "tapfix-mock"\n'
    )
    db = tmp_path / "c.db"
    proxy = start(["--config", str(config), "--db", str(db)], tmp_path / "p.log")
    try:
        rows = {}
        for model in ("private", "open"):
            r = httpx.post(
                f"{proxy.url}/v1/chat/completions",
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
