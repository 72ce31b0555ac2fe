"""What is stored and where secrets can leak: file modes, replay/export (logs, error bodies, CLI output, the
CA key and the per-model privacy switch through the real proxy in tests/inproc/test_security_data.py).
Which ways out other tests already cover is in tests/inproc/test_security_data.py.
"""

from __future__ import annotations

import os

from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import load_capture
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.secrets import SECRET, SECRET2, file_mode


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
        assert {f.name: file_mode(f) for f in files} == {f.name: 0o600 for f in files}
        writer.close()
    finally:
        os.umask(old)


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
