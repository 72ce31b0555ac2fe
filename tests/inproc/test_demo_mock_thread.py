"""The demo's scripted upstream runs on a thread of the proxy's process: its stop must end that thread.

A uvicorn loop (uvloop's) still running while the interpreter exits crashed `tapfix demo` with SIGSEGV at
Ctrl-C, about one stop in ten on a busy machine (a core dump showed uvloop's timer callback entering the
finalized interpreter); the process test saw it as exit -11 once in CI.
"""

from __future__ import annotations

import threading

import httpx
from tapfix.proxy.cli.demo import start_mock_thread
from tapfix.proxy.mock import MockOptions

BODY = {"model": "tapfix-mock", "stream": True, "messages": [{"role": "user", "content": "Say hello"}]}


def test_stop_returns_once_the_thread_ended_even_with_a_stream_open() -> None:
    mock = start_mock_thread("127.0.0.1", 0, MockOptions(chunk_delay_ms=400))
    opened = threading.Event()

    def read_slowly() -> None:
        try:
            with httpx.stream("POST", f"http://127.0.0.1:{mock.port}/v1/chat/completions", json=BODY) as response:
                for _ in response.iter_bytes():
                    opened.set()
        except httpx.HTTPError:
            pass  # cut by the stop: what this test is about is the server's thread, not this stream
        finally:
            opened.set()

    reader = threading.Thread(target=read_slowly)
    reader.start()
    try:
        assert opened.wait(10)
        mock.stop()
        assert not mock.thread.is_alive()
    finally:
        mock.stop()
        reader.join(10)
