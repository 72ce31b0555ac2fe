"""CPU per chunk (and per request beyond its chunks) of this tree against an older commit's, side by side in one run.

Why: a change to the repair or the capture path must not make every stream dearer, and only ratios
measured in the same run mean anything on a shared machine. The baseline commit is checked out in a
git worktree and served by a second tapfix process (its `tapfix` namespace put first on PYTHONPATH,
same venv, same upstream); each round runs every row's 256- and 16-event blocks in a rotated order,
per chunk = (cpu256 - cpu16) / 240 per round, and the table gives the median of the rounds.

Both processes get the same `--regenerate` (a request with `tools` goes through the regeneration relay
at 1 and straight to the upstream at 0): by default 1 when both commits know the flag, else 0 for the
side that knows it and nothing for the one that predates it (5daa0b8; an older `tapfix run` rejects the
flag, and has no relay: the direct path, like 0). `--regenerate N` chooses; N > 0 needs both to know it.

    bench/run --baseline 03aea2f                 # this working tree vs 03aea2f, 5 rounds
    bench/run --baseline 03aea2f --current HEAD  # a commit (in a worktree too) vs 03aea2f
    .venv/bin/python bench/versus.py --baseline REV [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import load
import procstat
from runner import BIN, ROOT, Fleet, free_port, wait_port

CHUNKS = (256, 16)
REQUESTS = {256: 32, 16: 128}  # per row and round, 8 at a time, 1 ms between events
LIMIT = 1.10  # the bound: within 10% of the baseline


@dataclass(frozen=True)
class Row:
    name: str
    target: str  # "tapfix" (this tree) | "baseline"
    tools: bool
    kind: str  # content | tools (the upstream streams a tool call)


KINDS = (("no tools", False, "content"), ("tools armed, no calls", True, "content"), ("tool call", True, "tools"))


def rows() -> list[Row]:
    return [
        Row(f"{target}: {label}", target, tools, kind)
        for target in ("tapfix", "baseline")
        for label, tools, kind in KINDS
    ]


def baseline_tree(rev: str, work: Path, label: str = "baseline") -> Path:
    """A worktree of `rev` and a folder that makes `import tapfix` find it first."""
    tree = work / label
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True, capture_output=True
    )
    pkg = work / f"pkg-{label}" / "tapfix"
    pkg.mkdir(parents=True)
    for part in ("proxy", "addons", "schemas"):
        if (tree / part).exists():
            (pkg / part).symlink_to(tree / part)
    return work / f"pkg-{label}"


def start_baseline(fleet: Fleet, pythonpath: Path, tapfix_args: list[str], name: str = "baseline") -> None:
    """A tapfix process whose `tapfix` package is the worktree's (PYTHONPATH first, same venv)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CONFIG_HOME": str(fleet.work / f"config-{name}")}
    env["PYTHONPATH"] = str(pythonpath)
    port = free_port()
    code = "import sys; from tapfix.proxy.cli import main; sys.argv[0] = 'tapfix'; main()"
    argv = [str(BIN / "python"), "-c", code, "run", "--upstream", f"http://127.0.0.1:{fleet.ports['upstream']}"]
    argv += ["--listen", f"127.0.0.1:{port}", "--db", str(fleet.work / f"{name}.db"), *tapfix_args]
    log = open(fleet.work / f"{name}.log", "wb")
    fleet.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=fleet.work)
    fleet.ports[name] = port
    wait_port(port, fleet.procs[name], f"{name} tapfix")


def check_baseline_is_other_code(fleet: Fleet, pythonpath: Path) -> str:
    """Which file `tapfix` resolves to under the baseline's PYTHONPATH (so the run proves what it compared)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    probe = "import tapfix.proxy.toolcalls as t; print(t.__file__)"
    out = subprocess.run([str(BIN / "python"), "-c", probe], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def knows_regenerate(pythonpath: Path | None) -> bool:
    """Whether that tree's `tapfix run` has `--regenerate` (None: this venv's own tapfix, the working tree)."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath is not None else dict(os.environ)
    code = "import sys; from tapfix.proxy.cli import main; sys.argv[0] = 'tapfix'; main()"
    out = subprocess.run(
        [str(BIN / "python"), "-c", code, "run", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise SystemExit(f"`tapfix run --help` failed under PYTHONPATH={pythonpath}: {out.stderr[-2000:]}")
    return re.search(r"--regenerate(?![-\w])", out.stdout) is not None


def regenerate_args(wanted: int | None, current: bool, baseline: bool) -> tuple[list[str], list[str], str]:
    """(this side's args, the baseline's args, what the table says) for a like-for-like `--regenerate`."""
    if wanted is None:
        wanted = 1 if current and baseline else 0
    if wanted > 0 and not (current and baseline):
        old = "the baseline" if not baseline else "the current commit"
        raise SystemExit(f"--regenerate {wanted}: {old} predates the flag (no relay); only 0 compares like for like")
    flag = ["--regenerate", str(wanted)]
    said = f"--regenerate {wanted}" + ("" if current and baseline else " (the side without the flag: its direct path)")
    return (flag if current else []), (flag if baseline else []), said


def block(fleet: Fleet, row: Row, chunks: int) -> int:
    """CPU ns of the row's proxy for one block of requests."""
    pids = fleet.pids
    body = load.request_body(2048, tools=row.tools)
    procstat.wait_idle(pids)
    before = procstat.snapshot(pids)
    res = asyncio.run(
        load.run_load(
            "127.0.0.1",
            fleet.ports[row.target],
            concurrency=8,
            requests=REQUESTS[chunks],
            body=body,
            headers=load.bench_headers(row.kind, chunks, 1.0),
        )
    )
    procstat.wait_idle(pids)
    after = procstat.snapshot(pids)
    if res.errors:
        raise SystemExit(f"{row.name}: {len(res.errors)} errors, first: {res.errors[0]}")
    return after[row.target] - before[row.target]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the commit to compare with (any git revision)")
    ap.add_argument("--current", help="measure this commit instead of the working tree (also in a worktree)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--regenerate", type=int, help="both sides' --regenerate (default: 1 if both commits know it, else 0)"
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", a.baseline], check=True, capture_output=True, text=True
    ).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="tapfix-versus-"))
    fleet = Fleet(work, ["--engine", "vllm"])
    table_rows = rows()
    samples: dict[str, list[float]] = {r.name: [] for r in table_rows}  # µs per chunk, one per round
    fixed: dict[str, list[float]] = {r.name: [] for r in table_rows}  # ms per request beyond the chunks
    try:
        pythonpath = baseline_tree(a.baseline, work)
        current = baseline_tree(a.current, work, "current") if a.current else None
        mine, theirs, said = regenerate_args(a.regenerate, knows_regenerate(current), knows_regenerate(pythonpath))
        print(f"both sides: {said}", file=sys.stderr)
        if current is not None:
            fleet.start(which=())
            start_baseline(fleet, current, ["--engine", "vllm", *mine], name="tapfix")
        else:
            fleet.tapfix_args += mine
            fleet.start(which=("tapfix",))
        start_baseline(fleet, pythonpath, ["--engine", "vllm", *theirs])
        where = check_baseline_is_other_code(fleet, pythonpath)
        print(f"baseline {rev} imports {where}", file=sys.stderr)
        for row in table_rows:  # warm: lazily imported modules, upstream connections
            for chunks in CHUNKS:
                block(fleet, row, chunks)
        for i in range(a.rounds):
            order = table_rows[i % len(table_rows) :] + table_rows[: i % len(table_rows)]
            for row in order:
                long, short = (block(fleet, row, c) / REQUESTS[c] for c in CHUNKS)
                per_chunk = (long - short) / (CHUNKS[0] - CHUNKS[1])
                samples[row.name].append(per_chunk / 1000)
                fixed[row.name].append((short - CHUNKS[1] * per_chunk) / 1e6)
            print(f"  round {i + 1}/{a.rounds}", file=sys.stderr)
    finally:
        fleet.stop()  # every process, the baseline too (SIGINT: tapfix stores what it holds)
        if not a.keep:
            for label in ("baseline", "current"):
                if (work / label).exists():
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / label)])
            shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(v) for name, v in samples.items()}
    this = a.current or "this tree"
    print(f"\nCPU µs per chunk, median of {a.rounds} rounds ({this} vs {rev}, one run; {said})\n")
    print(f"| {'stream':<24} | {this:>9} | {rev:>9} | {'ratio':>5} |")
    print(f"| {'-' * 24} | {'-' * 8}: | {'-' * 8}: | {'-' * 4}: |")
    failed = False
    for label, _, _ in KINDS:
        now, then = medians[f"tapfix: {label}"], medians[f"baseline: {label}"]
        ratio = now / then
        failed |= ratio > LIMIT
        print(f"| {label:<24} | {now:>9.1f} | {then:>9.1f} | {ratio:>5.2f} |")
    fixed_medians = {name: statistics.median(v) for name, v in fixed.items()}
    print(f"\nCPU ms per request beyond its chunks (the fixed part of the same fit), median of {a.rounds} rounds\n")
    print(f"| {'stream':<24} | {this:>9} | {rev:>9} | {'ratio':>5} |")
    print(f"| {'-' * 24} | {'-' * 8}: | {'-' * 8}: | {'-' * 4}: |")
    for label, _, _ in KINDS:
        now, then = fixed_medians[f"tapfix: {label}"], fixed_medians[f"baseline: {label}"]
        print(f"| {label:<24} | {now:>9.2f} | {then:>9.2f} | {now / then:>5.2f} |")
    print()
    for label, _, _ in KINDS:
        now, then = medians[f"tapfix: {label}"], medians[f"baseline: {label}"]
        verdict = "PASS" if now / then <= LIMIT else "MISS"
        print(f"{verdict}  CPU/chunk, {label} ≤ {LIMIT:.2f}× {rev}: {now / then:.2f}×")
    if a.json:
        out = {
            "baseline": rev,
            "regenerate": said,
            "samples_us": samples,
            "medians_us": medians,
            "fixed_ms": fixed,
            "fixed_medians_ms": fixed_medians,
        }
        a.json.write_text(json.dumps(out, indent=2))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
