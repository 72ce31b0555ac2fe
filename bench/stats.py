"""The token-volume report at scale (issue 38): `captures stats` over 10^6 captures on SQLite and PostgreSQL.

Each store is made and migrated by its real writer, then filled in bulk (one transaction of
`executemany` on SQLite, COPY on PostgreSQL: the report reads columns, so the rows carry every column it
reads and none of the bodies) with a week of synthetic traffic: 5 models, 4 routes (one in four
exchanges without), 3 upstreams (two local, one cloud), 4 clients, 20,000 sessions, 3% failures, 2%
with a tool call repaired (a `changes` row), 2% regeneration attempts. Then each report is timed
through the store's reader (`CaptureReader.token_volume`, `volume_by_hour`: what the CLI and the
browser call), best of `--repeat`, over the whole week and over its last day (`--since 1d`).

    .venv/bin/python bench/stats.py                        # 10^6 rows, both stores
    .venv/bin/python bench/stats.py --rows 100000 --stores sqlite
"""

from __future__ import annotations

import argparse
import datetime
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from tapfix.proxy.store.filters import Filters  # noqa: E402
from tapfix.proxy.store.locator import StoreLocator  # noqa: E402

MODELS = ("qwen3-coder-30b", "qwen3-235b", "gpt-oss-120b", "claude-haiku-4-5", "glm-4.5-air")
ROUTES = (None, "default", "long-context", "background", "subagent")
UPSTREAMS = (
    "http://127.0.0.1:8000/v1/chat/completions",
    "http://gpu1.lan:8080/v1/messages",
    "https://api.cloud.example/v1/chat/completions",
)
AGENTS = (
    "opencode/0.4.1 ai-sdk/provider-utils/2",
    "claude-cli/2.0.1 (external, cli)",
    "OpenAI/Python 1.99.0",
    "pi/0.9",
)
COLUMNS = (
    "id",
    "ts",
    "started_at",
    "model",
    "route",
    "upstream_url",
    "user_agent",
    "session_id",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "first_token_ms",
    "duration_ms",
    "changes_count",
    "attempt_of",
    "attempt",
    "method",
    "path",
    "request_headers",
    "response_headers",
    "content",
)
WEEK = 7 * 86400
# What makes a real row wide (its headers and its answer's text): the report must not read it.
HEADERS = '[["content-type", "application/json"], ["user-agent", "opencode/0.4.1"]' + ', ["x-pad", "abcdef"]' * 30 + "]"
TEXT = "".join(random.Random(1).choice("abcdefghij klmnop\n") for _ in range(4000))
GROUPINGS = ("model", "route", "route,upstream", "client", "session", "model,route,upstream,client")


def rows(n: int, end: float, seed: int = 38) -> Iterator[tuple[Any, ...]]:
    """n synthetic exchanges, oldest first, spread over the week before `end`."""
    rng = random.Random(seed)
    step = WEEK / n
    previous = None
    for i in range(n):
        ts = end - WEEK + i * step
        attempt = previous is not None and rng.random() < 0.02
        prompt = rng.randint(200, 120_000)
        ttft = rng.uniform(50, 4000)
        out = rng.randint(1, 4000)
        row = (
            f"{int(ts * 1000):013x}{i:012x}",
            ts,
            datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="milliseconds"),
            MODELS[rng.randrange(5)],
            ROUTES[rng.randrange(5)] if rng.random() < 0.8 else None,
            UPSTREAMS[rng.randrange(3)],
            AGENTS[rng.randrange(4)],
            f"ses_{rng.randrange(20_000)}",
            500 if rng.random() < 0.03 else 200,
            prompt,
            out,
            rng.randint(0, prompt) if rng.random() < 0.6 else None,
            rng.randint(0, out) if rng.random() < 0.3 else None,
            ttft,
            ttft + out * rng.uniform(5, 40),
            1 if rng.random() < 0.04 else 0,
            previous if attempt else None,
            2 if attempt else 1,
            "POST",
            "/v1/chat/completions",
            HEADERS,
            HEADERS[:400],
            TEXT[i % 1000 : i % 1000 + rng.randint(200, 3000)],  # answers as wide as real ones
        )
        previous = row[0]
        yield row


def fill_sqlite(path: Path, n: int, end: float) -> None:
    import sqlite3

    StoreLocator.of(path).backend().writer().close()  # made and migrated by the real writer
    conn = sqlite3.connect(path)
    conn.execute("pragma synchronous = off")
    marks = ", ".join("?" * len(COLUMNS))
    with conn:
        changes = []
        for row in rows(n, end):
            if row[15]:
                changes.append((row[0], 1, "toolcalls" if int(row[0][-1], 16) % 2 else "sampling", "repair", "$.x"))
        conn.executemany(f"insert into exchanges ({', '.join(COLUMNS)}) values ({marks})", rows(n, end))
        conn.executemany("insert into changes (exchange_id, seq, stage, kind, path) values (?, ?, ?, ?, ?)", changes)
    conn.execute("analyze")
    conn.close()


def fill_pg(dsn: str, n: int, end: float) -> None:
    import psycopg

    StoreLocator.resolve(dsn, postgres=True).backend().writer(wait=False).close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        day = datetime.datetime.fromtimestamp(end - WEEK, datetime.UTC).date()
        while day <= datetime.datetime.fromtimestamp(end, datetime.UTC).date():
            conn.execute("select tapfix_add_day(%s)", (day,))
            day += datetime.timedelta(days=1)
        with conn.cursor().copy(f"copy exchanges ({', '.join(COLUMNS)}) from stdin") as copy:
            for row in rows(n, end):
                copy.write_row(row)
        with conn.cursor().copy("copy changes (exchange_id, seq, stage, kind, path, day) from stdin") as copy:
            for row in rows(n, end):
                if row[15]:
                    stage = "toolcalls" if int(row[0][-1], 16) % 2 else "sampling"
                    copy.write_row((row[0], 1, stage, "repair", "$.x", row[2][:10]))
        conn.execute("vacuum analyze")  # now, not by autovacuum while the reports are timed (its CPU would count)


def best(repeat: int, run: Callable[[], object], server: Callable[[], float]) -> tuple[float, float, object]:
    """The best wall time and the best CPU time (this process, where SQLite's engine runs, plus PostgreSQL's
    server processes: `server`), and the result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        start, cpu, server_cpu = time.perf_counter(), time.process_time(), server()
        result = run()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu + server() - server_cpu)
    return min(walls), min(cpus), result


def measure(db: str, repeat: int, server: Callable[[], float] = lambda: 0.0) -> None:
    """Each grouping over the whole week and over its last day, then the hourly series: wall, CPU, groups."""
    with StoreLocator.resolve(db, postgres=True).backend().reader() as reader:
        for since in ("", "1d"):
            f = Filters(since=since)
            runs: list[tuple[str, Callable[[], object]]] = [
                (f"--by {by}", lambda f=f, by=by: reader.token_volume(f, by.split(","))) for by in GROUPINGS
            ]
            runs.append(("hourly (the page's charts)", lambda f=f: reader.volume_by_hour(f)))
            for name, run in runs:
                wall, cpu, result = best(repeat, run, server)
                span = f"--since {since}" if since else "all (7 days)"
                print(f"| {name} | {span} | {wall:.2f} | {cpu:.2f} | {len(result):,} |", flush=True)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--work", type=Path, help="keep the SQLite store here, and measure it again without a fill")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still stop the server, remove the store
    work = a.work or Path(tempfile.mkdtemp(prefix="tapfix-stats-"))
    work.mkdir(parents=True, exist_ok=True)
    end = time.time()
    server = None
    try:
        for kind in a.stores.split(","):
            start = time.perf_counter()
            if kind == "sqlite":
                db = str(work / f"stats-{a.rows}.db")
                if not (a.work and Path(db).exists()):
                    fill_sqlite(Path(db), a.rows, end)
            else:
                sys.path.insert(0, str(ROOT))
                from tests.support.postgres import start_postgres

                server = start_postgres("stats", "-c fsync=off -c shared_buffers=256MB -c work_mem=64MB")
                db = server.dsn("stats")
                fill_pg(db, a.rows, end)
            print(f"{kind}: {a.rows:,} rows filled in {time.perf_counter() - start:.0f} s", flush=True)
            print("| report | span | wall s | CPU s | groups / rows |\n|---|---|---|---|---|")
            if server is None:
                measure(db, a.repeat)
            else:
                sys.path.insert(0, str(ROOT / "bench"))
                from store_fill import TreeCpu

                pid = server._postmaster_pid()
                measure(db, a.repeat, TreeCpu(pid) if pid else lambda: 0.0)
    finally:
        if server is not None:
            server.stop()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
