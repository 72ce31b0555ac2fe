"""`tapfix demo`, the README's first command: proxy + scripted upstream + SQLite in one process."""

from __future__ import annotations

import json

import httpx

from tests.support.inproc import cli
from tests.support.procs import free_port, start, wait_capture


def test_demo_serves_a_client_and_captures(tmp_path):
    port, mock_port = free_port(), free_port()
    db = tmp_path / "demo.db"
    demo = start(
        ["demo", "--listen", f"127.0.0.1:{port}", "--mock-listen", f"127.0.0.1:{mock_port}", "--db", str(db)],
        port,
        tmp_path / "demo.log",
    )
    try:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "tapfix-mock", "stream": True, "messages": [{"role": "user", "content": "Say hello"}]},
        )
        assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]")
        row = wait_capture(db, response.headers["x-tapfix-capture-id"])
        assert row["content"] and row["model"] == "tapfix-mock"
        banner = demo.log()
        assert f"http://127.0.0.1:{port}/v1" in banner and "curl" in banner and "OpenAI(" in banner
        assert str(db) in banner
    finally:
        assert demo.stop() == 0
    listed = cli("captures", "list", "--json", "--db", str(db))
    assert len([json.loads(line) for line in listed.stdout.splitlines()]) == 1
