"""What OTLP span export adds per exchange, in CPU µs: the part a ratio of two noisy processes can't resolve.

Why: bench/run measures export on against off side by side (the `--otlp` twin), but on this shared
2-core machine its per-round ratios spread by ±20%, far wider than the issue's 5% target. This counts
the work export adds, exchange by exchange, in one process: a real `CaptureWriter` stores a 256-event
chat stream (bench/upstream.py's wire bytes) and hands its observers the `Written`; then the script times
what runs for it with export on and not with export off: the span (`spans.span_of`) and its OTLP
protobuf encoding (what the HTTP exporter sends). The `Turn` (`turn.turn_from`) is built with export
off too (the metrics need it), so it is shown apart. Divide by a 256-chunk request's whole CPU from
bench/run's table (fixed + 256 x per chunk) for the share.

    .venv/bin/python bench/export_cost.py [--chunks 256] [--repeat 500]
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter, Written
from tapfix.proxy.telemetry.config import export_config
from tapfix.proxy.telemetry.spans import resource_of, scope, span_of
from tapfix.proxy.telemetry.turn import TurnContext, turn_from

sys.path.insert(0, str(Path(__file__).resolve().parent))
from upstream import sse_events  # noqa: E402


def written_stream(db: Path, chunks: int) -> Written:
    """One 256-event stream with a 2 KB request, stored by the real writer: what its observers get."""
    request = {
        "model": "coder",
        "stream": True,
        "temperature": 0.2,
        "messages": [{"role": "user", "content": "x" * 2048}],
    }
    ex = Exchange(method="POST", path="/v1/chat/completions", url="http://127.0.0.1:8080/v1/chat/completions")
    ex.request = json.dumps(request).encode()
    ex.note_request_json(request)
    ex.upstream_url, ex.extra["target"] = "http://127.0.0.1:8000/v1/chat/completions", "local"
    ex.status, ex.content_type = 200, "text/event-stream"
    ex.response_chunks = list(sse_events("content", chunks))
    ex.chunk_times = [0.002 * (i + 1) for i in range(chunks)]
    ex.trace_id, ex.span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    ex.ended_at = ex.mark + 0.002 * (chunks + 1)
    told: queue.Queue[Written] = queue.Queue()
    writer = CaptureWriter(db)
    writer.observers.append(told.put)
    writer.submit(ex)
    written = told.get(timeout=30)
    writer.close()
    return written


def per_call(fn, repeat: int) -> float:
    fn()
    start = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - start) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tapfix-export-cost-") as tmp:
        written = written_stream(Path(tmp) / "c.db", args.chunks)
    cfg = export_config("http://127.0.0.1:4318", {}, "http://127.0.0.1:8090")
    assert cfg is not None
    context = TurnContext(engine_of={"local": "vllm"}.get)
    turn = turn_from(written, context)
    resource, instrumentation = resource_of(cfg), scope()
    build = per_call(lambda: turn_from(written, context), args.repeat)
    span = per_call(lambda: span_of(turn, cfg, resource, instrumentation), args.repeat)
    batch = [span_of(turn, cfg, resource, instrumentation) for _ in range(512)]
    encode = per_call(lambda: encode_spans(batch).SerializeToString(), max(args.repeat // 50, 5)) / len(batch)
    print(f"one {args.chunks}-event chat stream, CPU µs per exchange ({args.repeat} repeats)")
    print(f"  the Turn (turn_from; export off too: the metrics read it)  {build:8.1f} µs")
    print(f"  export only: the span (span_of)                            {span:8.1f} µs")
    print(f"  export only: OTLP protobuf encoding, in batches of 512     {encode:8.1f} µs")
    print(f"  export adds                                                {span + encode:8.1f} µs per exchange")


if __name__ == "__main__":
    main()
