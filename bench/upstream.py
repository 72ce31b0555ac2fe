"""A fast fake inference upstream for the benchmark: raw asyncio, pre-built SSE bytes, its own CPU.

Why not `tapfix mock`: the mock is a realistic Starlette app whose per-chunk cost would be as large
as the proxy's and would blur what we measure. Here each response is a list of pre-framed byte
strings (vLLM wire format, HTTP chunked encoding like uvicorn), built once per (kind, chunks) and
written one event per `write()`, optionally paced. The server counts requests and chunks and reads
its own CPU from /proc, so the runner can show that the upstream is not the bottleneck
(`GET /stats`, and a line on stderr at exit), and counts the requests tapfix's regeneration relay sent.

What tapfix asks a vLLM of its own is answered as vLLM does and counted apart from the stream requests (which
the runner checks one for one against the requests it sent): `GET /v1/models` (the model's window) and
`POST /tokenize` (the prompt's count, which tapfix's max_tokens clamp asks for a prompt whose bytes might not
fit the window: the 1 MB phase's). Counted as streams, each of those was an upstream request no client sent.

The request chooses the response with headers:
  x-bench-chunks: N        SSE events in the stream, [DONE] included (default 256)
  x-bench-delay-ms: F      pause between events (default 0 = burst)
  x-bench-kind: content | tools   plain text reply, or text then one streamed tool call
  x-bench-stamp: N         the stream lane (bench/lane.py): N content deltas `x-bench-delay-ms` apart, each
                           carrying its number and the time it was written (CLOCK_MONOTONIC, shared by
                           every process of the machine), so the client can tell each delta's delay

    python bench/upstream.py --listen 127.0.0.1:9100
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from functools import lru_cache

import orjson

ID = "chatcmpl-bench0123456789abcdef"
MODEL = "bench-model"
WORDS = (
    " the",
    " proxy",
    " streams",
    " each",
    " token",
    " to",
    " the",
    " agent",
    ",",
    " and",
    " records",
    " what",
    " went",
    " over",
    " the",
    " wire",
    ".",
    "\n",
)


def _event(delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish:
        choice["stop_reason"] = None
    obj = {
        "id": ID,
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [choice] if usage is None else [],
    }
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def tool_arguments(size: int) -> str:
    """Valid arguments of opencode's `write` (bench/agent_tools.json) of about `size` bytes (JSON text with
    escapes and newlines)."""
    line = 'def handler(event):\n    return {"ok": True, "path": "a/b.py"}  # tab\there\n'
    content = (line * (size // len(line) + 1))[: max(size - 40, 8)]
    return orjson.dumps({"filePath": "/work/src/app/handler.py", "content": content}).decode()


def split_even(text: str, parts: int) -> list[str]:
    step = max(1, -(-len(text) // max(parts, 1)))
    return [text[i : i + step] for i in range(0, len(text), step)]


@lru_cache(maxsize=64)
def sse_events(kind: str = "content", chunks: int = 256, arg_bytes: int = 0) -> tuple[bytes, ...]:
    """The stream as a tuple of whole SSE events: role, tokens (or tokens + a tool call), finish,
    usage, [DONE]. `chunks` counts every event; at least 6."""
    chunks = max(chunks, 6)
    events = [_event({"role": "assistant", "content": ""})]
    body = chunks - 4  # role, finish, usage, [DONE]
    if kind == "tools":
        text_n = max(1, body // 8)
        args = tool_arguments(arg_bytes or 2048)
        events += [_event({"content": "Sure" if i == 0 else WORDS[i % len(WORDS)]}) for i in range(text_n)]
        frags = split_even(args, body - text_n - 1)
        events.append(
            _event(
                {
                    "tool_calls": [
                        {
                            "id": "call_bench0001",
                            "type": "function",
                            "index": 0,
                            "function": {"name": "write", "arguments": ""},
                        }
                    ]
                }
            )
        )
        events += [_event({"tool_calls": [{"index": 0, "function": {"arguments": f}}]}) for f in frags]
        finish = "tool_calls"
    else:
        events += [_event({"content": "Sure" if i == 0 else WORDS[i % len(WORDS)]}) for i in range(body)]
        finish = "stop"
    events.append(_event({}, finish))
    n_out = len(events) - 1
    events.append(_event({}, usage={"prompt_tokens": 600, "total_tokens": 600 + n_out, "completion_tokens": n_out}))
    events.append(b"data: [DONE]\n\n")
    return tuple(events)


@lru_cache(maxsize=64)
def framed(kind: str, chunks: int) -> tuple[bytes, ...]:
    """The events in HTTP/1.1 chunked framing, the terminating zero chunk glued to the last one."""
    out = [b"%x\r\n%s\r\n" % (len(e), e) for e in sse_events(kind, chunks)]
    out[-1] += b"0\r\n\r\n"
    return tuple(out)


HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


STAMP_PREFIX = (
    b'data: {"id":"chatcmpl-lane","object":"chat.completion.chunk","created":1700000000,"model":"bench-model",'
    b'"choices":[{"index":0,"delta":{"content":" w'
)
STAMP_SUFFIX = b'"},"logprobs":null,"finish_reason":null}]}\n\n'


def _framed(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def stamped_delta(seq: int) -> bytes:
    """One lane delta, framed: ` w<seq>@<monotonic seconds>` as its content."""
    return _framed(STAMP_PREFIX + b"%d@%.6f" % (seq, time.monotonic()) + STAMP_SUFFIX)


STAMP_HEAD = _framed(_event({"role": "assistant", "content": ""}))
STAMP_TAIL = (
    _framed(_event({}, "stop"))
    + _framed(_event({}, usage={"prompt_tokens": 600, "total_tokens": 664, "completion_tokens": 64}))
    + _framed(b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
)


def cpu_ns(pid: int | str = "self") -> int:
    """utime+stime of the whole process, all threads, in ns (clock-tick resolution)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


# A 1M-token window (as Qwen2.5-1M's): the 1 MB phase's prompts (~260k tokens by `prompt_tokens`) fit it. On a
# smaller one a vLLM refuses them, and tapfix, told their count, answers them itself (a context overflow).
# (Its own name: as `MODEL` it replaced the model's name in every stream event built after import.)
MODEL_ENTRY = {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 1 << 20}
BYTES_PER_TOKEN = 4  # about what an English BPE tokenizer makes of prose and JSON


def prompt_tokens(body: bytes) -> int:
    """The count vLLM's `/tokenize` would give a `{"model", "messages"}` body, about: its bytes over
    BYTES_PER_TOKEN (the bench's prompts are padding; no tokenizer is worth its CPU here)."""
    return max(1, len(body) // BYTES_PER_TOKEN)


def tokenize_answer(body: bytes) -> bytes:
    """vLLM's `POST /tokenize` answer: the count and the window (no token ids: tapfix reads the count)."""
    return orjson.dumps({"count": prompt_tokens(body), "max_model_len": MODEL_ENTRY["max_model_len"], "tokens": []})


class Server:
    def __init__(self) -> None:
        self.requests = 0
        self.models_asked = 0  # GET /v1/models: tapfix asks a vLLM for its window (cached), not a stream request
        self.tokenize_asked = 0  # POST /tokenize: tapfix's clamp asks a long prompt's count, not a stream request
        self.chunks = 0
        self.started = time.monotonic()

    def stats(self) -> dict:
        return {
            "requests": self.requests,
            "models_asked": self.models_asked,
            "tokenize_asked": self.tokenize_asked,
            "chunks": self.chunks,
            "cpu_ns": cpu_ns(),
            "uptime_s": round(time.monotonic() - self.started, 3),
            "pid": os.getpid(),
        }

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                line, _, rest = head.partition(b"\r\n")
                headers = {}
                for h in rest.split(b"\r\n"):
                    k, sep, v = h.partition(b":")
                    if sep:
                        headers[k.strip().lower()] = v.strip()
                length = int(headers.get(b"content-length", b"0"))
                request_body = await reader.readexactly(length) if length else b""
                path = line.split(b" ")[1] if b" " in line else b"/"
                if path.startswith(b"/stats"):
                    await self.json(writer, orjson.dumps(self.stats()))
                    continue
                if path.startswith(b"/v1/models"):  # as vLLM lists its model, with its window
                    self.models_asked += 1
                    await self.json(writer, orjson.dumps({"object": "list", "data": [MODEL_ENTRY]}))
                    continue
                if path.startswith(b"/tokenize"):  # as vLLM counts a prompt
                    self.tokenize_asked += 1
                    await self.json(writer, tokenize_answer(request_body))
                    continue
                await self.stream(writer, headers)
                if headers.get(b"connection", b"").lower() == b"close":
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    @staticmethod
    async def json(writer: asyncio.StreamWriter, body: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()

    async def stream(self, writer: asyncio.StreamWriter, headers: dict) -> None:
        if b"x-bench-stamp" in headers:
            await self.stamped(writer, int(headers[b"x-bench-stamp"]), float(headers[b"x-bench-delay-ms"]) / 1000)
            return
        kind = headers.get(b"x-bench-kind", b"content").decode()
        chunks = int(headers.get(b"x-bench-chunks", b"256"))
        delay = float(headers.get(b"x-bench-delay-ms", b"0")) / 1000
        frames = framed(kind, chunks)
        self.requests += 1
        self.chunks += len(frames)
        writer.write(HEAD)
        for i, frame in enumerate(frames):
            writer.write(frame)
            if delay and i + 1 < len(frames):
                await writer.drain()
                await asyncio.sleep(delay)
        await writer.drain()

    async def stamped(self, writer: asyncio.StreamWriter, deltas: int, gap_s: float) -> None:
        """The lane's stream: timer callbacks, not a sleeping coroutine per stream, so hundreds of streams
        cost the upstream little; on its own pace (the nth delta is due n gaps after the first), late ones
        catching up."""
        transport = writer.transport
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        start = loop.time()
        self.requests += 1
        self.chunks += deltas + 4

        def tick(seq: int) -> None:
            if transport.is_closing():
                done.set_result(None)
                return
            transport.write(stamped_delta(seq))
            if seq + 1 < deltas:
                loop.call_at(start + (seq + 1) * gap_s, tick, seq + 1)
            else:
                transport.write(STAMP_TAIL)
                done.set_result(None)

        transport.write(HEAD + STAMP_HEAD)
        tick(0)
        await done
        await writer.drain()


async def serve(host: str, port: int) -> None:
    server = Server()
    srv = await asyncio.start_server(server.handle, host, port, backlog=512)
    print(f"ready {srv.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with srv:
        await stop.wait()
    s = server.stats()
    print(
        f"upstream: {s['requests']} requests, {s['chunks']} chunks, cpu {s['cpu_ns'] / 1e6:.0f} ms "
        f"(and {s['models_asked']} model lists, {s['tokenize_asked']} prompt counts)",
        file=sys.stderr,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", default="127.0.0.1:9100")
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    asyncio.run(serve(host or "127.0.0.1", int(port)))


if __name__ == "__main__":
    main()
