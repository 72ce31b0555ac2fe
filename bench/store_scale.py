"""The store at scale (issue 21): SQLite and PostgreSQL filled through the writer API, side by side.

For each size (default 100,000 and 1,000,000 captures) and each store: the fill (write throughput,
CPU per exchange: the bench process's, the writer thread's and PostgreSQL's server processes'), the
size on disk, then browse latency (bench/store_browse.py). Then the storage ratio of a fleet: the
same sessions written by one writer, by 3 writers each with its own sessions, and by 3 writers with
every turn landing on another instance (a load balancer without affinity). `--proxy N` adds
write throughput through real `tapfix run` processes (bench/store_proxy.py).

PostgreSQL is a server of its own, started here (tests/support/postgres.py's `start_postgres`:
initdb as the `postgres` user, pg_ctl on a free loopback port) and stopped at the end; durable
settings (fsync on; synchronous_commit off, like SQLite's WAL with synchronous=normal: a crash of
the machine may lose the last moment of commits, never the store).

    bench/run --store-scale                          # 10^5 and 10^6, both stores, + proxy and fleet
    .venv/bin/python bench/store_scale.py --sizes 20000 --fleet 6000 --proxy 10000
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

import psycopg  # noqa: E402
import store_browse  # noqa: E402
from store_fill import FLAG, MODELS, Sessions, Shape, TreeCpu, fill  # noqa: E402
from tapfix.proxy.store.locator import StoreLocator  # noqa: E402
from tapfix.proxy.store.writer import CaptureWriter  # noqa: E402

from tests.support.postgres import PostgresServer, start_postgres  # noqa: E402

# Durable, and sized for a 24 GiB machine: what the README's fleet section recommends as a start.
PG_SETTINGS = "-c fsync=on -c full_page_writes=on -c synchronous_commit=off -c shared_buffers=1GB -c max_wal_size=4GB"
MB = 1 << 20


def writer_of(db: Path | str) -> CaptureWriter:
    """The store's own writer, as `tapfix run` makes it (a server that is down is an error here)."""
    return StoreLocator.resolve(db, postgres=True).backend().writer(wait=False)


def pg_size(dsn: str) -> dict[str, int]:
    """Bytes on disk: the whole database, and the tapfix tables with their indexes and TOAST."""
    with psycopg.connect(dsn) as conn:
        db = conn.execute("select pg_database_size(current_database())").fetchone()[0]
        rows = conn.execute(
            "select coalesce(i.inhparent::regclass::text, c.relname) t, sum(pg_total_relation_size(c.oid))"
            " from pg_class c join pg_namespace n on n.oid = c.relnamespace"
            " left join pg_inherits i on i.inhrelid = c.oid"
            " where n.nspname = 'public' and c.relkind = 'r' group by 1"
        ).fetchall()
    tables = {str(t): int(b) for t, b in rows}
    return {"database": int(db), "tables": sum(tables.values()), "bodies": tables.get("bodies", 0)}


def sqlite_size(db: Path) -> dict[str, int]:
    total = sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if not p.name.endswith(".fts"))
    return {"database": total, "tables": total}


def probe_sqlite(db: Path) -> store_browse.Probe:
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    ids = [r[0] for r in conn.execute("select id from exchanges order by rowid desc")]  # the browser pages by rowid
    deep = ids[int(len(ids) * 0.9)]
    session = conn.execute("select session_id from exchanges where id = ?", (ids[len(ids) // 3],)).fetchone()[0]
    lo, hi = conn.execute("select min(ts), max(ts) from exchanges").fetchone()
    conn.close()
    return _probe(deep, session, lo, hi, ids[len(ids) // 2])


def probe_pg(dsn: str) -> store_browse.Probe:
    with psycopg.connect(dsn) as conn:
        n = conn.execute("select count(*) from exchanges").fetchone()[0]
        deep = conn.execute("select id from exchanges order by id desc offset %s limit 1", (int(n * 0.9),)).fetchone()
        mid = conn.execute("select id, session_id from exchanges order by id desc offset %s limit 1", (n // 2,))
        mid_id, _ = mid.fetchone()
        session = conn.execute(
            "select session_id from exchanges order by id desc offset %s limit 1", (n // 3,)
        ).fetchone()[0]
        lo, hi = conn.execute("select min(ts), max(ts) from exchanges").fetchone()
    return _probe(deep[0], session, lo, hi, mid_id)


def _probe(deep: str, session: str, lo: float, hi: float, some_id: str) -> store_browse.Probe:
    span = hi - lo
    return store_browse.Probe(
        deep_id=deep,
        model=MODELS[1],
        flag=FLAG,
        session=session,
        since=lo + 0.45 * span,
        until=lo + 0.55 * span,
        word="zanzibar",
        substring="anziba",
        cjk="天気予",
        id_prefix=some_id[:14],
    )


class Bench:
    def __init__(
        self, work: Path, shape: Shape, repeat: int, json_path: Path | None = None, server: PostgresServer | None = None
    ) -> None:
        self.work, self.shape, self.repeat, self.json_path = work, shape, repeat, json_path
        self.server, self._own_server = server, server is None  # a server of our own is stopped at the end
        self.results: dict[str, Any] = {"fills": [], "browse": {}, "fleet": {}, "machine": machine()}
        self._server_cpu: TreeCpu | None = None

    def pg(self, name: str) -> str:
        if self.server is None:
            self.server = start_postgres("postgres_bench", settings=PG_SETTINGS)
        return self.server.create_database(name)

    def server_cpu(self) -> float:
        pid = self.server._postmaster_pid() if self.server else None
        if not pid:
            return 0.0
        if self._server_cpu is None or self._server_cpu.root_pid != pid:
            self._server_cpu = TreeCpu(pid)
        return self._server_cpu()

    def fill_store(self, kind: str, n: int) -> None:
        say(f"fill {kind} with {n:,} captures ...")
        sessions = Sessions(self.shape)
        if kind == "sqlite":
            db = self.work / f"scale-{n}.db"
            writer = writer_of(db)
            result = fill([writer], sessions, n, kind, progress=self._progress(n))
            size = sqlite_size(db)
            probe, where = probe_sqlite(db), db
        else:
            dsn = self.pg(f"scale_{n}")
            empty = pg_size(dsn)["database"]
            writer = writer_of(dsn)
            result = fill([writer], sessions, n, kind, server_cpu=self.server_cpu, progress=self._progress(n))
            size = pg_size(dsn)
            size["database"] -= empty
            probe, where = probe_pg(dsn), dsn
        row = {**vars(result), "size": size, "per_s": result.per_s()}
        row.pop("ids")
        self.results["fills"].append(row)
        say(
            f"  {kind} {n:,}: {result.seconds:.0f} s, {result.per_s():.0f}/s, CPU µs/exchange: process "
            f"{result.us(result.process_cpu_s):.0f}, writer {result.us(result.writer_cpu_s):.0f}, server "
            f"{result.us(result.server_cpu_s):.0f}; {size['database'] / MB:.0f} MB, "
            f"{size['database'] / n:.0f} B/capture; failures {result.failures}"
        )
        self.browse(kind, n, where, probe)

    def browse(self, kind: str, n: int, where: Path | str, probe: store_browse.Probe) -> None:
        queries, built, close = store_browse.queries(str(where), probe)
        try:
            measured = store_browse.measure(queries, self.repeat)
        finally:
            close()
        self.results["browse"][f"{kind} {n}"] = {"index_build_s": built, "queries": measured}
        self.save()
        say(
            f"  browse {kind} {n:,} (search index built in {built:.0f} s): "
            + ", ".join(
                f"{k.split(',')[0] if ',' not in k else k}: {v[1]:.1f} ms ({v[3]} rows)" for k, v in measured.items()
            )
        )

    def fleet(self, n: int) -> None:
        """Bytes per capture of the same sessions: one writer; 3 with sessions shared out; 3 with hops."""
        cases = {
            "1 instance": (1, None),
            "3 instances, each its own sessions": (3, lambda s, turn: s % 3),
            "3 instances, every turn on the next one": (3, lambda s, turn: (s + turn) % 3),
        }
        for label, (count, which) in cases.items():
            dsn = self.pg("fleet_" + str(len(self.results["fleet"])))
            empty = pg_size(dsn)
            writers = [writer_of(dsn) for _ in range(count)]
            result = fill(writers, Sessions(self.shape), n, "postgresql", which=which)
            size = pg_size(dsn)
            with psycopg.connect(dsn) as conn:
                stored = int(conn.execute("select count(*) from exchanges").fetchone()[0])
            per = {k: (size[k] - empty[k]) / max(stored, 1) for k in ("database", "tables", "bodies")}
            row = {"n": n, "stored": stored, "failures": result.failures, "per_s": result.per_s(), **per}
            self.results["fleet"][label] = row
            say(
                f"  fleet {label}: {per['database']:.0f} B/capture (bodies {per['bodies']:.0f} B), {row['per_s']:.0f}/s"
            )
            self.save()

    def save(self) -> None:
        """After each step: a long run stopped halfway keeps what it measured."""
        if self.json_path:
            self.json_path.write_text(json.dumps(self.results, indent=2))

    def _progress(self, n: int) -> Callable[[int], None]:
        t0 = time.perf_counter()

        def tell(i: int) -> None:
            if i and i % 100_000 == 0:
                say(f"    {i:,}/{n:,} in {time.perf_counter() - t0:.0f} s")

        return tell

    def close(self) -> None:
        if self.server is not None and self._own_server:
            self.server.stop()


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line), "?")
    mem = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")))
    return f"{os.cpu_count()} cores ({model}), {mem / 2**20:.0f} GiB"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None, server: PostgresServer | None = None) -> dict[str, Any]:
    """`server`: a running PostgreSQL to make the bench's databases in (the suite's); else one of its own."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100000,1000000", help="captures per fill, comma-separated")
    ap.add_argument("--stores", default="sqlite,postgresql")
    ap.add_argument("--fleet", type=int, default=10_000, help="captures per fleet case (0: none)")
    ap.add_argument("--proxy", type=int, default=10_000, help="exchanges through tapfix run per store (0: none)")
    ap.add_argument("--turns", type=int, default=Shape.turns)
    ap.add_argument("--final-kb", type=int, default=Shape.final_kb)
    ap.add_argument("--active", type=int, default=Shape.active, help="sessions running side by side")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--work", type=Path, help="keep the stores here (default: a temp dir, removed)")
    a = ap.parse_args(argv)
    if server is None:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed: still stop the server, remove the stores
    work = a.work or Path(tempfile.mkdtemp(prefix="tapfix-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work, Shape(turns=a.turns, final_kb=a.final_kb, active=a.active), a.repeat, a.json, server)
    say(f"store scale bench {datetime.datetime.now().isoformat(timespec='seconds')}; {bench.results['machine']}")
    try:
        for n in (int(x) for x in a.sizes.split(",") if x):
            for kind in a.stores.split(","):
                bench.fill_store(kind, n)
                if kind == "sqlite" and not a.work:
                    for p in work.glob(f"scale-{n}.db*"):
                        p.unlink()
        if a.fleet:
            bench.fleet(a.fleet)
        if a.proxy:
            import store_proxy

            bench.results["proxy"] = store_proxy.run(work, a.proxy, bench.pg("proxy"))
            bench.save()
    finally:
        bench.close()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    bench.save()
    print(report(bench.results))
    return bench.results


def report(r: dict[str, Any]) -> str:
    """The tables bench/README.md's "Store at scale" shows."""
    out = [
        f"machine: {r['machine']}",
        "",
        "| store | captures | fill s | exchanges/s | CPU µs/exchange (process / writer / server) | on disk MB"
        " | B/capture |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in r["fills"]:
        n = f["n"]
        out.append(
            f"| {f['store']} | {n:,} | {f['seconds']:.0f} | {f['per_s']:.0f} | "
            f"{f['process_cpu_s'] / n * 1e6:.0f} / {f['writer_cpu_s'] / n * 1e6:.0f} / "
            f"{f['server_cpu_s'] / n * 1e6:.0f} | "
            f"{f['size']['database'] / MB:.0f} | {f['size']['database'] / n:.0f} |"
        )
    if r["browse"]:
        keys = list(r["browse"])
        out += ["", "browse latency, median ms of the repeats (rows found; first run in the JSON):", ""]
        out.append("| query | " + " | ".join(keys) + " |")
        out.append("|---" * (len(keys) + 1) + "|")
        for label in store_browse.LABELS:
            cells = [f"{r['browse'][k]['queries'][label][1]:.1f} ({r['browse'][k]['queries'][label][3]})" for k in keys]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        built = ", ".join(f"{k}: {v['index_build_s']:.0f} s" for k, v in r["browse"].items() if k.startswith("sqlite"))
        out.append(f"\nSQLite's search index (the browser's sidecar) took {built} to build after the fill.")
    if r["fleet"]:
        out += [
            "",
            "| fleet (PostgreSQL, same sessions) | captures stored | exchanges/s (all writers) | B/capture (database)"
            " | bodies B/capture |",
            "|---|---|---|---|---|",
        ]
        for label, v in r["fleet"].items():
            cells = f"{v['stored']:,} of {v['n']:,} | {v.get('per_s', 0):.0f} | {v['database']:.0f} | {v['bodies']:.0f}"
            out.append(f"| {label} | {cells} |")
    if r.get("proxy"):
        out += [
            "",
            "| through `tapfix run` (mock upstream) | exchanges | exchanges/s | peak queue | stored | lost |",
            "|---|---|---|---|---|---|",
        ]
        for store, v in r["proxy"].items():
            out.append(
                f"| {store} | {v['sent']:,} | {v['per_s']:.0f} | {v['peak_queue']} | {v['stored']:,} | {v['lost']} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    main()
