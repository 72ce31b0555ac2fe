"""Fixtures for the agent suite: install the pinned agents once, and give each test its own
`tapfix mock` + `tapfix run` pair (own ports, own capture database), stopped afterwards. The agents are
processes; the mock, the proxy and the `captures` commands that read the store run in the test process
(tests/support/inproc.py), as the real-engine tests' proxy does: a process of theirs proves nothing more
here, and each costs a second or two of CPU per test.

Locally a missing npm (or a failed install) skips the suite with the reason; with `CI` set it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.agents import AGENTS_DIR, INSTALL_SCRIPT
from tests.support.ci import unavailable
from tests.support.inproc import InprocMock, InprocProxy, cli, start, start_mock, start_proxy

INSTALL_TIMEOUT = 900


def _unavailable(reason: str) -> None:
    unavailable(f"agent suite: {reason}")


@pytest.fixture(scope="session")
def agents_installed() -> Path:
    """Run scripts/install-agents (idempotent; a no-op when the pinned versions are present)."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        _unavailable("npm/node not on PATH; install Node >= 20 with npm, then run scripts/install-agents")
    started = time.monotonic()
    try:
        env = {**os.environ, "TAPFIX_AGENTS_DIR": str(AGENTS_DIR)}
        result = subprocess.run([str(INSTALL_SCRIPT)], capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        _unavailable(f"scripts/install-agents did not finish within {INSTALL_TIMEOUT}s")
    if result.returncode != 0:
        _unavailable(f"scripts/install-agents failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    seconds = time.monotonic() - started
    if seconds > 2:
        print(
            f"\n[agents] {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'installed'}"
            f" ({seconds:.0f}s)"
        )
    return AGENTS_DIR


@dataclass
class Store:
    """The capture store, read the way users read it: `tapfix captures list --json` for the rows and
    `tapfix captures export` for bodies (`cli=True`; both through CliRunner), or the reader the export
    uses, plus the plain `changes` table for the change rows."""

    db: Path

    def rows(self) -> list[dict]:
        """Every exchange, oldest first."""
        if not self.db.exists():
            return []
        result = cli("captures", "list", "--json", "--limit", "0", "--db", str(self.db))
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        return [json.loads(line) for line in reversed(result.stdout.decode().splitlines()) if line.strip()]

    def ids(self) -> list[str]:
        """Ids committed so far, oldest first, straight from the table (to poll while an agent runs;
        the writer commits at least once a second)."""
        if not self.db.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return [r[0] for r in conn.execute("select id from exchanges order by ts, id")]
        except sqlite3.OperationalError:
            return []
        finally:
            conn.close()

    def body(self, capture_id: str, which: str = "request", *, cli_export: bool = False) -> bytes:
        """Exact bytes: request (as the client sent it), forwarded (as sent upstream), response (as the
        upstream answered), client_response (as the client got it)."""
        if cli_export:
            flag = {
                "request": [],
                "forwarded": ["--forwarded"],
                "response": ["--response"],
                "client_response": ["--client-response"],
            }[which]
            result = cli("captures", "export", capture_id, *flag, "--db", str(self.db))
            assert result.returncode == 0, result.stderr.decode(errors="replace")
            return result.stdout
        from tapfix.proxy.store.sqlite.database import open_for_reading
        from tapfix.proxy.store.sqlite.reader import capture_body, load_capture

        conn = open_for_reading(self.db)
        try:
            return capture_body(conn, load_capture(conn, capture_id), which)
        finally:
            conn.close()

    def json_body(self, capture_id: str, which: str = "request", *, cli_export: bool = False) -> dict:
        return json.loads(self.body(capture_id, which, cli_export=cli_export))

    def changes(self, capture_id: str) -> list[dict]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute(
                "select stage, kind, path, before, after, reason from changes where exchange_id = ? order by seq",
                (capture_id,),
            ).fetchall()
        finally:
            conn.close()
        return [
            {
                **dict(r),
                "before": json.loads(r["before"]) if r["before"] else None,
                "after": json.loads(r["after"]) if r["after"] else None,
            }
            for r in rows
        ]


@dataclass
class Stack:
    """tapfix run in front of tapfix mock (or of nothing), for one test."""

    tmp: Path
    proxy: InprocProxy
    mock: InprocMock | None
    store: Store

    @property
    def base_url(self) -> str:
        return f"{self.proxy.url}/v1"

    def stop_proxy(self) -> None:
        """Stop the proxy so its writer has committed everything before the store is read."""
        self.proxy.stop()

    def describe(self) -> str:
        parts = [f"--- proxy log ---\n{self.proxy.log()[-3000:]}"]
        if self.mock is not None:
            parts.append(f"--- mock log ---\n{self.mock.log()[-2000:]}")
        return "\n".join(parts)


@pytest.fixture
def stack(tmp_path, agents_installed):
    """A factory: `stack(mock_args=[...], proxy_args=[...])` or `stack(config=TOML)` (config mode; the
    text's `{MOCK}` is replaced by the mock's URL) or `stack(upstream="http://127.0.0.1:PORT")` (no mock)."""
    made: list[InprocMock | InprocProxy] = []

    def make(
        *, mock_args: list[str] = (), proxy_args: list[str] = (), config: str | None = None, upstream: str | None = None
    ) -> Stack:
        mock = None
        if upstream is None:
            mock = start_mock(tmp_path, *mock_args)
            made.append(mock)
            upstream = mock.url
        db = tmp_path / f"captures-{len(made)}.db"
        if config is not None:
            cfg = tmp_path / "tapfix.toml"
            cfg.write_text(config.replace("{MOCK}", upstream))
            proxy = start(["--config", str(cfg), "--db", str(db), *proxy_args], tmp_path / f"proxy-{len(made)}.log")
            proxy.extra["db"] = db
        else:
            proxy = start_proxy(tmp_path, upstream, *proxy_args, db=db)
        made.append(proxy)
        return Stack(tmp_path, proxy, mock, Store(db))

    yield make
    for proc in reversed(made):
        proc.stop()
