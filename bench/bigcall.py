"""Peak memory of tapfix for one huge streamed tool call (the QA pass: 20 MB of arguments peaked at ~350 MB).

Why: a tool call's arguments are held back until they can be checked (DESIGN.md invariant 4), and the
capture keeps the exact bytes; each further copy of a big argument (decoded strings, joined fragments,
parsed JSON, the assembled message, store bodies) costs its size again. A raw asyncio upstream streams
one `write` call whose `content` is MB megabytes, in 64 KB fragments, to a `tapfix run` with the
request's `tools` armed; the client checks the arguments arrive whole. Reported: tapfix's VmHWM minus
its RSS before the request (its peak for this one call), as a multiple of the payload, and its CPU.

    .venv/bin/python bench/bigcall.py [--tapfix PATH] [--mb 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import cpu_ns, memory_kb, wait_idle  # noqa: E402
from startup import ROOT, _free_port, _wait_port  # noqa: E402

PIECE = 65536
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write",
            "parameters": {
                "type": "object",
                "properties": {"filePath": {"type": "string"}, "content": {"type": "string"}},
                "required": ["filePath", "content"],
            },
        },
    }
]


def _event(delta: dict, finish: str | None = None) -> bytes:
    chunk = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return b"%x\r\n" % len(data) + data + b"\r\n"


def _call(index_args: str) -> dict:
    return {"tool_calls": [{"index": 0, "function": {"arguments": index_args}}]}


async def _serve(port: int, mb: int, ready: threading.Event) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:  # a connection that only checked the port
            return
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        opening = {"index": 0, "id": "call_big", "type": "function", "function": {"name": "write", "arguments": ""}}
        writer.write(_event({"role": "assistant", "tool_calls": [opening]}))
        writer.write(_event(_call('{"filePath": "big.txt", "content": "')))
        for _ in range(mb * 1024 * 1024 // PIECE):
            writer.write(_event(_call("x" * PIECE)))
            await writer.drain()
        writer.write(_event(_call('"}')))
        writer.write(_event({}, "tool_calls"))
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n" % len(done) + done + b"\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    ready.set()
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tapfix", default=str(ROOT / ".venv" / "bin" / "tapfix"))
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--tapfix-arg", action="append", default=[], help="extra `tapfix run` arguments")
    args = ap.parse_args()
    up_port, port = _free_port(), _free_port()
    ready = threading.Event()
    threading.Thread(target=lambda: asyncio.run(_serve(up_port, args.mb, ready)), daemon=True).start()
    ready.wait(10)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [args.tapfix, "run", "--upstream", f"http://127.0.0.1:{up_port}", "--listen", f"127.0.0.1:{port}"]
        argv += ["--db", f"{tmp}/c.db", *args.tapfix_arg]
        proxy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_port(port, proxy)
            wait_idle({"proxy": proxy.pid})
            before_rss, before_cpu = memory_kb(proxy.pid)["VmRSS"], cpu_ns(proxy.pid)
            body = {"model": "m", "stream": True, "tools": TOOLS, "messages": [{"role": "user", "content": "big"}]}
            arguments = []
            started = time.monotonic()
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        for choice in json.loads(line[6:]).get("choices") or []:
                            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                                arguments.append((call.get("function") or {}).get("arguments") or "")
            seconds = time.monotonic() - started
            whole = json.loads("".join(arguments))
            assert whole["content"] == "x" * (args.mb * 1024 * 1024 // PIECE * PIECE), (
                "the arguments did not arrive whole"
            )
            time.sleep(1.5)  # the writer stores the capture
            wait_idle({"proxy": proxy.pid}, max_s=60)
            mem = memory_kb(proxy.pid)
            peak_mb = (mem["VmHWM"] - before_rss) / 1024
            cpu_s = (cpu_ns(proxy.pid) - before_cpu) / 1e9
        finally:
            proxy.terminate()
            proxy.wait(30)
    print(
        f"{args.mb} MB call: peak +{peak_mb:.0f} MB over the idle RSS ({peak_mb / args.mb:.1f}x the payload), "
        f"after it {(mem['VmRSS'] - before_rss) / 1024:.0f} MB, CPU {cpu_s:.2f} s, {seconds:.1f} s wall"
    )


if __name__ == "__main__":
    main()
