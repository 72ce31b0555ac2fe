"""`tapfix demo`: the scripted upstream and the proxy in one process, ready for a client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click
import uvicorn
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.net import url
from tapfix.proxy.store.locator import StoreLocator

if TYPE_CHECKING:
    from tapfix.proxy.mock import MockOptions


def _socket(host: str) -> socket.socket:
    return socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)


def _free(host: str, port: int) -> bool:
    with _socket(host) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _pick_port(host: str, port: int) -> int:
    if _free(host, port):
        return port
    with _socket(host) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class MockThread:
    """The mock served by a thread of this process. `stop` waits for the thread: an event loop left running
    while the interpreter exits crashes it (uvicorn picks uvloop, whose timers call into a finalized
    interpreter: SIGSEGV instead of exit 0, one `tapfix demo` stop in ten on a busy machine)."""

    server: uvicorn.Server
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, give open responses uvicorn's graceful second, and return once the thread ended."""
        self.server.should_exit = True
        self.thread.join(timeout)


def start_mock_thread(host: str, port: int, opts: MockOptions | None = None) -> MockThread:
    """The mock (MockOptions, default: the plain scripted model) served by a thread of this process."""
    from tapfix.proxy.mock import MockOptions, uvicorn_config

    server = uvicorn.Server(uvicorn_config(opts or MockOptions(), host, port))
    server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]  # the proxy owns signals
    thread = threading.Thread(target=server.run, name="tapfix-demo-mock", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise click.ClickException(f"the demo's scripted upstream could not start on {host}:{port}")
        time.sleep(0.02)
    return MockThread(server, thread)


def _commands() -> tuple[str, str]:
    """How to call tapfix and sqlite-utils from here: bare names when the venv is on PATH."""
    import os
    import shutil
    import sys

    here = Path(sys.argv[0]).resolve().parent
    if shutil.which("tapfix") and Path(shutil.which("tapfix") or "").resolve().parent == here:
        return "tapfix", "sqlite-utils"
    prefix = os.path.relpath(here)
    return f"{prefix}/tapfix", f"{prefix}/sqlite-utils"


def banner(base: str, mock_url: str, db: StoreLocator) -> str:
    tapfix, sqlite_utils = _commands()
    return f"""
tapfix demo is running.
  proxy (point clients here):  {base}/v1
  scripted upstream:           {mock_url}/v1   (model "tapfix-mock": plain text, reasoning, tool calls)
  captures:                    {db}

Try it:
  curl -s {base}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "tapfix-mock", "stream": true, "messages": [{{"role": "user", "content": "Say hello"}}]}}'

  python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base}/v1", api_key="not-needed")
reply = client.chat.completions.create(model="tapfix-mock", messages=[{{"role": "user", "content": "Say hello"}}])
print(reply.choices[0].message.content)
PY

Then look at what went over the wire:
  {tapfix} captures list --db {db}
  {tapfix} captures show <ID> --db {db}
  {tapfix} browse --db {db}          # the capture browser on http://127.0.0.1:8081
  {sqlite_utils} {db} "select id, model, status, first_token_ms from exchange_view limit 5" --table

Ctrl-C stops both.
"""


def run_demo(
    listen: tuple[str, int],
    mock_listen: tuple[str, int],
    db: StoreLocator,
    run_proxy: Callable[..., int],
) -> int:
    mock_host, mock_port = mock_listen
    mock_port = _pick_port(mock_host, mock_port)
    mock = start_mock_thread(mock_host, mock_port)
    mock_url = url(mock_host, mock_port)
    settings = Settings(upstream=mock_url, listen=listen, db=str(db.path))  # demo's store is a SQLite file
    try:
        return run_proxy(settings, banner=lambda base: click.echo(banner(base, mock_url, db)))
    finally:
        mock.stop()
