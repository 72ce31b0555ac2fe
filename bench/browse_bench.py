"""Benchmark `tapfix browse` over a big store: list, filter and search pages must answer in < 100 ms.

Builds N captures (default 100,000) in agent sessions of growing conversations, written with the
store's own schema and body writer (`open_for_writing`, `BodyWriter`, executemany), builds the
search index, starts a real `tapfix browse` process on loopback and times pages over HTTP.

    .venv/bin/python bench/browse_bench.py [--n 100000] [--db /tmp/browse-bench.db] [--keep]

Not a test: it prints a table (median and worst of --repeat runs, after one warm-up request).
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
from tapfix.proxy.ids import new_capture_id
from tapfix.proxy.store.sqlite.bodies import BodyWriter
from tapfix.proxy.store.sqlite.database import open_for_writing
from tapfix.proxy.store.sqlite.search_index import SearchIndex, sidecar_path

CLIENTS = ["opencode/0.4.2 ai-sdk/4.3.16", "omp/1.2.0", "OpenAI/Python 1.82.0", "curl/8.5.0"]
MODELS = ["qwen3-coder-30b", "qwen3-235b", "gpt-oss-120b", "llama-3.1-8b", "glm-4.5-air"]
RARE = "zanzibar"


def words(rng: random.Random, vocab: list[str], n: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(n))


def build(path: Path, n: int, seed: int = 7) -> float:
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(str(sidecar_path(path)) + suffix).unlink(missing_ok=True)
    rng = random.Random(seed)
    vocab = [
        f"{a}{b}{c}"
        for a in ("pa", "ro", "ki", "me", "su", "to", "la", "ve")
        for b in ("n", "r", "l", "s", "")
        for c in ("ix", "ota", "er", "um", "a", "io", "ent", "ay", "ost", "ide")
    ]
    vocab += ["parser", "tokenizer", "test", "function", "error", "import", "return", "file", "build", "fix"]
    conn = open_for_writing(path)
    bodies = BodyWriter(conn)
    started = time.perf_counter()
    t0 = time.time() - n * 2.0
    rows, changes, sessions = [], [], []
    conn.execute("begin")
    made = 0
    while made < n:
        sid = f"ses_{made:08d}"
        client, model = rng.choice(CLIENTS), rng.choice(MODELS)
        turns = min(rng.randint(1, 40), n - made)
        messages: list[dict] = [{"role": "system", "content": "You are a coding agent. " + words(rng, vocab, 400)}]
        for turn in range(turns):
            ts = t0 + made * 2.0
            prompt = words(rng, vocab, rng.randint(5, 60)) + (f" {RARE}" if rng.random() < 0.001 else "")
            messages.append({"role": "user" if turn == 0 or rng.random() < 0.4 else "tool", "content": prompt})
            req: dict = {"model": model, "messages": messages, "stream": True}
            if client.startswith("OpenAI") or rng.random() < 0.2:
                req["temperature"] = 0.7
            body = orjson.dumps(req)
            body_id = bodies.put(body, sid)
            answer = words(rng, vocab, rng.randint(10, 80))
            cid = new_capture_id(ts)
            status = 200 if rng.random() > 0.03 else rng.choice([400, 429, 500, 502])
            flags = []
            if rng.random() < 0.02:
                flags.append("runaway_length")
            if "temperature" not in req:
                flags.append("no_sampling_params")
            n_changes = 0
            if "temperature" not in req and rng.random() < 0.5:
                changes.append((cid, 0, "sampling", "inject", "$.temperature", "null", "0.6", "generation_config"))
                n_changes += 1
            if rng.random() < 0.01:
                changes.append(
                    (
                        cid,
                        n_changes,
                        "toolcalls",
                        rng.choice(["concatenated_json", "leaked_markup", "truncated_arguments"]),
                        "$.choices[0].tool_calls[0]",
                        '"{}{}"',
                        '"{}"',
                        "repair",
                    )
                )
                n_changes += 1
            ttft = rng.uniform(80, 2500)
            duration = ttft + rng.uniform(200, 20000)
            rows.append(
                (
                    cid,
                    ts,
                    datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="milliseconds"),
                    rng.uniform(10, 200),
                    ttft,
                    duration,
                    "127.0.0.1",
                    client,
                    "POST",
                    "/v1/chat/completions",
                    "http://127.0.0.1:8080/v1/chat/completions",
                    "http://127.0.0.1:8000/v1/chat/completions",
                    model,
                    1,
                    status,
                    None if status == 200 else f"upstream {status}",
                    sid,
                    orjson.dumps(sorted(flags)).decode(),
                    n_changes,
                    body_id,
                    len(body),
                    answer,
                    "stop",
                    len(body) // 4,
                    len(answer) // 4,
                    len(answer) // 4,
                    '[["content-type","application/json"]]',
                )
            )
            messages.append({"role": "assistant", "content": answer})
            made += 1
        sessions.append((sid, rows[-turns][2], rows[-1][2], client, model, turns))
        if len(rows) >= 5000:
            _flush(conn, rows, changes, sessions)
    _flush(conn, rows, changes, sessions)
    conn.execute("commit")
    conn.execute("pragma wal_checkpoint(truncate)")
    conn.close()
    return time.perf_counter() - started


def _flush(conn, rows: list, changes: list, sessions: list) -> None:
    conn.executemany(
        "insert into exchanges (id, ts, started_at, upstream_first_byte_ms, first_token_ms, duration_ms,"
        " client_addr, user_agent, method, path, url, upstream_url, model, stream, status, error, session_id,"
        " flags, changes_count, request_body_id, request_size, content, finish_reason, prompt_tokens,"
        " completion_tokens, chunk_count, request_headers) values (" + ",".join("?" * 27) + ")",
        rows,
    )
    conn.executemany(
        "insert into changes (exchange_id, seq, stage, kind, path, before, after, reason)"
        " values (?, ?, ?, ?, ?, ?, ?, ?)",
        changes,
    )
    conn.executemany(
        "insert into sessions (id, first_at, last_at, user_agent, model, exchanges) values (?, ?, ?, ?, ?, ?)",
        sessions,
    )
    rows.clear()
    changes.clear()
    sessions.clear()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(base: str, paths: list[tuple[str, str]], repeat: int) -> list[tuple[str, float, float, float, int]]:
    """(label, first request ms, median ms, worst ms, status): the first pays caches and cold pages."""
    out = []
    with httpx.Client(base_url=base, timeout=60) as http:
        for label, path in paths:
            t = time.perf_counter()
            http.get(path)
            first = (time.perf_counter() - t) * 1000
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                r = http.get(path)
                times.append((time.perf_counter() - t) * 1000)
            out.append((label, first, statistics.median(times), max(times), r.status_code))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--db", type=Path, default=Path("/tmp/tapfix-browse-bench.db"))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="reuse an existing db of the right size")
    args = ap.parse_args()
    if not (args.keep and args.db.exists()):
        print(f"building {args.n} captures in {args.db} ...", flush=True)
        print(f"  built in {build(args.db, args.n):.1f} s, {args.db.stat().st_size / 1e6:.0f} MB", flush=True)
    t = time.perf_counter()
    indexed = SearchIndex(args.db).catch_up(batch=2000)
    print(
        f"  search index: {indexed} new captures indexed in {time.perf_counter() - t:.1f} s,"
        f" {sidecar_path(args.db).stat().st_size / 1e6:.0f} MB",
        flush=True,
    )
    import sqlite3

    conn = sqlite3.connect(args.db)
    ids = [r[0] for r in conn.execute("select id from exchanges order by rowid desc")]
    session = conn.execute("select session_id from exchanges where id = ?", (ids[len(ids) // 3],)).fetchone()[0]
    conn.close()
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tapfix.proxy.cli.browse",
            "--db",
            str(args.db),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        start_new_session=True,
        env={**os.environ, "TAPFIX_BROWSE_TOKEN": ""},
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        mid = ids[len(ids) // 2]
        paths = [
            ("list, first page", "/"),
            ("list, page at the middle (keyset)", f"/?before={mid}"),
            ("list, last page", f"/?before={ids[-20]}"),
            ("filter model", f"/?model={MODELS[1]}"),
            ("filter client prefix", "/?client=opencode"),
            ("filter status 5xx", "/?status=5xx"),
            ("filter flag runaway_length", "/?flag=runaway_length"),
            ("filter has repairs", "/?repairs=1"),
            ("filter model+status+changes", f"/?model={MODELS[0]}&status=200&changes=1"),
            ("filter time range (last 6 h)", "/?since=6h"),
            ("search, common word", "/?q=parser"),
            ("search, two words", "/?q=parser+tokenizer"),
            ("search, rare word", f"/?q={RARE}"),
            ("search, prefix", "/?q=kir*"),
            ("search + model filter", f"/?q=fix&model={MODELS[2]}"),
            ("search, page 2", f"/?q=parser&before={mid}"),
            ("exchange page", f"/exchange/{mid}"),
            ("session page", f"/session/{session}"),
            ("sessions page", "/sessions"),
            ("stats page (all 100k)", "/stats"),
        ]
        results = measure(f"http://127.0.0.1:{port}", paths, args.repeat)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    print(f"\n{len(ids)} captures; first request, then median / worst of {args.repeat} more (loopback HTTP)\n")
    print(f"| {'page':40} | first ms | median ms | worst ms | status |")
    print(f"|{'-' * 42}|----------|-----------|----------|--------|")
    for label, first, med, worst, status in results:
        print(f"| {label:40} | {first:8.1f} | {med:9.1f} | {worst:8.1f} | {status:6} |")


if __name__ == "__main__":
    main()
