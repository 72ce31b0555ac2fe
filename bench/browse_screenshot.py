"""Make docs/img/exchange.png: one exchange page of `tapfix browse`, shot by headless Chromium.

The capture shows most of the page at once: a sampling injection (the request diff), reasoning,
a repaired tool call (before and after) and a streamed answer with a stall in its timeline.

    .venv/bin/python bench/browse_screenshot.py [--out docs/img/exchange.png]
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repo's tests/ helpers
from tests.support.chromium import CHROMIUM, FLAGS  # noqa: E402


def showcase(path: Path) -> str:
    messages = [
        {"role": "system", "content": "You are opencode, an interactive CLI coding agent."},
        {"role": "user", "content": "The date parser test is flaky. Find out why and fix it."},
    ]
    client = orjson.dumps(
        {
            "model": "qwen3-coder",
            "messages": messages,
            "stream": True,
            "tools": [{"type": "function", "function": {"name": "read"}}],
        }
    )
    forwarded = client[:-1].replace(b'"qwen3-coder"', b'"Qwen/Qwen3-Coder-30B-A3B-Instruct"')
    forwarded += b',"temperature":0.7,"top_p":0.8,"top_k":20}'
    args = '{"filePath": "tests/test_dates.py"}'

    def ev(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
        obj: dict = {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage:
            obj["usage"] = usage
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    thoughts = "The test depends on the local time zone; I should read the test first.".split(" ")
    chunks = [ev({"reasoning_content": w + " "}) for w in thoughts]
    chunks += [ev({"content": w + " "}) for w in "Let me read the test file.".split(" ")]
    chunks += [
        ev(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": "read", "arguments": args},
                    }
                ]
            }
        ),
        ev({}, "tool_calls", {"prompt_tokens": 5120, "completion_tokens": 41}),
        b"data: [DONE]\n\n",
    ]
    times = [0.62 + 0.025 * i for i in range(len(thoughts))]
    times += [times[-1] + 1.9 + 0.025 * i for i in range(len(chunks) - len(times))]
    mark = time.perf_counter()
    ex = Exchange(
        method="POST",
        path="/v1/chat/completions",
        url="http://127.0.0.1:8080/v1/chat/completions",
        upstream_url="http://gpu-box:8000/v1/chat/completions",
        user_agent="opencode/0.4.2 ai-sdk/4.3.16",
        model="qwen3-coder",
        served_model="Qwen/Qwen3-Coder-30B-A3B-Instruct",
        stream=True,
        request=client,
        forwarded=forwarded,
        client_addr="127.0.0.1",
        request_headers=[
            ("user-agent", "opencode/0.4.2"),
            ("authorization", "Bearer sk-live-123"),
            ("x-session-id", "ses_demo"),
        ],
        status=200,
        response_headers=[("content-type", "text/event-stream")],
        content_type="text/event-stream",
        response_chunks=chunks,
        chunk_times=times,
        mark=mark,
        response_started_at=mark + 0.21,
        ended_at=mark + times[-1] + 0.01,
        changes=[
            Change("router", "rename", "$.model", "qwen3-coder", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "alias"),
            Change("sampling", "inject", "$.temperature", None, 0.7, "generation_config.json"),
            Change("sampling", "inject", "$.top_p", None, 0.8, "generation_config.json"),
            Change("sampling", "inject", "$.top_k", None, 20, "generation_config.json"),
            Change(
                "toolcalls",
                "concatenated_json",
                "$.choices[0].tool_calls[0].function.arguments",
                args + args,
                args,
                "the model emitted the arguments object twice",
            ),
        ],
    )
    writer = CaptureWriter(path)
    writer.submit(ex)
    writer.close()
    return ex.id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img/exchange.png"))
    args = ap.parse_args()
    chromium = CHROMIUM
    if chromium is None:
        sys.exit("chromium is not installed: apt-get install -y chromium")
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "captures" / "tapfix.db"
        capture_id = showcase(db)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tapfix.proxy.cli.browse",
                "--db",
                "captures/tapfix.db",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            start_new_session=True,
            cwd=tmp,
        )
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [
                    chromium,
                    *FLAGS,
                    f"--user-data-dir={tmp}/profile",
                    f"--screenshot={args.out.resolve()}",
                    "--window-size=1280,2300",
                    f"http://127.0.0.1:{port}/exchange/{capture_id}",
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
