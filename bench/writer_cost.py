"""What the capture writer's thread spends per exchange (issue 34): the real `CaptureWriter` transaction.

Why: the writer assembles, digests and stores every exchange on one thread that takes the GIL from the
event loop, and streams that end together land on it together. Two workloads, batches of 8 exchanges per
transaction (as under load), SQLite:
  profile: bench/profile.py's request (32 KB, opencode's tools, no session) every time, a 256-event content answer
  thread:  one agent's thread of turns growing (x-session-id), answers alternating content and a tool call
The answers pass the real `StreamPipeline` with the chat repair stage armed, as in `tapfix run`. Prints
`time.thread_time` per exchange; for a count that holds on a loaded machine, run it under callgrind twice,
`WRITE=1` and `WRITE=0` (everything but the measured transactions), and divide the difference by N:

    .venv/bin/python bench/writer_cost.py                    # N=96 ROUNDS=3 KINDS=profile,thread CHUNKS=256
    PYTHONHASHSEED=0 KINDS=profile N=32 WRITE=0 valgrind --tool=callgrind .venv/bin/python bench/writer_cost.py
"""

from __future__ import annotations

import copy
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load import AGENT_BODY, request_body  # noqa: E402
from tapfix.proxy.assemble import assemble_sse  # noqa: E402
from tapfix.proxy.exchange import Exchange  # noqa: E402
from tapfix.proxy.ids import new_capture_id  # noqa: E402
from tapfix.proxy.jsonbody import PARSED_KEY, STORE_PARSE_KEY, note_parse  # noqa: E402
from tapfix.proxy.response.pipeline import StreamPipeline  # noqa: E402
from tapfix.proxy.store.kept import as_text  # noqa: E402
from tapfix.proxy.store.writer import CaptureWriter  # noqa: E402
from tapfix.proxy.surfaces import surface_for  # noqa: E402
from tapfix.proxy.toolcalls import stage_for  # noqa: E402
from upstream import sse_events  # noqa: E402


def streamed(body: bytes, events: tuple[bytes, ...], headers: list[tuple[str, str]]) -> Exchange:
    parsed = orjson.loads(body)
    ex = Exchange(
        method="POST",
        path="/v1/chat/completions",
        url="http://127.0.0.1:8000/v1/chat/completions",
        upstream_url="http://127.0.0.1:9000/v1/chat/completions",
        client_addr="127.0.0.1",
        user_agent="opencode/0.15 ai-sdk/5",
        request=body,
        request_headers=[("content-type", "application/json"), *headers],
    )
    ex.note_request_json(parsed)
    note_parse(ex.extra, body, parsed)  # what the router hands on: the capture writer reads the request from it
    ex.status, ex.content_type = 200, "text/event-stream"
    ex.response_headers = [("content-type", "text/event-stream")]
    ex.response_started_at = ex.started_at + 0.01
    stage = stage_for(surface_for(ex.path), ex.tools or [], "error", ex.id)
    pipe = StreamPipeline(ex, [stage] if stage else [])
    t = 0.0
    for e in events:
        pipe(e)
        t += 0.001
        ex.chunk_times.append(t)
    pipe(b"")
    ex.ended_at = ex.started_at + 0.3
    return ex


def fresh(ex: Exchange) -> Exchange:
    """A new capture of the same bytes (new id), as the next request would be."""
    new = copy.copy(ex)
    new.id = new_capture_id()
    new.started_at = time.time()
    new.flags, new.tags, new.changes, new.extra = set(ex.flags), set(ex.tags), list(ex.changes), {}
    note_parse(new.extra, ex.request, orjson.loads(ex.request))  # each request's own parse
    new.prefix_break = None
    return new


def profile_exchanges(n: int) -> list[Exchange]:
    body = request_body(AGENT_BODY, tools=True)
    proto = streamed(body, sse_events("content", CHUNKS), [])
    return [fresh(proto) for _ in range(n)]


def thread_exchanges(n: int) -> list[Exchange]:
    base = orjson.loads(request_body(AGENT_BODY, tools=True))
    messages = base["messages"]
    out = []
    for turn in range(n):
        body = orjson.dumps({**base, "messages": messages})
        kind = "tools" if turn % 2 else "content"
        ex = streamed(body, sse_events(kind, CHUNKS), [("x-session-id", "ses_bench")])
        out.append(ex)
        a = assemble_sse(ex.client_response_chunks or ex.response_chunks, ex.path)
        msg = {"role": "assistant", "content": a.content}
        if a.tool_calls:
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in a.tool_calls
            ]
            messages = [*messages, msg, {"role": "tool", "tool_call_id": a.tool_calls[0]["id"], "content": "ok " * 400}]
        else:
            messages = [*messages, msg, {"role": "user", "content": f"next step {turn} " * 40}]
    return out


WRITE = os.environ.get("WRITE", "1") == "1"
CHUNKS = int(os.environ.get("CHUNKS", "256"))  # events per answer (16: the fixed part dominates)


def run(kind: str, n: int, batch: int = int(os.environ.get("BATCH", "8"))) -> float:
    exchanges = profile_exchanges(n + batch) if kind == "profile" else thread_exchanges(n + batch)
    gc.collect()
    gc.freeze()  # the prepared exchanges aside: a full collection over them would land in one run, not the other
    with tempfile.TemporaryDirectory() as tmp:
        writer = CaptureWriter(Path(tmp) / "c.db")
        try:
            spent = 0.0
            warm = [as_text(e) for e in exchanges[:batch]]  # imports, caches: in both WRITE modes
            assert writer._transaction(warm, writer._write_one) is None
            for i in range(batch, n + batch, batch):
                part = [as_text(e) for e in exchanges[i : i + batch]]
                t0 = time.thread_time()
                err = writer._transaction(part, writer._write_one) if WRITE else None
                if WRITE:  # the request's parse goes with the exchange, whichever thread lets go of it
                    for e in part:
                        e.extra.pop(STORE_PARSE_KEY, None), e.extra.pop(PARSED_KEY, None)
                spent += time.thread_time() - t0
                assert err is None, err
        finally:
            writer.close()
            gc.unfreeze()
    return spent / n * 1e6


if __name__ == "__main__":
    rounds = int(os.environ.get("ROUNDS", "3"))
    n = int(os.environ.get("N", "96"))
    for kind in os.environ.get("KINDS", "profile,thread").split(","):
        vals = sorted(run(kind, n) for _ in range(rounds))
        middle = vals[len(vals) // 2]
        print(f"{kind:8s} µs/exchange: min {vals[0]:.0f} median {middle:.0f}  all {[round(v) for v in vals]}")
