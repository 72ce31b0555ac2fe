"""Storage benchmark: a long agent session through the real CaptureWriter; size, write CPU, exactness.

Why: an agent resends its whole conversation every turn, so a 100-turn session is ~50 MB of raw
request bytes that differ by a few KB each. The target is that the capture store keeps such a
session in ≤ 5% of the raw request bytes on disk (db + WAL after a clean close, which checkpoints),
that every body reads back byte for byte, and that storing a turn costs at most a few ms of CPU
even when the body is 1 MB. This drives the same code path as `tapfix run` (Exchange → submit →
writer thread) with opencode-shaped requests and vLLM-shaped streamed responses (a tool call per
turn), and reads the writer thread's own CPU from /proc/self/task/TID/schedstat.

    .venv/bin/python bench/storage.py [--turns 120] [--final-kb 1000]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.sqlite.database import open_for_reading
from tapfix.proxy.store.sqlite.reader import capture_body, load_capture
from tapfix.proxy.store.writer import CaptureWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream import sse_events  # noqa: E402

WORDS = (
    "def class return self value path file import from if else for in while try except with as "
    "the a to of and is it that this test error result data config name list dict str int None True "
    "False await async yield lambda raise assert print open read write json load dump os sys time"
).split()


def text(rng: random.Random, size: int) -> str:
    """Code-like text that compresses about as well as real source (3-4×), not to nothing."""
    out, n = [], 0
    while n < size:
        line = " " * rng.choice((0, 4, 8, 12)) + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        line += rng.choice(("", ":", "()", f"({rng.randint(0, 9999)})", f" = {rng.random():.6f}", ",")) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out)[:size]


def tools(rng: random.Random, size: int = 20_000) -> list[dict]:
    out, n, i = [], 0, 0
    while n < size:
        desc = text(rng, 700)
        out.append(
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}",
                    "description": desc,
                    "parameters": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                        "required": ["path"],
                    },
                },
            }
        )
        n += len(desc) + 200
        i += 1
    return out


def session(turns: int, final_kb: int, seed: int = 7):
    """Yield (request body, response events, tool-call arguments) for each turn of one growing chat."""
    rng = random.Random(seed)
    system = {"role": "system", "content": text(rng, 10_000)}
    tool_list = tools(rng)
    messages = [system, {"role": "user", "content": "Fix the failing tests in src/ and explain what broke."}]
    per_turn = max(500, (final_kb * 1024 - 32_000) // max(turns, 1))
    for turn in range(turns):
        body = {
            "model": "qwen3-coder",
            "messages": messages,
            "tools": tool_list,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 32000,
        }
        raw = orjson.dumps(body)
        args = orjson.dumps({"path": f"src/mod_{turn % 17}.py", "content": text(rng, per_turn // 5)}).decode()
        yield raw, response_events(args, turn), args
        call_id = f"call_{turn:04d}"
        messages = messages + [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "tool_1", "arguments": args}}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": text(rng, per_turn - len(args) - 200)},
        ]


def response_events(args: str, turn: int) -> list[bytes]:
    """The assistant's streamed turn: a few words, then the tool call in ~20-byte fragments."""
    events = list(sse_events("content", 24))[:-3]
    frags = [args[i : i + 20] for i in range(0, len(args), 20)]
    head = {"id": f"call_{turn:04d}", "type": "function", "index": 0, "function": {"name": "tool_1", "arguments": ""}}
    for tc in [head] + [{"index": 0, "function": {"arguments": f}} for f in frags]:
        obj = {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "qwen3-coder",
            "choices": [{"index": 0, "delta": {"tool_calls": [tc]}, "logprobs": None, "finish_reason": None}],
        }
        events.append(b"data: " + orjson.dumps(obj) + b"\n\n")
    return events + list(sse_events("content", 24))[-3:]


def thread_cpu_ns(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
        return int(f.read().split()[0])


def agent_turn(
    body: bytes, events: list[bytes], session_id: str, headers: tuple[tuple[str, str], ...] = ()
) -> Exchange:
    """One finished streamed turn of an opencode-like agent, as the addons hand it to the writer (the bench's
    store fillers share it, so every store they fill looks alike)."""
    ex = Exchange(
        method="POST",
        path="/v1/chat/completions",
        url="http://127.0.0.1:8000/v1/chat/completions",
        user_agent="opencode/0.15 ai-sdk/5",
        model="qwen3-coder",
        stream=True,
        request=body,
        request_headers=[("content-type", "application/json"), ("x-session-id", session_id), *headers],
    )
    ex.status, ex.content_type = 200, "text/event-stream"
    ex.response_headers = [("content-type", "text/event-stream")]
    ex.response_chunks = events
    ex.chunk_times = [0.001 * (i + 1) for i in range(len(events))]
    return ex


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=120)
    ap.add_argument("--final-kb", type=int, default=1000, help="size of the last request body")
    ap.add_argument("--keep", type=Path, help="write the db here instead of a temp dir")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tapfix-storage-"))
    db = a.keep or work / "session.db"
    writer = CaptureWriter(db)
    tid = writer._thread.native_id
    raw_req = raw_resp = 0
    cpu_turn: list[tuple[int, float]] = []  # (body size, writer CPU ms)
    originals: dict[str, tuple[bytes, bytes]] = {}
    for turn, (body, events, _args) in enumerate(session(a.turns, a.final_kb)):
        ex = agent_turn(
            body, events, "ses_bench01", [("authorization", "Bearer sk-bench"), ("user-agent", "opencode/0.15")]
        )
        ex.response_started_at, ex.ended_at = ex.mark + 0.001, ex.mark + 0.001 * (len(events) + 1)
        raw_req += len(body)
        raw_resp += sum(map(len, events))
        originals[ex.id] = (body, b"".join(events))
        before = thread_cpu_ns(tid)
        writer.submit(ex)
        while writer.stats.written + writer.stats.failures < turn + 1:
            time.sleep(0.0005)
        cpu_turn.append((len(body), (thread_cpu_ns(tid) - before) / 1e6))
    writer.close()
    if writer.stats.failures:
        raise SystemExit(f"writer failures: {writer.stats.last_error}")
    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    conn = open_for_reading(db)
    bad, read_ms = 0, []
    for capture_id, (body, resp) in originals.items():
        t = time.perf_counter()
        capture = load_capture(conn, capture_id)
        ok = capture_body(conn, capture, "request") == body and capture_body(conn, capture, "response") == resp
        read_ms.append((time.perf_counter() - t) * 1000)
        bad += not ok
    conn.close()
    big = [ms for n, ms in cpu_turn if n >= 0.9 * cpu_turn[-1][0]]
    ratio = size / raw_req
    print(
        f"session: {a.turns} turns, request bodies {cpu_turn[0][0] / 1024:.0f} KB → {cpu_turn[-1][0] / 1024:.0f} KB, "
        f"raw requests {raw_req / 2**20:.1f} MB, raw responses {raw_resp / 2**20:.2f} MB"
    )
    print(
        f"on disk after close (db + wal): {size / 2**20:.2f} MB = {ratio * 100:.2f}% of raw request bytes "
        f"→ {'PASS' if ratio <= 0.05 else 'MISS'} (target ≤ 5%)"
    )
    print(
        f"writer CPU per turn: median {statistics.median(ms for _, ms in cpu_turn):.2f} ms, "
        f"max {max(ms for _, ms in cpu_turn):.2f} ms; at the largest bodies (≥ 90% of the last, "
        f"{len(big)} turns): median {statistics.median(big):.2f} ms, max {max(big):.2f} ms"
    )
    worst = sorted(range(len(cpu_turn)), key=lambda i: -cpu_turn[i][1])[:3]
    slowest = ", ".join(f"#{i + 1} ({cpu_turn[i][0] / 1024:.0f} KB) {cpu_turn[i][1]:.1f} ms" for i in worst)
    print(
        "  slowest turns: "
        + slowest
        + " — a full (non-delta) body every bodies.MAX_DEPTH turns; the first turn also creates the db"
    )
    print(
        f"read-back: {len(originals) - bad}/{len(originals)} exchanges byte-exact (request and response) "
        f"→ {'PASS' if not bad else 'MISS'}; read time per exchange median {statistics.median(read_ms):.1f} ms, "
        f"max {max(read_ms):.1f} ms"
    )
    if not a.keep:
        for p in work.iterdir():
            p.unlink()
        os.rmdir(work)


if __name__ == "__main__":
    main()
